"""Attention that generated models use, as pieces: the paper's multi-head attention, and one small
class per option the newer families add, each overriding the one step it changes and calling the
others through super(). A spec's attention is the core alone, one piece, or a class of the
generated file that lists its pieces (`class SlidingWindowRotaryAttention(SlidingWindowAttention,
RotaryAttention)`): the file imports those and nothing else. Rotary embeddings are
rotary.py's.

Diagrams read an attention's queries, keys and mask through `queries`, `keys_values` and `mask`
(and the weights of ExplicitAttention through `weights`). How the weights are computed
fast on a device (FlexAttention) is the runtime's (runtime/attention_kernels.py)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(QW_i^Q, KW_i^K, VW_i^V),
    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (§3.2); keys and values of `kv_heads`
    heads, each serving heads / kv_heads query heads (grouped-query attention where fewer)."""

    sdpa_causal = True  # SDPA's own causal mask serves where nothing else masks

    def __init__(self, d_model, heads, kv_heads, d_k, d_v, *, bias, out_bias, causal):
        super().__init__()
        self.heads, self.kv_heads, self.causal = heads, kv_heads, causal
        # W^Q, W^K, W^V and W^O (§3.2.2)
        self.q_proj = nn.Linear(d_model, heads * d_k, bias=bias)
        self.k_proj = nn.Linear(d_model, kv_heads * d_k, bias=bias)
        self.v_proj = nn.Linear(d_model, kv_heads * d_v, bias=bias)
        self.out_proj = nn.Linear(heads * d_v, d_model, bias=out_bias)
        self.init_projections()

    def reset_parameters(self):
        self.init_projections()

    def init_projections(self):
        """Xavier-uniform W^Q, W^K, W^V and W^O (over nn.Linear's own), zero biases."""
        for projection in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(projection.weight)
            if projection.bias is not None:
                nn.init.zeros_(projection.bias)

    def forward(self, query, key, value, padding_mask=None, cache=None):
        start = cache.length if cache is not None else 0
        q = self.queries(self.q_proj(query).unflatten(-1, (self.heads, -1)).transpose(1, 2), start)
        k, v = self.keys_values(key, value, start, cache)  # [B, kv_h, Tk, d_k], [B, kv_h, Tk, d_v]
        out = self.attend(q, k, v, *self.mask(q, k, padding_mask, cache))  # [B, h, Tq, d_v]
        return self.out_proj(self.gated(out.transpose(1, 2).flatten(2), query))  # [B, Tq, h*d_v]

    def queries(self, q, start):  # q [B, h, Tq, d_k]
        return q

    def gated(self, out, query):  # the heads' outputs [B, Tq, h*d_v] as W^O reads them
        return out

    def keys(self, k, start):
        return k

    def keys_values(self, key, value, start, cache):
        k = self.keys(self.k_proj(key).unflatten(-1, (self.kv_heads, -1)).transpose(1, 2), start)
        v = self.v_proj(value).unflatten(-1, (self.kv_heads, -1)).transpose(1, 2)
        return (k, v) if cache is None else self.cached(cache, k, v)

    def cached(self, cache, k, v):
        return cache.append(self, k, v)  # the keys and values of every position decoded

    def mask(self, q, k, padding_mask, cache):
        """The mask SDPA takes (True: attend), and whether its own causal mask serves instead: from
        static facts only (torch.compile cannot branch on a symbolic size)."""
        mask = None if padding_mask is None else ~padding_mask[:, None, None, :]  # [B, 1, 1, Tk]
        if not self.causal or (cache is not None and q.size(2) == 1):  # a step sees all cached
            return mask, False
        if self.sdpa_causal and cache is None and mask is None:
            return None, True
        visible = self.visible(q.size(2), k.size(2), q.device)
        # packed ones that see nothing of each other
        documents = cache.documents if cache is not None else None
        if documents is not None:  # [B, 1, T, T]
            visible = visible & (documents[:, None, :, None] == documents[:, None, None, :])
        return (visible if mask is None else mask & visible), False

    def visible(self, queries, keys, device):
        """[Tq, Tk]: query i, at position Tk - Tq + i, sees the keys up to it (§3.2.3)."""
        return torch.ones(queries, keys, dtype=torch.bool, device=device).tril(keys - queries)

    def attend(self, q, k, v, mask, is_causal):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                              enable_gqa=self.kv_heads != self.heads)


