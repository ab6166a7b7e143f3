"""Modules that generated models use. A class's source is copied whole into every generated file
that uses it, so a compiled model depends on torch alone; they are also imported from here by the
tests. Rotary embeddings, attention and the mixture of experts have files of their own
(prelude_rotary.py, prelude_attention.py, prelude_experts.py; library.PRELUDES lists them all),
each made of small classes, one per option, that a spec's options choose."""

import math

import torch
import torch.nn as nn

from .prelude_attention import MultiHeadAttention  # noqa: F401 (for the tests)
from .prelude_rotary import (  # noqa: F401 (for the tests)
    LinearRotaryEmbedding, Llama3RotaryEmbedding, PartialRotaryEmbedding, RotaryEmbedding,
    YarnRotaryEmbedding)
from .prelude_experts import MixtureOfExperts  # noqa: F401 (for the tests)


class Embedding(nn.Embedding):
    """Token embeddings, rows of variance 1 / dim."""

    def __init__(self, vocab, dim):
        super().__init__(vocab, dim)
        nn.init.normal_(self.weight, std=dim ** -0.5)


class ScaledEmbedding(nn.Embedding):
    """Token embeddings multiplied by `scale` (§3.4: sqrt(d_model))."""

    def __init__(self, vocab, dim, scale):
        super().__init__(vocab, dim)
        self.scale = scale
        nn.init.normal_(self.weight, std=dim ** -0.5)  # unit-variance rows once scaled

    def forward(self, tokens):
        return super().forward(tokens) * self.scale


class SinusoidalPositions(nn.Module):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) (§3.5)."""

    def __init__(self, dim, max_len):
        super().__init__()
        position = torch.arange(max_len, dtype=torch.float32)[:, None]  # [max_len, 1]
        inverse_frequency = torch.exp(torch.arange(0, dim, 2) * (-math.log(10000.0) / dim))
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
