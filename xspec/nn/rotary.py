"""Rotary position embeddings that generated models use, one class per way of computing the
frequencies; a generated file imports the one its spec names. None has an option it does not
use: a spec with Llama 3.1's scaling gets Llama3RotaryEmbedding, one without any RotaryEmbedding.

An embedding makes the angles, cos and sin, of a forward's positions, which attention turns queries
and keys by. A stack makes them once a forward and passes them to every layer's attention (a spec's
`rotary_embedding`, as transformers' models do); an attention with `rotary = true` holds an
embedding of its own and makes them itself."""

import math

import torch
import torch.nn as nn


class RotaryEmbedding(nn.Module):
    """Rotary position embeddings (Su et al., 2021): the feature pair (i, i + dim/2) of position p
    is turned by the angle p * theta_i, theta_i = base^(-2i/dim), in float32. The cos and sin of
    every position's angles are made once, for as many positions as a forward has reached (twice
    that when outgrown), and each forward slices them. The table is shared by every embedding of
    the same angles on a device (`tables`): attentions that hold an embedding each turn by one
    table. While torch.compile traces, the angles of a forward's positions are computed in the
    graph instead, where they fuse into the rotation: a table that grew would compile the step
    again."""

    tables: dict = {}  # (device, frequencies, scale) -> the longest cos and sin table made so far

    def __init__(self, dim, base):
        super().__init__()
        self.dim, self.base = dim, base
        # Derived, so not in checkpoints; a scaling's class sets its own after its options.
        unscaled = RotaryEmbedding.frequencies(self)
        self.register_buffer("inverse_frequency", unscaled, persistent=False)
        self.register_buffer("turns", torch.empty(0, 4 * unscaled.numel()), persistent=False)

    def frequencies(self):
        """theta_i for i < dim / 2."""
        exponents = torch.arange(0, self.dim, 2, dtype=torch.int64).float() / self.dim
        return 1.0 / (self.base ** exponents)

    def scale(self):
        """What cos and sin are multiplied by (YaRN's attention factor); 1 here."""
        return 1.0

    @torch.no_grad()
    def reset_parameters(self):
        self.inverse_frequency.copy_(self.frequencies())
        self.turns = self.turns.new_empty(0, self.turns.size(1))

    def forward(self, x, cache=None):
        """The angles [B, T, 2 * dim] of x's T positions (x [B, T, ...]), their cos then their
        sin: those after the cache's `length`, or, where its rows are padded, each row's own (its
        `row_positions`)."""
        start = cache.length if cache is not None else 0
        end = start + x.size(1)
        rows = cache.row_positions(x.size(1)) if cache is not None else None  # padded: [B, T]
        if torch.compiler.is_compiling():
            positions = torch.arange(start, end, device=x.device) if rows is None else rows
            turns = self.angles_at(positions)
        else:
            if end > self.turns.size(0):
                self.turns = self.shared_angles(max(end, 2 * self.turns.size(0)))
            turns = self.turns[start:end] if rows is None else self.turns[rows]
        return turns.expand(x.size(0), -1, -1)  # one row's positions for all, where none is padded

    def shared_angles(self, positions):
        """The cos and sin table of at least `positions` positions, made here or by an embedding of
        the same angles (here on the meta device, where they have no values to compare)."""
        if self.inverse_frequency.is_meta:
            return self.angles(positions)
        frequencies = tuple(self.inverse_frequency.tolist())
        key = (str(self.inverse_frequency.device), frequencies, self.scale())
        table = RotaryEmbedding.tables.get(key)
        if table is None or table.size(0) < positions:
            table = self.angles(positions)
            RotaryEmbedding.tables[key] = table
        return table

    def angles(self, positions):
        """cos and sin [positions, 2 * dim] of the angles of positions 0, 1, ..."""
        return self.angles_at(torch.arange(positions, device=self.inverse_frequency.device))

    def angles_at(self, positions):
        """cos then sin [*positions.shape, 2 * dim] of the angles of `positions`, scaled."""
        angles = positions.float()[..., None] * self.inverse_frequency
        angles = torch.cat([angles, angles], dim=-1)
        turns = torch.cat([angles.cos(), angles.sin()], dim=-1)
        return turns if self.scale() == 1.0 else turns * self.scale()


class LinearRotaryEmbedding(RotaryEmbedding):
    """Position interpolation (Chen et al., 2023): every theta_i divided by `factor`, for
    contexts `factor` times the one a checkpoint was trained at."""

    def __init__(self, dim, base, factor):
        super().__init__(dim, base)
        self.factor = factor
        self.inverse_frequency = self.frequencies()

    def frequencies(self):
        return super().frequencies() / self.factor


class Llama3RotaryEmbedding(RotaryEmbedding):
    """Llama 3.1's scaling: wavelengths beyond original_max_len / low_freq_factor divided by
    `factor`, those below original_max_len / high_freq_factor kept, a smooth blend between."""

    def __init__(self, dim, base, factor, low_freq_factor, high_freq_factor, original_max_len):
        super().__init__(dim, base)
        self.factor, self.original_max_len = factor, original_max_len
        self.low_freq_factor, self.high_freq_factor = low_freq_factor, high_freq_factor
        self.inverse_frequency = self.frequencies()

    def frequencies(self):
        frequency = super().frequencies()
        factor, low, high = self.factor, self.low_freq_factor, self.high_freq_factor
        wavelength = 2 * math.pi / frequency
        long = self.original_max_len / low  # wavelengths beyond this are divided by factor
        short = self.original_max_len / high  # ... below this kept
        scaled = torch.where(wavelength > long, frequency / factor, frequency)
        smooth = (self.original_max_len / wavelength - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        between = ~(wavelength < short) * ~(wavelength > long)
        return torch.where(between, blended, scaled)


class YarnRotaryEmbedding(RotaryEmbedding):
    """YaRN's NTK-by-parts (Peng et al., 2023): features turning fewer than beta_slow times over
    the original context interpolated by `factor`, more than beta_fast kept, a linear ramp
    between (its ends rounded to whole features where `truncate`); cos and sin scaled by
    attention_factor."""

    def __init__(self, dim, base, factor, original_max_len, beta_fast, beta_slow,
                 attention_factor, truncate):
        super().__init__(dim, base)
        self.factor, self.original_max_len = factor, original_max_len
        self.beta_fast, self.beta_slow, self.truncate = beta_fast, beta_slow, truncate
        self.attention_factor = attention_factor
        self.inverse_frequency = self.frequencies()

    def frequencies(self):
        dim, base = self.dim, self.base

        def feature(turns):  # the feature that turns `turns` times over the original context
            turned = self.original_max_len / (turns * 2 * math.pi)
            return dim * math.log(turned) / (2 * math.log(base))

        low, high = feature(self.beta_fast), feature(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # a ramp of one step
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        kept = 1 - ramp  # 1: the original frequency, 0: interpolated
        frequency_base = base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
        interpolated, original = 1.0 / (self.factor * frequency_base), 1.0 / frequency_base
        return interpolated * (1 - kept) + original * kept

    def scale(self):
        return self.attention_factor