class CrossAttention(MultiHeadAttention):
    """Attention over another sequence (the encoder's output, §3.2.3); while decoding, its keys
    and values, computed once per memory tensor, are kept in the cache."""

    def keys_values(self, key, value, start, cache):
        kept = cache.memory.get(self) if cache is not None else None
        if kept is None or kept[0] is not key or kept[1] is not value:
            kept = (key, value, *super().keys_values(key, value, start, None))
            if cache is not None:
                cache.memory[self] = kept
        return kept[2], kept[3]


class RotaryAttention(MultiHeadAttention):
    """Queries and keys turned by rotary position embeddings (Su et al., 2021); keys are cached
    turned."""

    def __init__(self, *args, rotary, **kwargs):
        super().__init__(*args, **kwargs)
        self.rotary = rotary

    def queries(self, q, start):
        return self.rotary(super().queries(q, start), start)

    def keys(self, k, start):
        return self.rotary(super().keys(k, start), start)


class QKNormAttention(MultiHeadAttention):
    """Each head's queries and keys normalized before the rotation (QK-norm: Qwen3, Gemma 3)."""

    def __init__(self, *args, q_norm, k_norm, **kwargs):
        super().__init__(*args, **kwargs)
        self.q_norm, self.k_norm = q_norm, k_norm

    def queries(self, q, start):
        return super().queries(self.normalized(q, self.q_norm), start)

    def keys(self, k, start):
        return super().keys(self.normalized(k, self.k_norm), start)

    def normalized(self, x, norm):
        return norm(x)


class ProjectionQKNormAttention(QKNormAttention):
    """QK-norm over each whole projection, all heads at once (OLMo 2)."""

    def normalized(self, x, norm):
        return norm(x.transpose(1, 2).flatten(2)).unflatten(-1, x.shape[1::2]).transpose(1, 2)


class GatedAttention(MultiHeadAttention):
    """Each head's output multiplied by a gate made from the query's input, sigmoid(x W^G), before
    W^O (Qwen3-Next's full attention; Qiu et al., 2025)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate_proj = nn.Linear(self.q_proj.in_features, self.out_proj.in_features,
                                   bias=self.q_proj.bias is not None)

    def gated(self, out, query):
        return super().gated(out, query) * torch.sigmoid(self.gate_proj(query))


class ScaledAttention(MultiHeadAttention):
    """Scores scaled by `scale` instead of 1/sqrt(d_k) (Gemma: query_pre_attn_scalar^-0.5): the
    queries are multiplied by scale * sqrt(d_k), which the attention's 1/sqrt(d_k) cancels."""

    def __init__(self, *args, scale, **kwargs):
        super().__init__(*args, **kwargs)
        self.scale = scale

    def queries(self, q, start):
        return super().queries(q, start) * (self.scale * q.size(-1) ** 0.5)


class DropoutAttention(MultiHeadAttention):
    """Dropout on the attention weights while training."""

    def __init__(self, *args, dropout, **kwargs):
        super().__init__(*args, **kwargs)
        self.dropout = dropout

    def attend(self, q, k, v, mask, is_causal):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                              dropout_p=self.dropout if self.training else 0.0,
                                              enable_gqa=self.kv_heads != self.heads)


class SlidingWindowAttention(MultiHeadAttention):
    """Each query sees its last `window` positions only (Mistral), or all of them where `window` is
    None (the global layers of Gemma 2 and gpt-oss); the cache keeps those."""

    def __init__(self, *args, window, **kwargs):
        super().__init__(*args, **kwargs)
        self.window = window
        self.sdpa_causal = window is None  # with a window, its mask is built here

    def visible(self, queries, keys, device):  # the causal mask less the keys before the window
        visible = super().visible(queries, keys, device)
        return visible if self.window is None else visible.triu(keys - queries - self.window + 1)

    def cached(self, cache, k, v):
        return cache.append(self, k, v, window=self.window)


