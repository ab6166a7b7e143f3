"""Attention that generated models use: the paper's multi-head attention, each option of the
newer families passed in as a part, as torchtitan composes its attention: QK-norms (nn.Identity()
where none), rotary angles (passed to forward, or made by an embedding of rotary.py's it holds),
a scale, a sliding window, ALiBi's bias, an output gate, sinks, and how the weights are computed
(`inner_attention`: torch's fused SDPA where None, or WrittenOutAttention for what SDPA cannot
state: soft caps and sinks). The generated code builds the parts and passes them in; no class here
builds another. Which keys each query sees a stack may make once for its layers (AttentionMask) and
pass to each attention (`attention_mask`), else each attention applies the same rule itself.

Diagrams read an attention's queries, keys and mask through `heads_of` and `mask`,
and written-out weights through `inner_attention.weights`. How the weights are computed fast on a
device (FlexAttention) is the runtime's (runtime/attention_kernels.py)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(QW_i^Q, KW_i^K,
    VW_i^V), Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (§3.2); keys and values of
    `kv_heads` heads, each serving heads / kv_heads query heads (grouped-query attention).

    The options, each off by default:
    - `cross`: attention over another sequence (the encoder's output, §3.2.3), whose keys and
      values, while decoding, are computed once per memory tensor and kept in the cache;
    - `fused`: W^Q, W^K and W^V as rows of one matrix, `qkv_proj`, one product for the three
      (Phi-3's checkpoints); self-attention only;
    - `q_norm`, `k_norm`: each head's queries and keys normalized before the rotation (QK-norm:
      Qwen3, Gemma 3), or each whole projection where `norm_over` is "projection" (OLMo 2);
    - `rotary`: queries and keys turned by rotary position embeddings (Su et al., 2021), made by
      this embedding; keys are cached turned. Angles a stack made once for all its layers are
      passed to forward instead (`position_embeddings`, [B, T, 2r]: cos then sin);
    - `scale`: scores scaled by it instead of 1/sqrt(d_k) (Gemma: query_pre_attn_scalar^-0.5);
    - `window`: each query sees its last `window` positions only (Mistral; None in the global
      layers of Gemma 2 and gpt-oss); the cache keeps those; not causal, the positions fewer
      than `window` away on either side (ModernBERT's local layers);
    - `alibi`: scores biased by -slope_h * distance, a slope per head (Press et al., 2022);
    - `gate`: each head's output multiplied by sigmoid(x W^G) of the query's input before W^O
      (Qwen3-Next's full attention; Qiu et al., 2025), W^G's rows in W^Q's: each head's queries,
      then its gate's (transformers' layout);
    - `sinks`: a learned logit per head in the softmax's denominator, its share dropped after
      it (gpt-oss), which the inner attention takes;
    - `inner_attention`: the heads' outputs from queries, keys, values and the mask (the
      weights written out, for soft-capped scores, Gemma 2, or sinks); None: torch's fused
      SDPA, with `dropout` on the weights while training."""

    def __init__(self, d_model, heads, kv_heads, d_k, d_v, *, bias, out_bias, causal,
                 cross=False, fused=False, q_norm=None, k_norm=None, norm_over="head",
                 rotary=None, scale=None, window=None, alibi=False, gate=False, sinks=False,
                 inner_attention=None, dropout=0.0):
        super().__init__()
        self.heads, self.kv_heads, self.causal, self.cross = heads, kv_heads, causal, cross
        self.d_k, self.gate = d_k, gate
        # W^Q (and W^G), W^K, W^V and W^O (§3.2.2); fused, the first three as rows of one matrix
        self.sizes = [heads * (d_k + d_v if gate else d_k), kv_heads * d_k, kv_heads * d_v]
        if fused:
            self.qkv_proj = nn.Linear(d_model, sum(self.sizes), bias=bias)
        else:
            self.q_proj = nn.Linear(d_model, self.sizes[0], bias=bias)
            self.k_proj = nn.Linear(d_model, self.sizes[1], bias=bias)
            self.v_proj = nn.Linear(d_model, self.sizes[2], bias=bias)
        self.o_proj = nn.Linear(heads * d_v, d_model, bias=out_bias)
        self.fused = fused
        self.init_projections()
        self.rotary = rotary
        self.q_norm = q_norm if q_norm is not None else nn.Identity()
        self.k_norm = k_norm if k_norm is not None else nn.Identity()
        self.norm_over = norm_over
        self.scale, self.window, self.dropout = scale, window, dropout
        self.sinks = nn.Parameter(torch.zeros(heads)) if sinks else None
        slopes = self.alibi_slopes(heads) if alibi else None
        self.register_buffer("slopes", slopes, persistent=False)  # [h]
        self.inner_attention = inner_attention

    @torch.no_grad()
    def reset_parameters(self):
        self.init_projections()
        if self.sinks is not None:
            nn.init.zeros_(self.sinks)
        if self.slopes is not None:
            self.slopes.copy_(self.alibi_slopes(self.heads))

    def init_projections(self):
        """Xavier-uniform W^Q, W^K, W^V and W^O (over nn.Linear's own; fused, each its rows),
        zero biases."""
        if self.fused:
            projections, weights = [self.qkv_proj], list(self.qkv_proj.weight.split(self.sizes))
        else:
            projections = [self.q_proj, self.k_proj, self.v_proj]
            weights = [projection.weight for projection in projections]
        for weight in weights + [self.o_proj.weight]:
            nn.init.xavier_uniform_(weight)
        for projection in projections + [self.o_proj]:
            if projection.bias is not None:
                nn.init.zeros_(projection.bias)

    def forward(self, query, key, value, padding_mask=None, cache=None, position_bias=None,
                position_embeddings=None, attention_mask=None):
        q, k, v, gate = self.heads_of(query, key, value, cache, position_embeddings)
        mask, is_causal = self.mask(q, k, padding_mask, cache, position_bias, attention_mask)
        out = self.attend(q, k, v, mask, is_causal)  # [B, h, Tq, d_v]
        return self.o_proj(self.gated(out.transpose(1, 2).flatten(2), gate))

    def heads_of(self, query, key, value, cache=None, angles=None):
        """Queries [B, h, Tq, d_k] normalized, turned by `angles` (rotary's, of the new
        positions; None: those of its own embedding, if one) and scaled; keys [B, kv_h, Tk, d_k]
        and values [..., d_v] as the cache holds them; the gate x W^G [B, Tq, h * d_v] or None."""
        if angles is None and self.rotary is not None:
            angles = self.rotary(query, cache)
        if self.fused:  # one product for the three; self-attention only (the compiler checks)
            q, k, v = self.qkv_proj(query).split(self.sizes, dim=-1)
            q, gate = self.query_heads(q)
            k, v = self.cached(*self.key_value_heads(k, v, angles), cache)
        else:
            q, gate = self.query_heads(self.q_proj(query))
            k, v = self.keys_values(key, value, cache, angles)
        return self.queries(q, angles), k, v, gate

    def query_heads(self, q):
        """x W^Q [B, Tq, h * d_k] as heads [B, h, Tq, d_k]; with a gate (each head's queries, then
        its gate's), also the gate [B, Tq, h * d_v] (else None)."""
        heads = q.unflatten(-1, (self.heads, -1))
        if not self.gate:
            return heads.transpose(1, 2), None
        q, gate = heads.split([self.d_k, heads.size(-1) - self.d_k], dim=-1)
        return q.transpose(1, 2), gate.flatten(-2)

    def queries(self, q, angles=None):
        """q [B, h, Tq, d_k] normalized, turned and scaled (a scale of its own: q times
        scale * sqrt(d_k), which the attention's 1/sqrt(d_k) cancels)."""
        q = self.turned(self.normalized(q, self.q_norm), angles)
        return q if self.scale is None else q * (self.scale * q.size(-1) ** 0.5)

    def keys_values(self, key, value, cache, angles=None):
        if not self.cross:
            return self.cached(*self.projected(key, value, angles), cache)
        kept = cache.memory.get(self) if cache is not None else None
        if kept is None or kept[0] is not key or kept[1] is not value:
            # laid out head by head once: every step's product reads them whole
            kept = (key, value, *(t.contiguous() for t in self.projected(key, value)))
            if cache is not None:
                cache.memory[self] = kept
        return kept[2], kept[3]

    def projected(self, key, value, angles=None):
        return self.key_value_heads(self.k_proj(key), self.v_proj(value), angles)

    def key_value_heads(self, k, v, angles=None):  # x W^K, x W^V as heads; keys turned
        k = k.unflatten(-1, (self.kv_heads, -1)).transpose(1, 2)
        v = v.unflatten(-1, (self.kv_heads, -1)).transpose(1, 2)
        return self.turned(self.normalized(k, self.k_norm), angles), v

    def cached(self, k, v, cache):  # this step's keys and values after those the cache holds
        return (k, v) if cache is None else cache.append(self, k, v, window=self.window)

    def normalized(self, x, norm):  # x [B, h, T, d]
        if self.norm_over == "head":
            return norm(x)
        whole = norm(x.transpose(1, 2).flatten(2))  # [B, T, h * d]
        return whole.unflatten(-1, x.shape[1::2]).transpose(1, 2)

    @staticmethod
    def turned(x, angles):
        """x [B, h, T, d] turned by rotary `angles` [B, T, 2r] (their cos, then their sin), or as
        it is where None: each feature pair (i, i + r/2) of the first r features by its angle, in
        float32; the other d - r pass unchanged (a partial rotation: GPT-NeoX, Phi-3)."""
        if angles is None:
            return x
        cos, sin = angles[:, None].chunk(2, dim=-1)  # [B, 1, T, r]: all heads'
        r = cos.size(-1)
        part = x if r == x.size(-1) else x[..., :r]
        x1, x2 = part.float().chunk(2, dim=-1)
        quarter = torch.cat([-x2, x1], dim=-1)  # each pair (x1, x2) a quarter turn on
        turned = (part.float() * cos + quarter * sin).to(x.dtype)
        return turned if r == x.size(-1) else torch.cat([turned, x[..., r:]], dim=-1)

    def gated(self, out, gate):  # the heads' outputs [B, Tq, h*d_v] as W^O reads them
        return out if gate is None else out * torch.sigmoid(gate)

    # A decoding step of this many rows (batch x heads) or more, one query each, is computed as
    # two products and a softmax on the CPU: 1.4-1.7x SDPA's time at 1,024 rows (beam search),
    # while SDPA is faster below 256 (bench/decode.py; docs/runtime.md).
    ONE_QUERY_ROWS = 256

    def attend(self, q, k, v, mask, is_causal):
        if self.inner_attention is not None:
            return self.inner_attention(q, k, v, mask, self.sinks)
        if self.one_query_step(q, is_causal):
            scores = q @ k.transpose(-1, -2) * q.size(-1) ** -0.5  # [B, h, 1, Tk]
            if mask is not None:
                scores = scores + mask if mask.is_floating_point() else \
                    scores.masked_fill(~mask, float("-inf"))
            return scores.softmax(dim=-1) @ v
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                              dropout_p=self.dropout if self.training else 0.0,
                                              enable_gqa=self.kv_heads != self.heads)

    def one_query_step(self, q, is_causal):
        """Whether to compute the weights written out: one query a row, many rows, on the CPU, in
        inference, keys and values a head each. Never while torch.compile or torch.export traces
        (which fuse SDPA's own), and asked first: a size compared there would become a guard."""
        if torch.compiler.is_compiling() or torch.compiler.is_exporting():
            return False
        return q.size(2) == 1 and not is_causal and not self.training and q.device.type == "cpu" \
            and self.kv_heads == self.heads and q.size(0) * q.size(1) >= self.ONE_QUERY_ROWS

    def mask(self, q, k, padding_mask, cache, position_bias=None, attention_mask=None):
        """The mask the weights take (True: attend; or an additive bias: ALiBi's, or the
        `position_bias` given, [1, h, Tq, Tk]), and whether SDPA's own causal mask serves instead:
        from static facts only (torch.compile cannot branch on a symbolic size). The keys each
        query may see are `attention_mask`'s where a stack made it for attentions of this one's
        causality and window, else this attention's own."""
        mask = None if padding_mask is None else ~padding_mask[:, None, None, :]  # [B, 1, 1, Tk]
        if attention_mask is not None:
            mask = attention_mask if mask is None else mask & attention_mask
            return self.biased(q, k, mask, position_bias), False
        # what a padded batch's rows or packed documents may see: [B, 1, Tq, Tk]
        kept = None if cache is None or self.cross else cache.kept_keys(self.window, q.size(2))
        if kept is not None:
            mask = kept if mask is None else mask & kept
        if self.causal and not (cache is not None and q.size(2) == 1):  # a step sees all cached
            if cache is None and mask is None and self.window is None and self.slopes is None \
                    and self.inner_attention is None and position_bias is None:
                return None, True
            visible = self.visible(q.size(2), k.size(2), q.device)
            mask = visible if mask is None else mask & visible
        elif not self.causal and self.window is not None:    # a band around each query
            visible = self.visible(q.size(2), k.size(2), q.device)
            mask = visible if mask is None else mask & visible
        return self.biased(q, k, mask, position_bias), False

    def biased(self, q, k, mask, position_bias):
        """`mask` as the weights take it: as it is, or as the additive bias it masks (the
        `position_bias` given, or ALiBi's)."""
        if position_bias is not None:
            bias = position_bias.to(q.dtype)
            return bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        if self.slopes is None:
            return mask
        query_position = torch.arange(k.size(2) - q.size(2), k.size(2), device=q.device)
        distance = (query_position[:, None] - torch.arange(k.size(2), device=q.device)).abs()
        bias = (-self.slopes[:, None, None] * distance).to(q.dtype)  # [h, Tq, Tk]
        return bias if mask is None else bias.masked_fill(~mask, float("-inf"))

    # The masks `visible` made last, by (queries, keys, window, causal, device, inference
    # mode): every layer of a forward asks for the same one, made once (not while torch.compile
    # traces, and none of more than MASK_KEPT_ELEMENTS: a long context's is made anew, not held).
    masks: dict = {}
    MASKS_KEPT, MASK_KEPT_ELEMENTS = 4, 2 ** 24

    def visible(self, queries, keys, device):
        """[Tq, Tk]: query i, at position Tk - Tq + i, sees the keys up to it (§3.2.3), and,
        with a sliding window, none before its last `window`; not causal, the keys fewer than
        `window` positions away on either side (ModernBERT's local layers). Not to be written."""
        if torch.compiler.is_compiling() or torch.compiler.is_exporting() \
                or queries * keys > self.MASK_KEPT_ELEMENTS:
            return self.band(queries, keys, device)
        key = (queries, keys, self.window, self.causal, str(device),
               torch.is_inference_mode_enabled())
        mask = Attention.masks.get(key)
        if mask is None:
            mask = Attention.masks[key] = self.band(queries, keys, device)
            while len(Attention.masks) > self.MASKS_KEPT:
                del Attention.masks[next(iter(Attention.masks))]
        return mask

    def band(self, queries, keys, device):
        """The mask `visible` returns, made anew."""
        return AttentionMask.band(queries, keys, self.causal, self.window, device)

    @staticmethod
    def alibi_slopes(heads):
        """ALiBi's slopes: 2^(-8/n), 2^(-16/n), ... for n a power of two; for other head counts,
        those of the power of two below, then every other slope of the one above."""
        below = 2 ** math.floor(math.log2(heads))
        slopes = [2 ** (-8 * (i + 1) / below) for i in range(below)]
        above = [2 ** (-8 * (i + 1) / (2 * below)) for i in range(0, 2 * below, 2)]
        return torch.tensor(slopes + above[: heads - below])


