"""Multi-head latent attention (MLA: DeepSeek-V2, Liu et al., 2024, §2.1), which DeepSeek-V3 and
Kimi K2 use: keys and values are made from a small latent per token, so the decoding cache keeps
that latent and one rotary key instead of every head's keys and values."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import AttentionMask


class LatentAttention(nn.Module):
    """Each head's query and key: `nope_dim` features without positions, `rope_dim` turned by
    rotary angles: those passed to forward (`position_embeddings`, [B, T, 2 * rope_dim], a
    stack's, made once for all its layers), else those of its own embedding `rotary`. Keys
    (their first part) and values come from the latent c = norm(x W^DKV) of `latent_dim`
    features, through W^UK and W^UV; the key's rotary part, x W^KR, is one for all heads.
    softmax(q k^T * scale) v per head, then W^O. The queries come from x through W^Q, or, with a
    `q_rank`, through a latent of their own: x W^DQ, normalized, then W^UQ. Modules are named as
    DeepSeek's checkpoints name them."""

    # Decoding reads this weight as matrices: a weight format keeps it.
    weights_read = ("kv_b_proj",)

    def __init__(self, d_model, heads, latent_dim, nope_dim, rope_dim, v_dim, *, q_rank, eps, bias,
                 scale, rotary=None):
        super().__init__()
        self.heads, self.latent_dim, self.scale = heads, latent_dim, scale
        self.nope_dim, self.rope_dim, self.v_dim = nope_dim, rope_dim, v_dim
        queries = heads * (nope_dim + rope_dim)
        if q_rank:
            self.q_a_proj = nn.Linear(d_model, q_rank, bias=bias)  # W^DQ
            self.q_a_layernorm = nn.RMSNorm(q_rank, eps=eps)
            self.q_b_proj = nn.Linear(q_rank, queries, bias=False)  # W^UQ and W^QR
        else:
            self.q_proj = nn.Linear(d_model, queries, bias=False)
        self.rotary = rotary
        # W^DKV and W^KR, then W^UK and W^UV
        self.kv_a_proj_with_mqa = nn.Linear(d_model, latent_dim + rope_dim, bias=bias)
        self.kv_a_layernorm = nn.RMSNorm(latent_dim, eps=eps)
        self.kv_b_proj = nn.Linear(latent_dim, heads * (nope_dim + v_dim), bias=False)
        self.o_proj = nn.Linear(heads * v_dim, d_model, bias=bias)
        self.q_rank = q_rank

    def forward(self, x, cache=None, position_embeddings=None, attention_mask=None):
        """`attention_mask` [B or 1, 1, T, Tk]: the keys each query sees, a stack's (AttentionMask,
        causal); None: causality, and what the cache says of a padded batch or packed documents."""
        q_nope, q_rope, latent, k_rope = self.project(x, position_embeddings, cache)
        mask = attention_mask
        if cache is not None:  # the latent and the rotary key of every position decoded
            latent, k_rope = cache.append(self, latent, k_rope)
            if mask is None:
                mask = self.kept(cache, q_nope.size(2), latent.size(2), x.device)
        if latent.size(2) == q_nope.size(2):  # none cached before: keys made once anyway
            out = self.attend(q_nope, q_rope, latent, k_rope, mask)
        else:
            out = self.attend_latent(q_nope, q_rope, latent, k_rope, mask)
        return self.o_proj(out.transpose(1, 2).flatten(2))  # [B, T, h * v_dim] -> [B, T, d]

    def kept(self, cache, queries, keys, device):
        """[B or 1, 1, Tq, Tk]: the keys each query sees by causality and by what the cache keeps
        (a padded batch's rows, packed documents); None where causality alone, as SDPA makes it
        for a whole sequence, or every key, for one query."""
        kept = cache.kept_keys(None, queries)  # rows', documents': [B, 1, Tq, Tk]
        visible = self.visible(queries, keys, device)
        if visible is not None and (kept is not None or queries != keys):
            return visible[None, None] if kept is None else kept & visible
        return kept

    def project(self, x, angles=None, cache=None):
        """x [B, T, d], its positions' rotary `angles` [B, T, 2 * rope] (None: its own
        embedding's, after the cache's positions) -> each head's query without and with positions
        [B, h, T, nope], [B, h, T, rope] (turned), the latent [B, 1, T, latent_dim] and the rotary
        key [B, 1, T, rope] (turned)."""
        if angles is None:
            angles = self.rotary(x, cache)
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_rank else self.q_proj(x)
        q = q.unflatten(-1, (self.heads, -1)).transpose(1, 2)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([self.latent_dim, self.rope_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)[:, None]
        return q_nope, self.turned(q_rope, angles), latent, self.turned(k_rope[:, None], angles)

    @staticmethod
    def turned(x, angles):
        """x [B, h, T, rope] turned by `angles` (cos and sin): each feature pair (i, i + rope/2)
        by its angle, in float32."""
        cos, sin = angles[:, None].chunk(2, dim=-1)  # [B, 1, T, rope]: all heads'
        x1, x2 = x.float().chunk(2, dim=-1)
        return (x.float() * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)

    def keys_values(self, latent, k_rope):
        """Every head's keys [B, h, Tk, nope + rope] and values [B, h, Tk, v] from the latent."""
        kv = self.kv_b_proj(latent[:, 0]).unflatten(-1, (self.heads, -1)).transpose(1, 2)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        return torch.cat([k_nope, k_rope.expand(-1, self.heads, -1, -1)], dim=-1), v

    def attend(self, q_nope, q_rope, latent, k_rope, mask=None):
        """softmax(q k^T * scale) v with every head's keys and values made from the latent
        (training, and a prompt read into an empty cache); `mask` [B or 1, 1, T, T]: the keys
        each query may see (None: causality)."""
        k, v = self.keys_values(latent, k_rope)
        q = torch.cat([q_nope, q_rope], dim=-1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                              scale=self.scale)

    def attend_latent(self, q_nope, q_rope, latent, k_rope, mask):
        """The same attention over the latent itself (decoding): W^UK folded into the queries and
        W^UV applied after, (q_nope W^UK) c^T = q_nope (c W^UK^T)^T, so no position's keys or
        values are made. The latent is one key head for all query heads: one head's queries."""
        up = self.kv_b_proj.weight.view(self.heads, -1, self.latent_dim)  # [h, nope + v, latent]
        up_k, up_v = up.split([self.nope_dim, self.v_dim], dim=1)
        q = torch.cat([q_nope @ up_k, q_rope], dim=-1)  # [B, h, Tq, latent + rope]
        k = torch.cat([latent, k_rope], dim=-1)  # [B, 1, Tk, latent + rope]
        heads, queries = q.size(1), q.size(2)
        if mask is not None:  # [h * Tq, Tk], or a padded batch's [B, 1, h * Tq, Tk]
            mask = mask.repeat(*[1] * (mask.dim() - 2), heads, 1)
        out = F.scaled_dot_product_attention(q.flatten(1, 2)[:, None], k, latent, attn_mask=mask,
                                             scale=self.scale)  # [B, 1, h * Tq, latent]
        out = out.view(-1, heads, queries, self.latent_dim)
        return out @ up_v.transpose(1, 2)  # [B, h, Tq, v]

    def visible(self, queries, keys, device):
        """[Tq, Tk]: query i, at position Tk - Tq + i, sees the keys up to it; None for one
        query, which sees every key cached."""
        if queries == 1:
            return None
        return AttentionMask.band(queries, keys, True, None, device)