class ALiBiAttention(MultiHeadAttention):
    """Scores biased by -slope_h * distance, a slope per head (ALiBi, Press et al., 2022)."""

    sdpa_causal = False  # its bias is built here

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("slopes", self.alibi_slopes(self.heads), persistent=False)  # [h]

    @torch.no_grad()
    def reset_parameters(self):
        super().reset_parameters()
        self.slopes.copy_(self.alibi_slopes(self.heads))

    @staticmethod
    def alibi_slopes(heads):
        """2^(-8/n), 2^(-16/n), ... for n a power of two; for other head counts, those of the power
        of two below, then every other slope of the one above."""
        below = 2 ** math.floor(math.log2(heads))
        slopes = [2 ** (-8 * (i + 1) / below) for i in range(below)]
        above = [2 ** (-8 * (i + 1) / (2 * below)) for i in range(0, 2 * below, 2)]
        return torch.tensor(slopes + above[: heads - below])

    def mask(self, q, k, padding_mask, cache):
        mask, _ = super().mask(q, k, padding_mask, cache)
        query_position = torch.arange(k.size(2) - q.size(2), k.size(2), device=q.device)
        distance = (query_position[:, None] - torch.arange(k.size(2), device=q.device)).abs()
        bias = (-self.slopes[:, None, None] * distance).to(q.dtype)  # [h, Tq, Tk]
        return (bias if mask is None else bias.masked_fill(~mask, float("-inf"))), False


class ExplicitAttention(MultiHeadAttention):
    """Attention whose weights are computed here, for options SDPA cannot state; diagrams read
    them from `weights`."""

    def attend(self, q, k, v, mask, is_causal):
        weights = self.weights(q, k, mask, is_causal)
        return (weights.unflatten(1, (self.kv_heads, -1)) @ v.unsqueeze(2)).flatten(1, 2)

    def weights(self, q, k, mask, is_causal):
        """softmax(Q K^T / sqrt(d_k)), masked: [B, h, Tq, Tk]. Query heads share their key head
        without copying it (grouped as [B, kv_h, h / kv_h, ...])."""
        grouped = q.unflatten(1, (self.kv_heads, -1))  # [B, kv_h, g, Tq, d_k]
        scores = (grouped @ k.unsqueeze(2).transpose(-2, -1)).flatten(1, 2)  # [B, h, Tq, Tk]
        scores = self.scores(scores * q.size(-1) ** -0.5)
        if is_causal:
            mask = self.visible(q.size(2), k.size(2), q.device)
        if mask is not None and mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        elif mask is not None:
            scores = scores + mask
        return self.softmax(scores)

    def scores(self, scores):
        return scores

    def softmax(self, scores):
        return scores.softmax(dim=-1)


class SoftCapAttention(ExplicitAttention):
    """Scores soft-capped, softcap * tanh(scores / softcap), before the mask (Gemma 2)."""

    def __init__(self, *args, softcap, **kwargs):
        super().__init__(*args, **kwargs)
        self.softcap = softcap

    def scores(self, scores):
        return torch.tanh(super().scores(scores) / self.softcap) * self.softcap


class SinkAttention(ExplicitAttention):
    """A learned logit per head in the softmax's denominator, its share dropped after it
    (gpt-oss)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sinks = nn.Parameter(torch.zeros(self.heads))

    def reset_parameters(self):
        super().reset_parameters()
        nn.init.zeros_(self.sinks)

    def softmax(self, scores):
        sinks = self.sinks.to(scores.dtype)[None, :, None, None]
        sinks = sinks.expand(scores.size(0), -1, scores.size(2), 1)
        return super().softmax(torch.cat([scores, sinks], dim=-1))[..., :-1]