class AttentionMask(nn.Module):
    """Which keys each query of a forward may see, made once by a stack for all its attentions
    of one causality and window (as transformers' models make their causal masks and pass them to
    every layer): causality, a sliding `window`, and what the cache says of the batch: not a
    padded row's padding, none of another packed document. forward(x [B, T, d], cache) ->
    [B or 1, 1, T, Tk] booleans (True: attend), or None where every key may be seen but those
    causality hides, as an attention's own rule says: SDPA's causal mask for a whole sequence,
    and every key cached for one new position. The positions of the keys are those the cache
    will hand the attentions of that window (`key_positions`): a sliding window's ring, in its
    order."""

    def __init__(self, causal=True, window=None):
        super().__init__()
        self.causal, self.window = causal, window

    @staticmethod
    def sees(queries, keys, causal, window):
        """[Tq, Tk]: whether the query at each of the positions `queries` [Tq] sees the key at
        each of the positions `keys` [Tk]: causal, those up to it (§3.2.3), and with a sliding
        `window`, of its last `window` positions; not causal, those fewer than `window` positions
        away on either side (ModernBERT's local layers), or all."""
        distance = queries[:, None] - keys[None, :]
        if causal:
            return distance >= 0 if window is None else (distance >= 0) & (distance < window)
        if window is None:
            return torch.ones_like(distance, dtype=torch.bool)
        return distance.abs() < window

    @staticmethod
    def band(queries, keys, causal, window, device):
        """`sees` of the last `queries` of `keys` positions over all of them: [Tq, Tk]."""
        at = torch.arange(keys - queries, keys, device=device)
        return AttentionMask.sees(at, torch.arange(keys, device=device), causal, window)

    def forward(self, x, cache=None):
        new = x.size(1)
        kept = cache.kept_keys(self.window, new) if cache is not None else None  # [B, 1, T, Tk]
        if kept is None and (self.window is None and (cache is None or not self.causal)
                             or self.causal and cache is not None and new == 1):
            return None
        start = cache.length if cache is not None else 0
        keys = cache.key_positions(self.window, new, x.device) if cache is not None else \
            torch.arange(new, device=x.device)
        visible = self.sees(torch.arange(start, start + new, device=x.device), keys, self.causal,
                            self.window)[None, None]
        return visible if kept is None else kept & visible


