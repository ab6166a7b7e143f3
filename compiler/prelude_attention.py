"""Attention modules that generated models use (their source is copied into every generated file
that uses them, so a compiled model depends on torch alone): multi-head attention with the newer
family's options (the rotary position embeddings it may hold are prelude_rotary.py's). A statement
tagged `# with: ...` serves those features only (compiler/prelude.py)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(QW_i^Q, KW_i^K, VW_i^V),
    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (§3.2). A decoding cache (xspec's
    DecoderCache) keeps keys and values a step at a time (kv_cache "append") or the encoder
    output's once ("static")."""

    def __init__(self, d_model, heads, d_k, d_v,
                 kdim=None, vdim=None, bias=True, kv_heads=None, out_bias=None,  # with: projection_options
                 rotary=None,  # with: rotary
                 alibi=False,  # with: alibi, softcap, sinks, window
                 q_norm=None, k_norm=None,  # with: qk_norm
                 window=None, softcap=None, sinks=False,  # with: softcap, sinks, window
                 scale=None,  # with: scale, softcap, sinks, window
                 causal=False, dropout=0.0, kv_cache="none", self_attention=False):
        super().__init__()
        self.heads, self.kv_heads, self.d_k, self.d_v = heads, heads, d_k, d_v
        self.kv_heads = kv_heads or heads  # with: projection_options
        self.causal, self.dropout, self.kv_cache = causal, dropout, kv_cache
        self.self_attention = self_attention
        # W^Q, W^K, W^V and W^O (§3.2.2)
        self.q_proj = nn.Linear(d_model, heads * d_k)  # without: projection_options
        self.k_proj = nn.Linear(d_model, heads * d_k)  # without: projection_options
        self.v_proj = nn.Linear(d_model, heads * d_v)  # without: projection_options
        self.out_proj = nn.Linear(heads * d_v, d_model)  # without: projection_options
        # W^Q, W^K, W^V and W^O (§3.2.2); keys and values of widths and heads of their own
        self.q_proj = nn.Linear(d_model, heads * d_k, bias=bias)  # with: projection_options
        self.k_proj = nn.Linear(kdim or d_model, self.kv_heads * d_k, bias=bias)  # with: projection_options
        self.v_proj = nn.Linear(vdim or d_model, self.kv_heads * d_v, bias=bias)  # with: projection_options
        out_bias = bias if out_bias is None else out_bias  # with: projection_options
        self.out_proj = nn.Linear(heads * d_v, d_model, bias=out_bias)  # with: projection_options
        for projection in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(projection.weight)
            if projection.bias is not None:
                nn.init.zeros_(projection.bias)
        self.rotary = rotary  # with: rotary
        self.q_norm, self.k_norm = q_norm, k_norm  # with: qk_norm
        if q_norm is not None:  # with: qk_norm
            # A norm of d_k features normalizes each head; one of the projection's, all of it at
            # once (OLMo 2).
            self.norm_per_head = q_norm.weight.numel() == d_k and heads > 1
        self.sinks = nn.Parameter(torch.zeros(heads)) if sinks else None  # with: softcap, sinks, window
        self.window, self.softcap = window, softcap  # with: softcap, sinks, window
        self.scale = scale  # with: scale, softcap, sinks, window
        self.alibi = alibi  # with: alibi, softcap, sinks, window
        if alibi:  # with: alibi
            self.register_buffer("slopes", self.alibi_slopes(heads), persistent=False)  # [h]

    @staticmethod
    def alibi_slopes(heads):  # with: alibi
        """ALiBi's per-head slopes (Press et al., 2022): 2^(-8/n), 2^(-16/n), ... for n a power of
        two; for other head counts, those of the power of two below, then every other slope of the
        one above."""
        below = 2 ** math.floor(math.log2(heads))
        slopes = [2 ** (-8 * (i + 1) / below) for i in range(below)]
        above = [2 ** (-8 * (i + 1) / (2 * below)) for i in range(0, 2 * below, 2)]
        slopes += above[: heads - below]
        return torch.tensor(slopes)

    def _project(self, x, projection, heads, d):
        """x projected and split into heads: [B, T, h*d] -> [B, h, T, d]."""
        return projection(x).unflatten(-1, (heads, d)).transpose(1, 2)

    def _normalized(self, x, norm):  # with: qk_norm
        """QK-norm of heads [B, h, T, d]: each head's features, or all the projection's at once."""
        if self.norm_per_head:
            return norm(x)
        return norm(x.transpose(1, 2).flatten(2)).unflatten(-1, x.shape[1::2]).transpose(1, 2)

    def _keys_values(self, key, value, cache):
        if cache is not None and self.kv_cache == "static":  # with: cross_cache
            kept = cache.memory.get(self)
            if kept is not None and kept[0] is key and kept[1] is value:
                return kept[2], kept[3]
        k = self._project(key, self.k_proj, self.kv_heads, self.d_k)
        v = self._project(value, self.v_proj, self.kv_heads, self.d_v)
        if self.k_norm is not None:  # with: qk_norm
            k = self._normalized(k, self.k_norm)
        if self.rotary is not None:  # with: rotary
            k = self.rotary(k, cache.length if cache is not None else 0)  # cached: kept turned
        if cache is not None and self.kv_cache == "append":  # with: cache
            k, v = cache.append(self, k, v)
        if cache is not None and self.kv_cache == "static":  # with: cross_cache
            cache.memory[self] = (key, value, k, v)
        return k, v

    def _prepare(self, query, key, value, padding_mask, cache):
        """Heads of queries, keys and values, the mask SDPA takes, and whether SDPA's own causal
        mask serves instead."""
        q = self._project(query, self.q_proj, self.heads, self.d_k)  # [B, h, Tq, d_k]
        if self.q_norm is not None:  # with: qk_norm
            q = self._normalized(q, self.q_norm)
        if self.rotary is not None:  # with: rotary
            q = self.rotary(q, cache.length if cache is not None else 0)
        k, v = self._keys_values(key, value, cache)  # [B, kv_h, Tk, d_k], [..., d_v]
        mask = None if padding_mask is None else ~padding_mask[:, None, None, :]  # [B, 1, 1, Tk]
        # From static facts only (torch.compile cannot branch on a symbolic size).
        is_causal = self.causal and self.self_attention and cache is None and mask is None
        if self.alibi:  # with: alibi
            is_causal = False  # its bias is built here
        if self.window is not None:  # with: window
            is_causal = False  # its mask is built here
        # One new query (a decoding step) sees every key the cache returns: no mask.
        if self.causal and not is_causal and not (cache is not None and q.size(2) == 1):  # with: causal
            # Query i sits at absolute position (Tk - Tq + i) and sees keys up to it (§3.2.3).
            past = k.size(2) - q.size(2)
            ones = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device)
            allowed = ones.tril(past)
            if self.window is not None:  # with: window
                allowed = allowed & ones.triu(past - self.window + 1)  # the last `window` keys
            mask = allowed if mask is None else mask & allowed
        if self.alibi:  # with: alibi
            query_position = torch.arange(k.size(2) - q.size(2), k.size(2), device=q.device)
            key_position = torch.arange(k.size(2), device=q.device)
            distance = (query_position[:, None] - key_position).abs()  # [Tq, Tk]
            bias = (-self.slopes[:, None, None] * distance).to(q.dtype)  # [h, Tq, Tk]
            mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        return q, k, v, mask, is_causal

    def forward(self, query, key, value, padding_mask=None, cache=None):
        q, k, v, mask, is_causal = self._prepare(query, key, value, padding_mask, cache)
        path = self._path(q, cache)  # with: softcap, sinks, window
        if path != "sdpa":  # with: softcap, sinks, window
            out = self._unfused(path, q, k, v, mask, is_causal, padding_mask)
            return self.out_proj(out.transpose(1, 2).flatten(2))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                             dropout_p=self.dropout if self.training else 0.0,
                                             scale=self.scale,  # with: scale, softcap, sinks, window
                                             enable_gqa=self.kv_heads != self.heads,  # with: projection_options
                                             )
        return self.out_proj(out.transpose(1, 2).flatten(2))  # [B, h, Tq, d_v] -> [B, Tq, h*d_v]

    # Scores are computed by one of three paths (`kernel`): "sdpa", F.scaled_dot_product_attention,
    # for everything it can state (masks included); otherwise (soft-capping, sinks) "flex",
    # FlexAttention with a score_mod and a block mask, compiled, on CUDA, or "plain", the scores
    # written out, on other devices and for decoding steps. A window alone stays on SDPA's masks
    # off CUDA, and goes to FlexAttention's block-sparse masks on it. `kernel = "auto"` picks so;
    # "sdpa", "plain" or "flex" force one, and "flex_eager" runs FlexAttention uncompiled (its
    # reference implementation, for tests off CUDA).
    kernel = "auto"  # with: softcap, sinks, window

    def _path(self, q, cache):  # with: softcap, sinks, window
        """Which computation of the scores runs: from static facts (device, options), never
        sizes."""
        if self.kernel != "auto":
            return self.kernel
        needs_scores = self.softcap is not None or self.sinks is not None
        if q.is_cuda and cache is None and (needs_scores or self.window is not None) \
                and not self.alibi and not (self.training and self.dropout):
            return "flex"  # fused and block-sparse where it runs compiled
        return "plain" if needs_scores else "sdpa"

    def _unfused(self, path, q, k, v, mask, is_causal, padding_mask):  # with: softcap, sinks, window
        """The heads' outputs, [B, h, Tq, d_v], by the plain path or FlexAttention."""
        if path in ("flex", "flex_eager"):
            return self._flex(q, k, v, padding_mask, compiled=path == "flex")
        weights = F.dropout(self._probabilities(q, k, mask, is_causal), p=self.dropout,
                            training=self.training)
        return (weights.unflatten(1, (self.kv_heads, -1)) @ v.unsqueeze(2)).flatten(1, 2)

    def _probabilities(self, q, k, mask, is_causal):  # with: softcap, sinks, window, diagrams
        """softmax(cap(Q K^T * scale) + bias), masked, the sinks in its denominator:
        [B, h, Tq, Tk]. Query heads share their key head without copying it (grouped as
        [B, kv_h, h / kv_h, ...])."""
        # Diagrams call this on any generated module, whose class leaves out the options its
        # spec does not use: absent, they are off.
        scale = getattr(self, "scale", None) or 1 / math.sqrt(self.d_k)
        softcap, sinks = getattr(self, "softcap", None), getattr(self, "sinks", None)
        grouped = q.unflatten(1, (self.kv_heads, -1))  # [B, kv_h, g, Tq, d_k]
        scores = (grouped @ k.unsqueeze(2).transpose(-2, -1)).flatten(1, 2) * scale  # [B,h,Tq,Tk]
        if softcap is not None:  # with: softcap
            scores = torch.tanh(scores / softcap) * softcap
        if is_causal:
            ones = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device)
            mask = ones.tril(k.size(2) - q.size(2))
        if mask is not None and mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        if mask is not None and mask.dtype != torch.bool:  # with: alibi
            scores = scores + mask
        if sinks is not None:  # with: sinks
            sinks = sinks.to(scores.dtype)[None, :, None, None]
            sinks = sinks.expand(scores.size(0), -1, scores.size(2), 1)
            # The sink's share is dropped after the softmax.
            return torch.cat([scores, sinks], dim=-1).softmax(dim=-1)[..., :-1]
        return scores.softmax(dim=-1)

    def _flex(self, q, k, v, padding_mask, compiled):  # with: softcap, sinks, window
        """FlexAttention: the soft cap as a score_mod, causality, the window and padding as a block
        mask (blocks no query sees are skipped), sinks from the log-sum-exp it returns: a row's
        weights shrink by Z / (Z + e^sink) = sigmoid(lse - sink)."""
        from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

        past, window = k.size(2) - q.size(2), self.window
        causal, softcap = self.causal, self.softcap

        def allowed(b, h, q_index, k_index):
            keep = k_index >= 0
            if causal:
                keep = keep & (k_index <= q_index + past)
            if window is not None:
                keep = keep & (q_index + past - k_index < window)
            if padding_mask is not None:
                keep = keep & ~padding_mask[b, k_index]
            return keep

        def capped(score, b, h, q_index, k_index):
            return torch.tanh(score / softcap) * softcap

        batch = q.size(0) if padding_mask is not None else None
        block_mask = create_block_mask(allowed, batch, None, q.size(2), k.size(2), device=q.device)
        attend = flex_attention
        if compiled and not torch.compiler.is_compiling():
            attend = self.compiled_flex()
        options = {"score_mod": capped if softcap is not None else None, "block_mask": block_mask,
                   "scale": self.scale, "enable_gqa": self.kv_heads != self.heads}
        if self.sinks is None:
            return attend(q, k, v, **options)
        out, aux = attend(q, k, v, **options, return_aux=AuxRequest(lse=True))
        shrink = torch.sigmoid(aux.lse - self.sinks[None, :, None].float())
        return out * shrink[..., None].to(out.dtype)

    @staticmethod
    def compiled_flex():  # with: softcap, sinks, window
        """flex_attention compiled once per process (outside torch.compile of the model, which
        fuses it itself)."""
        from torch.nn.attention.flex_attention import flex_attention

        if MultiHeadAttention.kernel_cache is None:
            MultiHeadAttention.kernel_cache = torch.compile(flex_attention)
        return MultiHeadAttention.kernel_cache

    kernel_cache = None  # with: softcap, sinks, window

    def weights(self, query, key, value, padding_mask=None):  # with: diagrams
        """The attention weights forward computes (softmax of the scaled, capped, biased scores,
        masked as forward masks them, sinks in the denominator) per head, for diagrams; without
        dropout or a cache: [B, h, Tq, Tk]. Generated files leave it out: `xspec viz` calls it from
        here on their modules (`MultiHeadAttention.weights(module, ...)`), whose attributes are
        this class's."""
        q, k, _, mask, is_causal = self._prepare(query, key, value, padding_mask, None)
        return MultiHeadAttention._probabilities(self, q, k, mask, is_causal)
