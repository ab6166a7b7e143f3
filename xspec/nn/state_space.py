"""Mamba-2's selective state space mixer (SSD: Dao & Gu, 2024), as Mamba-2, Bamba and Nemotron-H
use it: each head keeps a state h [head_dim, state_size] of fixed size, decays it by exp(dt_t A),
writes dt_t x_t B_t^T to it and reads it with C_t: h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T,
y_t = h_t C_t + D x_t. dt, B and C depend on the input (selective); A and D do not.

Training and prefill compute it a chunk of positions at a time (the state space dual: within a
chunk a masked attention, C_i.B_j with decay; between chunks the state); decoding one position at
a time. Both start from a state and return the new one, which a decoding cache keeps with the
convolution's last inputs."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .convolution import ConvolvedMixer


class GroupRMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * w over each group of `group_size` features in turn (computed
    in float32): Mamba-2's norm, its groups those of B and C."""

    def __init__(self, dim, group_size, eps):
        super().__init__()
        self.group_size, self.eps = group_size, eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self):
        nn.init.ones_(self.weight)

    def forward(self, x):
        groups = x.float().unflatten(-1, (-1, self.group_size))  # [..., groups, group_size]
        normalized = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normalized.flatten(-2) * self.weight.float()).to(x.dtype)


class Mamba2Mixer(ConvolvedMixer):
    """x [B, T, d_model] -> [B, T, d_model]. in_proj makes the gate z, xBC and dt per position; a
    causal depthwise convolution of `conv_kernel` positions with SiLU over xBC, which then splits
    into x (`heads` heads of `head_dim`) and B and C (`groups` groups of `state_size`, each
    serving heads / groups heads). dt = softplus(dt + dt_bias) clamped to `dt_limit` (min, max)
    and A = -exp(A_log), per head; the state space per head, plus D x; then norm(y * silu(z))
    (gated before the norm) and out_proj. `norm` takes [..., heads * head_dim]: a GroupRMSNorm of
    the groups' size (heads * head_dim / groups) for the families named above. The state h of
    each row is [heads, head_dim, state_size], as transformers' cache holds it."""

    def __init__(self, d_model, heads, head_dim, state_size, groups, *, conv_kernel, conv_bias,
                 bias, dt_limit, chunk_size, norm):
        super().__init__()
        assert heads % groups == 0, "each group of B and C serves whole heads"
        self.heads, self.head_dim, self.state_size = heads, head_dim, state_size
        self.groups, self.dt_limit, self.chunk_size = groups, tuple(dt_limit), chunk_size
        inner = heads * head_dim
        channels = inner + 2 * groups * state_size  # x, B and C convolved
        self.in_proj = nn.Linear(d_model, inner + channels + heads, bias=bias)  # z, xBC, dt
        self.conv1d = nn.Conv1d(channels, channels, conv_kernel, groups=channels,
                                padding=conv_kernel - 1, bias=conv_bias)
        self.norm = norm
        self.out_proj = nn.Linear(inner, d_model, bias=bias)
        self.A_log = nn.Parameter(torch.empty(heads))
        self.dt_bias = nn.Parameter(torch.empty(heads))
        self.D = nn.Parameter(torch.empty(heads))
        self.reset_parameters()

    def reset_parameters(self):
        self.init_decay(self.A_log, self.dt_bias)
        nn.init.ones_(self.D)

    def forward(self, x, cache=None):
        """Without a cache, from the zero state; with one, from the state kept there (the
        convolution's window and h), which is then replaced by the state after x."""
        kept = cache.state(self) if cache is not None else None
        window, state = kept if kept is not None else (None, None)
        # packed documents kept apart (training)
        documents = cache.documents if cache is not None else None
        z, xs, dt, B, C, window = self.project(x, window, documents)
        if state is None:
            state = xs.new_zeros(x.size(0), self.heads, self.head_dim, self.state_size)
        if x.size(1) == 1:
            y, state = self.recurrent(xs, dt, B, C, state)  # [B, h, T, head_dim]
        else:
            y, state = self.chunked(xs, dt, B, C, state, documents)
        if cache is not None:
            cache.keep(self, window, state)
        y = y + self.D.float()[:, None, None] * xs  # the skip
        y = self.norm(y.transpose(1, 2).flatten(2) * F.silu(z.float()))  # [B, T, h * head_dim]
        return self.out_proj(y.to(x.dtype))

    def project(self, x, window, documents=None):
        """x [B, T, d_model] -> z [B, T, h * head_dim]; x [B, h, T, head_dim], dt [B, h, T], and
        B and C [B, h, T, state_size] (float32, each group's repeated for its heads); and the
        convolution's new window."""
        inner, features = self.heads * self.head_dim, self.groups * self.state_size  # x's; B's
        z, xBC, dt = self.in_proj(x).split([inner, inner + 2 * features, self.heads], dim=-1)
        xBC, window = self.convolve(xBC, window, documents)
        xs, B, C = xBC.float().split([inner, features, features], dim=-1)
        xs = xs.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # [B, h, T, head_dim]
        # [B, h, T, state_size]: head i reads group i // (heads / groups)
        B, C = (t.unflatten(-1, (self.groups, -1)).repeat_interleave(self.heads // self.groups, 2)
                .transpose(1, 2) for t in (B, C))
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(*self.dt_limit).transpose(1, 2)
        return z, xs, dt, B, C, window


    def recurrent(self, x, dt, B, C, state):
        """The state space one position at a time: x [B, h, T, head_dim], dt [B, h, T], B and C
        [B, h, T, state_size], and the state [B, h, head_dim, state_size] before them -> y
        [B, h, T, head_dim] (without D x) and the state after."""
        A = -self.A_log.float().exp()[:, None, None]  # [h, 1, 1]
        out = []
        for t in range(x.size(2)):
            dt_t = dt[:, :, t, None, None]  # [B, h, 1, 1]
            write = (dt_t * x[:, :, t:t + 1]).transpose(-1, -2) @ B[:, :, t:t + 1]  # like state
            state = state * (dt_t * A).exp() + write
            out.append(C[:, :, t:t + 1] @ state.transpose(-1, -2))  # [B, h, 1, head_dim]
        return torch.cat(out, dim=2), state

    def chunked(self, x, dt, B, C, state, documents=None):
        """The same, `chunk_size` positions at a time. Within a chunk, with G_i the sum of dt A
        from its start through i and h_0 the state before it: y_i = sum_{j<=i} e^{G_i - G_j}
        (C_i.B_j) dt_j x_j (a masked attention, all chunks at once) + e^{G_i} h_0 C_i (the state
        before the chunk, passed on from chunk to chunk). The last chunk is padded with positions
        that neither decay nor write (dt = 0). With `documents` [B, T], no position reads another
        document's writes, and a document starts from the zero state."""
        size, length = self.chunk_size, x.size(2)
        pad = -length % size
        # [B, h, N, L, d] and [B, h, N, L]: N chunks of L positions
        x, B, C = (F.pad(t, (0, 0, 0, pad)).unflatten(2, (-1, size)) for t in (x, B, C))
        dt = F.pad(dt, (0, pad)).unflatten(2, (-1, size))
        decay = (dt * -self.A_log.float().exp()[:, None, None]).cumsum(-1)  # G
        later = torch.ones(size, size, dtype=torch.bool, device=x.device).triu(1)
        # e^{G_i - G_j} for j <= i, 0 for j > i (masked before exp: those would overflow)
        pairwise = (decay[..., :, None] - decay[..., None, :]).masked_fill(later, -math.inf)
        pairwise = pairwise.exp()  # [B, h, N, L, L]
        continues = last = torch.ones_like(decay)
        if documents is not None:
            same, continues, last = self.chunk_masks(documents, pad, size)
            pairwise = pairwise * same
        x_dt = x * dt[..., None]
        y = ((C @ B.transpose(-1, -2)) * pairwise) @ x_dt  # within chunks [B, h, N, L, head_dim]
        # what each chunk writes to the state by its end, sum_j e^{G_L - G_j} dt_j x_j B_j^T
        writes = (x_dt * ((decay[..., -1:] - decay).exp() * last)[..., None]).transpose(-1, -2) @ B
        starts = []  # the state before each chunk
        for n in range(x.size(2)):
            starts.append(state)
            state = state * (decay[:, :, n, -1].exp() * continues[:, :, n, -1])[..., None, None] \
                + writes[:, :, n]
        starts = torch.stack(starts, dim=2)  # [B, h, N, head_dim, state_size]
        y = y + (C @ starts.transpose(-1, -2)) * (decay.exp() * continues)[..., None]
        return y.flatten(2, 3)[:, :, :length], state