class WrittenOutAttention(nn.Module):
    """The heads' outputs [B, h, Tq, d_v] with the weights written out as a [B, h, Tq, Tk]
    matrix, for options SDPA cannot state: soft-capped scores (Gemma 2) and sinks (gpt-oss);
    dropout on the weights while training."""

    def __init__(self, softcap=None, dropout=0.0):
        super().__init__()
        self.softcap, self.dropout = softcap, dropout

    def forward(self, q, k, v, mask, sinks=None):
        weights = F.dropout(self.weights(q, k, mask, sinks), self.dropout, self.training)
        return (weights.unflatten(1, (k.size(1), -1)) @ v.unsqueeze(2)).flatten(1, 2)

    def weights(self, q, k, mask, sinks=None):
        """softmax(Q K^T / sqrt(d_k)), soft-capped, masked (True: attend; or an additive bias),
        the sinks' share dropped: [B, h, Tq, Tk]. Query heads share their key head without
        copying it (grouped as [B, kv_h, h / kv_h, ...])."""
        grouped = q.unflatten(1, (k.size(1), -1))  # [B, kv_h, g, Tq, d_k]
        scores = (grouped @ k.unsqueeze(2).transpose(-2, -1)).flatten(1, 2)  # [B, h, Tq, Tk]
        scores = scores * q.size(-1) ** -0.5
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        if mask is not None and mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        elif mask is not None:
            scores = scores + mask
        if sinks is None:
            return scores.softmax(dim=-1)
        sinks = sinks.to(scores.dtype)[None, :, None, None]
        sinks = sinks.expand(scores.size(0), -1, scores.size(2), 1)
        return torch.cat([scores, sinks], dim=-1).softmax(dim=-1)[..., :-1]
