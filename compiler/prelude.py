"""Modules that generated models use. Their source is copied into every generated file that uses
them, so a compiled model depends on torch alone; they are also imported from here by the tests.
Attention and the mixture of experts have files of their own (prelude_attention.py,
prelude_experts.py; codecheck.PRELUDES lists them all).

A statement whose first line ends in `# with: FEATURE, ...` serves those features only: a generated
file keeps it where its spec uses one of them (compiler/prune.py), else leaves it out. `diagrams`
code is never copied: tools call it from here on generated modules."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .prelude_attention import MultiHeadAttention, RotaryEmbedding  # noqa: F401 (for the tests)
from .prelude_experts import MixtureOfExperts  # noqa: F401 (for the tests)


class DecoderCache:
    """What decoding keeps between steps: self-attention's keys and values, in buffers written in
    place that grow by doubling and follow beam search's rows; the encoder memory's, once."""

    def __init__(self, capacity=64):
        self.length = 0  # positions decoded: where the next step's queries and keys start
        self.capacity = capacity  # positions each buffer holds at first
        self.tensors = {}  # self-attention -> [keys, values, spare keys, spare values]
        self.memory = {}  # encoder-decoder attention -> (key input, value input, keys, values)

    def append(self, module, k, v):
        """Writes k, v [B, h, T, d] after the cached positions; returns all `module` cached."""
        if module.window is not None:  # with: window
            return self.append_window(module, k, v, module.window)
        end = self.length + k.size(2)
        keys, values = self.buffers(module, k, v, end)
        keys[:, :, self.length:end], values[:, :, self.length:end] = k, v
        return keys[:, :, :end], values[:, :, :end]

    def buffers(self, module, k, v, positions, most=float("inf")):
        """`module`'s buffers for the rows of k and v, of `positions` at least (when they grow,
        twice that, at most `most`), holding what they cached."""
        buffers, rows = self.tensors.get(module), k.size(0)
        if buffers is None or positions > buffers[0].size(2):
            size = min(max(self.capacity, 2 * positions), most)
            grown = [t.new_empty(rows, t.size(1), size, t.size(3)) for t in (k, v, k, v)]
            for old, new in zip(buffers or [], grown[:2]):
                new[:, :, :self.length] = old[:rows, :, :self.length]
            buffers = self.tensors[module] = grown
        return buffers[0][:rows], buffers[1][:rows]

    def append_window(self, module, k, v, window):  # with: window
        """Writes k, v [B, h, T, d] after what `module` has cached, keeping the last `window`
        positions: a sliding-window attention's buffers stop growing at its window and become a
        ring, position p in slot p % window. Returns the keys and values to attend: for one new
        position, the ring's filled slots (all within the new query's window, in slot order); for
        several, the cached positions the first new query sees, in order, then the new ones (the
        caller masks them by relative position)."""
        start, end = self.length, self.length + k.size(2)
        keys, values = self.buffers(module, k, v, min(end, window), most=window)
        size = keys.size(2)
        if k.size(2) == 1:
            slot = start % size
            keys[:, :, slot:slot + 1], values[:, :, slot:slot + 1] = k, v
            return keys[:, :, :min(end, size)], values[:, :, :min(end, size)]
        # The slots the first new query sees, in order; then the positions the ring keeps.
        seen = torch.arange(max(start - window + 1, 0), start, device=k.device) % size
        attend = torch.cat([keys[:, :, seen], k], dim=2), torch.cat([values[:, :, seen], v], dim=2)
        kept = torch.arange(max(start, end - size), end, device=k.device)
        keys.index_copy_(2, kept % size, k[:, :, kept - start])
        values.index_copy_(2, kept % size, v[:, :, kept - start])
        return attend

    def reorder(self, index):
        """Row i becomes row index[i] (rows may repeat, and drop out), gathered into the spares."""
        rows = index.numel()
        for buffers in self.tensors.values():
            for i in (0, 1):
                if buffers[i + 2].size(0) < rows:  # more rows than ever: a larger spare
                    buffers[i + 2] = buffers[i].new_empty(rows, *buffers[i].shape[1:])
                filled = self.length
                filled = min(filled, buffers[i].size(2))  # with: window
                torch.index_select(buffers[i][:, :, :filled], 0, index,
                                   out=buffers[i + 2][:rows, :, :filled])
                buffers[i], buffers[i + 2] = buffers[i + 2], buffers[i]


class Embedding(nn.Module):
    """Token embedding multiplied by `scale` (§3.4: sqrt(d_model))."""

    def __init__(self, vocab, dim, scale=1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, dim))
        self.scale = scale
        nn.init.normal_(self.weight, std=dim ** -0.5)  # unit-variance rows once scaled

    def forward(self, tokens):
        return F.embedding(tokens, self.weight) * self.scale


class SinusoidalPositions(nn.Module):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) (§3.5)."""

    def __init__(self, dim, max_len):
        super().__init__()
        position = torch.arange(max_len, dtype=torch.float32)[:, None]  # [max_len, 1]
        exponents = torch.arange(0, dim, 2, dtype=torch.float32)
        inverse_frequency = torch.exp(exponents * (-math.log(10000.0) / dim))
        table = torch.zeros(max_len, dim)
        table[:, 0::2] = torch.sin(position * inverse_frequency)
        table[:, 1::2] = torch.cos(position * inverse_frequency[: dim // 2])
        self.register_buffer("table", table, persistent=False)  # derived, so not in checkpoints

    def forward(self, x, cache=None):
        start = cache.length if cache is not None else 0
        return self.table[start:start + x.size(-2)].to(x.dtype)  # [T, d]


class LearnedPositions(nn.Module):
    """One learned vector per position (Table 3, row E)."""

    def __init__(self, dim, max_len):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_len, dim))
        nn.init.normal_(self.weight, std=dim ** -0.5)

    def forward(self, x, cache=None):
        start = cache.length if cache is not None else 0
        return self.weight[start:start + x.size(-2)]  # [T, d]


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * (offset + w), in float32: Gemma's RMSNorm (offset 1, w starting
    at 0), where torch's nn.RMSNorm (offset 0) serves the others."""

    def __init__(self, dim, eps=1e-6, offset=0.0):
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - offset))  # offset + w = 1 at first

    def forward(self, x):
        normalized = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (normalized * (self.offset + self.weight.float())).to(x.dtype)
