"""Token embeddings and positions that generated models use: the plain and the scaled embedding
(§3.4), the paper's sinusoidal positions (§3.5) and learned ones (Table 3, row E).

Every module of the library sets its own tensors (not its children's) in `reset_parameters()`, as
torch's do, and its __init__ sets them the same way: a model built on the meta device is
initialized by calling it children first (a generated model's `init_weights()`)."""

import math

import torch
import torch.nn as nn


class Embedding(nn.Embedding):
    """Token embeddings, rows of variance 1 / dim."""

    def reset_parameters(self):  # nn.Embedding's __init__ calls it
        nn.init.normal_(self.weight, std=self.embedding_dim ** -0.5)


class ScaledEmbedding(nn.Embedding):
    """Token embeddings multiplied by `scale` (§3.4: sqrt(d_model))."""

    def __init__(self, vocab, dim, scale):
        super().__init__(vocab, dim)
        self.scale = scale

    def reset_parameters(self):  # unit-variance rows once scaled
        nn.init.normal_(self.weight, std=self.embedding_dim ** -0.5)

    def forward(self, tokens):
        return super().forward(tokens) * self.scale


class PositionTable(nn.Module):
    """A table of one row per position, `offset` rows on (the rows before position 0's no
    position reads)."""

    offset = 0

    def rows(self, x, cache):
        """The rows x's T positions [..., T, d] read: a slice after the cache's length (one [T, d]
        for every row), or, in a batch padded on the left, each row's own [B, T]."""
        positions = cache.row_positions(x.size(-2)) if cache is not None else None
        if positions is not None:
            return positions + self.offset
        start = (cache.length if cache is not None else 0) + self.offset
        return slice(start, start + x.size(-2))


class SinusoidalPositions(PositionTable):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) (§3.5)."""

    def __init__(self, dim, max_len):
        super().__init__()
        # derived, so not in checkpoints
        self.register_buffer("table", self.sinusoids(max_len, dim), persistent=False)

    @staticmethod
    def sinusoids(max_len, dim):
        position = torch.arange(max_len, dtype=torch.float32)[:, None]  # [max_len, 1]
        inverse_frequency = torch.exp(torch.arange(0, dim, 2) * (-math.log(10000.0) / dim))
        table = torch.zeros(max_len, dim)
        table[:, 0::2] = torch.sin(position * inverse_frequency)
        table[:, 1::2] = torch.cos(position * inverse_frequency[: dim // 2])
        return table

    @torch.no_grad()
    def reset_parameters(self):
        self.table.copy_(self.sinusoids(*self.table.shape))

    def forward(self, x, cache=None):
        return self.table[self.rows(x, cache)].to(x.dtype)  # [T, d]; padded rows: [B, T, d]


class SinusoidalPositionsInHalves(SinusoidalPositions):
    """The same sines and cosines, every sine first, then every cosine (Marian's layout, which it
    computes in float64)."""

    @staticmethod
    def sinusoids(max_len, dim):
        position = torch.arange(max_len, dtype=torch.float64)[:, None]
        angle = position / 10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        return torch.cat([angle.sin(), angle[:, : dim // 2].cos()], dim=-1).float()


class FairseqSinusoidalPositions(SinusoidalPositions):
    """fairseq's sines and cosines (M2M100's, NLLB's): every sine, then every cosine, of
    frequencies 10000^(-i / (d/2 - 1)), read `offset` rows on (its padding id + 1)."""

    def __init__(self, dim, max_len, offset):
        super().__init__(dim, max_len + offset)
        self.offset = offset

    @staticmethod
    def sinusoids(max_len, dim):
        half = dim // 2
        frequency = torch.exp(torch.arange(half).float() * -(math.log(10000.0) / (half - 1)))
        angle = torch.arange(max_len).float()[:, None] * frequency[None, :]
        table = torch.cat([angle.sin(), angle.cos()], dim=-1)
        return torch.cat([table, torch.zeros(max_len, dim % 2)], dim=-1)  # odd widths: a zero last


class LearnedPositions(PositionTable):
    """One learned vector per position (Table 3, row E)."""

    def __init__(self, dim, max_len):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_len, dim))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.weight, std=self.weight.size(1) ** -0.5)

    def forward(self, x, cache=None):
        return self.weight[self.rows(x, cache)]  # [T, d]; padded rows: [B, T, d]


class OffsetLearnedPositions(LearnedPositions):
    """Learned vectors after `offset` rows no position reads (BART's two, which its checkpoints
    keep)."""

    def __init__(self, dim, max_len, offset):
        super().__init__(dim, max_len + offset)
        self.offset = offset


class RelativePositionBias(nn.Module):
    """T5's relative position bias (Raffel et al., 2020): a learned scalar per head and bucket of
    the distance from a query to a key, added to the attention's scores. A bucket is the distance
    itself below half the buckets (per direction, where keys after the query count too), then one
    of logarithmically wider ranges up to `max_distance`, beyond which all share the last.

    forward(x, cache) -> [1, heads, T, start + T]: the bias of x's T positions, which follow the
    cache's `start`, over every key up to them."""

    def __init__(self, dim, heads, buckets=32, max_distance=128, bidirectional=True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(buckets, heads))
        self.buckets, self.max_distance, self.bidirectional = buckets, max_distance, bidirectional
        self.dim = dim
        self.reset_parameters()

    def reset_parameters(self):  # T5's: the scores' bias of the scale of unscaled q.k at init
        nn.init.normal_(self.weight, std=self.dim ** -0.5)

    def forward(self, x, cache=None):
        start = cache.length if cache is not None else 0
        queries = torch.arange(start, start + x.size(-2), device=x.device)
        keys = torch.arange(start + x.size(-2), device=x.device)
        buckets = self.bucket(keys[None, :] - queries[:, None])  # [T, start + T]
        return self.weight[buckets].permute(2, 0, 1)[None].to(x.dtype)

    def bucket(self, distance):
        """The bucket of each key's distance from its query (key - query; after it is positive)."""
        buckets, half = self.buckets, torch.zeros_like(distance)
        if self.bidirectional:  # keys after the query have the upper half of the buckets
            buckets //= 2
            half = (distance > 0).long() * buckets
            distance = distance.abs()
        else:  # a causal query sees only keys before it
            distance = (-distance).clamp(min=0)
        exact = buckets // 2
        # from `exact` on, log-spaced up to max_distance (clamped: log stays finite where unused)
        widths = math.log(self.max_distance / exact)
        ratio = torch.log(distance.clamp(min=1).float() / exact) / widths
        wide = (exact + (ratio * (buckets - exact)).long()).clamp(max=buckets - 1)
        return half + torch.where(distance < exact, distance, wide)


class TokenTypeEmbedding(nn.Module):
    """BERT's token type (segment) embeddings: given the token types [B, T] (a sentence
    pair's first text 0, its second 1), each position's type's row [B, T, d]; without
    them every token is of the first type, whose row is each position's (a view, not
    a copy)."""

    def __init__(self, dim, types=2):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(types, dim))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.weight, std=self.weight.size(1) ** -0.5)

    def forward(self, x, token_types=None):
        if token_types is None:
            return self.weight[0].to(x.dtype).expand_as(x)
        return self.weight[token_types].to(x.dtype)  # [B, T, d]
