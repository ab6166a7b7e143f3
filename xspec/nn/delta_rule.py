"""Gated DeltaNet (Yang et al., 2024), the linear attention of Qwen3-Next's hybrid layers: each
head keeps a state S [d_k, d_v] of fixed size in place of the keys and values of every position,
decays it by a_t = exp(g_t) and writes to it by the delta rule, which first takes out what S
already holds for the key: S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T, and
o_t = S_t^T q_t.

Training and prefill compute it a chunk of positions at a time (parallel within a chunk, memory
linear in the sequence length); decoding one position at a time. Both start from a state and
return the new one, which a decoding cache keeps with the convolution's last inputs."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .convolution import ConvolvedMixer


class GatedDeltaNet(ConvolvedMixer):
    """x [B, T, d_model] -> [B, T, d_model]. Queries, keys, values and the output gate z from
    in_proj_qkvz; beta = sigmoid(b) (write strength) and a (for the decay) from in_proj_ba. A
    causal depthwise convolution of `conv_kernel` positions with SiLU over q, k and v; q and k
    L2-normalized, q scaled by d_k^-1/2; the decay g = -exp(A_log) * softplus(a + dt_bias) per
    value head. The gated delta rule per value head, then RMSNorm(o) * silu(z) per head (gated
    after the norm) and out_proj. The state S of each row is [v_heads, d_k, d_v], as
    transformers' cache holds it.

    `k_heads` query/key heads of d_k features, `v_heads` value heads of d_v (a multiple of
    k_heads: value head j reads query/key head j // (v_heads / k_heads)). The projections keep
    Qwen3-Next's layout, features grouped by key head: for each of the k_heads, in_proj_qkvz
    gives [q d_k, k d_k, v r*d_v, z r*d_v] and in_proj_ba [b r, a r], r = v_heads / k_heads."""

    def __init__(self, d_model, k_heads, v_heads, d_k, d_v, *, conv_kernel, eps, chunk_size):
        super().__init__()
        assert v_heads % k_heads == 0, "value heads come in groups, one per query/key head"
        self.k_heads, self.v_heads, self.d_k, self.d_v = k_heads, v_heads, d_k, d_v
        self.chunk_size = chunk_size
        group = v_heads // k_heads
        self.in_proj_qkvz = nn.Linear(d_model, k_heads * (2 * d_k + 2 * group * d_v), bias=False)
        self.in_proj_ba = nn.Linear(d_model, k_heads * 2 * group, bias=False)
        channels = k_heads * 2 * d_k + v_heads * d_v  # q, k and v convolved
        self.conv1d = nn.Conv1d(channels, channels, conv_kernel, groups=channels,
                                padding=conv_kernel - 1, bias=False)
        self.norm = nn.RMSNorm(d_v, eps=eps)
        self.out_proj = nn.Linear(v_heads * d_v, d_model, bias=False)
        self.A_log = nn.Parameter(torch.empty(v_heads))
        self.dt_bias = nn.Parameter(torch.empty(v_heads))
        self.reset_parameters()

    def reset_parameters(self):
        self.init_decay(self.A_log, self.dt_bias)

    def forward(self, x, cache=None):
        """Without a cache, from the zero state; with one, from the state kept there (the
        convolution's window and S), which is then replaced by the state after x."""
        kept = cache.state(self) if cache is not None else None
        window, state = kept if kept is not None else (None, None)
        # packed documents kept apart (training)
        documents = cache.documents if cache is not None else None
        q, k, v, z, g, beta, window = self.project(x, window, documents)
        if state is None:
            state = q.new_zeros(x.size(0), self.v_heads, self.d_k, self.d_v)
        if x.size(1) == 1:
            out, state = self.recurrent(q, k, v, g, beta, state)  # [B, h_v, T, d_v]
        else:
            out, state = self.chunked(q, k, v, g, beta, state, documents)
        if cache is not None:
            cache.keep(self, window, state)
        out = self.norm(out.transpose(1, 2).to(x.dtype)) * F.silu(z)  # [B, T, h_v, d_v]
        return self.out_proj(out.flatten(2))

    def project(self, x, window, documents=None):
        """x [B, T, d_model] -> q, k [B, h_v, T, d_k] and v [B, h_v, T, d_v] (float32, each
        query/key head repeated for its value heads), z [B, T, h_v, d_v], g and beta [B, h_v, T]
        (float32), and the convolution's new window."""
        group, d_k, d_v = self.v_heads // self.k_heads, self.d_k, self.d_v
        qkvz = self.in_proj_qkvz(x).unflatten(-1, (self.k_heads, -1))  # [B, T, h_k, ...]
        q, k, v, z = qkvz.split([d_k, d_k, group * d_v, group * d_v], dim=-1)
        b, a = self.in_proj_ba(x).unflatten(-1, (self.k_heads, -1)).split([group, group], dim=-1)
        qkv = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], dim=-1)
        qkv, window = self.convolve(qkv, window, documents)
        q, k, v = qkv.split([self.k_heads * d_k, self.k_heads * d_k, self.v_heads * d_v], dim=-1)
        q = self.l2_normalized(q.unflatten(-1, (self.k_heads, -1)).float()) * d_k ** -0.5
        k = self.l2_normalized(k.unflatten(-1, (self.k_heads, -1)).float())
        # [B, h_v, T, d_k]: value head j reads query/key head j // group
        q, k = (t.repeat_interleave(group, dim=2).transpose(1, 2) for t in (q, k))
        v = v.unflatten(-1, (self.v_heads, -1)).transpose(1, 2).float()  # [B, h_v, T, d_v]
        g = -self.A_log.float().exp() * F.softplus(a.flatten(2).float() + self.dt_bias.float())
        beta = b.flatten(2).float().sigmoid()
        z = z.flatten(2).unflatten(-1, (self.v_heads, -1))  # [B, T, h_v, d_v]
        return q, k, v, z, g.transpose(1, 2), beta.transpose(1, 2), window


    @staticmethod
    def l2_normalized(x, eps=1e-6):
        return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)

    def recurrent(self, q, k, v, g, beta, state):
        """The delta rule one position at a time: q, k [B, h, T, d_k], v [B, h, T, d_v], g and
        beta [B, h, T], and the state [B, h, d_k, d_v] before them -> o [B, h, T, d_v] and the
        state after."""
        out = []
        for t in range(q.size(2)):
            q_t, k_t, v_t = q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]  # [B, h, 1, d]
            state = state * g[:, :, t, None, None].exp()
            write = beta[:, :, t, None, None] * (v_t - k_t @ state)  # a correction [B, h, 1, d_v]
            state = state + k_t.transpose(-1, -2) @ write
            out.append(q_t @ state)
        return torch.cat(out, dim=2), state

    def chunked(self, q, k, v, g, beta, state, documents=None):
        """The same, `chunk_size` positions at a time. Within a chunk, with G_i the sum of g from
        its start through i and S_0 the state before it, each write u_i = beta_i (v_i - k_i^T S'_i)
        reads the state just before it, S'_i = e^{G_i} S_0 + sum_{j<i} e^{G_i - G_j} k_j u_j^T; so
        the writes solve a unit lower triangular system (I + A) U = beta V - beta e^G K S_0, with
        A_ij = beta_i e^{G_i - G_j} k_i.k_j (j < i), and o_i = e^{G_i} S_0^T q_i
        + sum_{j<=i} e^{G_i - G_j} (q_i.k_j) u_j. The last chunk is padded with positions that
        neither decay nor write. With `documents` [B, T], no position reads another document's
        writes, and a document starts from the zero state."""
        size, length = self.chunk_size, q.size(2)
        pad = -length % size
        # [B, h, N, L, d] and [B, h, N, L]: N chunks of L positions
        q, k, v = (F.pad(t, (0, 0, 0, pad)).unflatten(2, (-1, size)) for t in (q, k, v))
        g, beta = (F.pad(t, (0, pad)).unflatten(2, (-1, size)) for t in (g, beta))
        decay = g.cumsum(-1)  # G
        later = torch.ones(size, size, dtype=torch.bool, device=q.device).triu(1)
        # e^{G_i - G_j} for j <= i, 0 for j > i (masked before exp: those would overflow)
        pairwise = (decay[..., :, None] - decay[..., None, :]).masked_fill(later, -math.inf)
        pairwise = pairwise.exp()
        continues = last = torch.ones_like(decay)
        if documents is not None:
            same, continues, last = self.chunk_masks(documents, pad, size)
            pairwise = pairwise * same
        k_beta = k * beta[..., None]
        system = (k_beta @ k.transpose(-1, -2)) * pairwise  # A below the diagonal [B, h, N, L, L]

        def solve(rhs):  # the solve takes 1s for the diagonal
            return torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)

        fresh = solve(v * beta[..., None])  # U from a zero state [B, h, N, L, d_v] ...
        # ... less reads @ S_0 [B, h, N, L, d_k]
        reads = solve(k_beta * (decay.exp() * continues)[..., None])
        scores = (q @ k.transpose(-1, -2)) * pairwise  # [B, h, N, L, L]
        q_decayed = q * (decay.exp() * continues)[..., None]
        k_decayed = k * ((decay[..., -1:] - decay).exp() * last)[..., None]  # to the chunk's end
        out = []
        for n in range(q.size(2)):
            writes = fresh[:, :, n] - reads[:, :, n] @ state  # U [B, h, L, d_v]
            out.append(q_decayed[:, :, n] @ state + scores[:, :, n] @ writes)
            state = state * (decay[:, :, n, -1].exp() * continues[:, :, n, -1])[..., None, None]
            state = state + k_decayed[:, :, n].transpose(-1, -2) @ writes
        return torch.cat(out, dim=2)[:, :, :length], state
