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
    """What the decoder keeps between steps when it decodes one token at a time: self-attention's
    keys and values, written in place into buffers [rows, heads, capacity, d] whose capacity
    doubles when outgrown; `reorder` follows beam search's choice of rows. The encoder memory's
    keys and values are computed once per memory tensor."""

    def __init__(self, capacity=64):
        self.length = 0  # target positions already decoded
        self.capacity = capacity  # positions each buffer holds at first
        self.rows = None  # rows in use (the batch), once something is cached
        self.tensors = {}  # self-attention module -> [keys, values, spare keys, spare values, end]
        self.memory = {}  # encoder-decoder attention -> (key input, value input, keys, values)

    def past(self, module):
        """Positions `module` has cached: where its next queries and keys start."""
        entry = self.tensors.get(module)
        return entry[4] if entry is not None else 0

    def append(self, module, k, v):
        """Writes k, v [B, h, T, d] after what `module` has cached; returns all its keys and
        values."""
        entry = self.tensors.get(module)
        start = entry[4] if entry is not None else 0
        end = start + k.size(2)
        if entry is None or end > entry[0].size(2):
            size = max(self.capacity, 2 * end)
            grown = [t.new_empty(t.size(0), t.size(1), size, t.size(3)) for t in (k, v, k, v)]
            if entry is not None:  # keep what is cached (of the rows in use)
                for old, new in zip(entry[:2], grown[:2]):
                    new[:, :, :start] = old[: k.size(0), :, :start]
            entry = self.tensors[module] = [*grown, start]
            self.rows = k.size(0)
        keys, values = entry[0][: self.rows], entry[1][: self.rows]
        keys[:, :, start:end], values[:, :, start:end] = k, v
        entry[4] = end
        return keys[:, :, :end], values[:, :, :end]

    def append_window(self, module, k, v, window):  # with: window
        """Writes k, v [B, h, T, d] after what `module` has cached, keeping the last `window`
        positions: a sliding-window attention's buffers stop growing at its window and become a
        ring, position p in slot p % window. Returns the keys and values to attend: for one new
        position, the ring's filled slots (all within the new query's window, in slot order); for
        several, the cached positions the first new query sees, in order, then the new ones (the
        caller masks them by relative position)."""
        entry = self.tensors.get(module)
        start = entry[4] if entry is not None else 0
        new, end = k.size(2), start + k.size(2)
        if entry is None or (entry[0].size(2) < window and end > entry[0].size(2)):
            # Below the window, nothing has wrapped yet.
            size = min(window, max(self.capacity, 2 * end))
            grown = [t.new_empty(t.size(0), t.size(1), size, t.size(3)) for t in (k, v, k, v)]
            if entry is not None:
                for old, fresh in zip(entry[:2], grown[:2]):
                    fresh[:, :, :start] = old[: k.size(0), :, :start]
            entry = self.tensors[module] = [*grown, start]
            self.rows = k.size(0)
        size = entry[0].size(2)
        keys, values = entry[0][: self.rows], entry[1][: self.rows]
        entry[4] = end
        if new == 1:
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
        """Row i becomes row index[i] (rows may repeat, and drop out)."""
        for entry in self.tensors.values():
            for buffer, spare in ((0, 2), (1, 3)):
                if entry[spare].size(0) < index.numel():  # more rows than ever: a larger spare
                    entry[spare] = entry[buffer].new_empty(index.numel(), *entry[buffer].shape[1:])
                filled = min(entry[4], entry[buffer].size(2))  # only the positions cached so far
                torch.index_select(entry[buffer][: self.rows, :, :filled], 0, index,
                                   out=entry[spare][: index.numel(), :, :filled])
                entry[buffer], entry[spare] = entry[spare], entry[buffer]
        self.rows = index.numel()


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
