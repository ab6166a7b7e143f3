"""Modules that generated models use. Their source is copied into every generated file, so a
compiled model depends on torch alone; they are also imported from here by the tests."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class DecoderCache:
    """What the decoder keeps between steps when it decodes one token at a time.

    Self-attention keys and values are written in place into buffers allocated once per module,
    [rows, heads, capacity, d] (batch-first, so `reorder` can follow beam search's choice of rows); the
    capacity doubles when a decode outgrows it, so a step neither concatenates nor allocates.
    `reorder(index)` gathers the cached positions of the rows into a second buffer of the same size and
    swaps the two. Keys and values of the encoder memory are computed once per memory tensor: pass the
    same tensor while the batch holds the same sentences (the beams of a sentence share its memory rows),
    and a new one when sentences leave the batch.
    """

    def __init__(self, capacity=64):
        self.length = 0  # target positions already decoded
        self.capacity = capacity  # positions each buffer holds at first
        self.rows = None  # rows in use (the batch), once something is cached
        self.tensors = {}  # self-attention module -> [keys, values, spare keys, spare values, positions]
        self.memory = {}  # encoder-decoder attention module -> (key input, value input, keys, values)

    def past(self, module):
        """Positions `module` has cached: where its next queries and keys start."""
        entry = self.tensors.get(module)
        return entry[4] if entry is not None else 0

    def append(self, module, k, v):
        """Writes k, v [B, h, T, d] after what `module` has cached; returns all its keys and values."""
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

    def reorder(self, index):
        """Row i becomes row index[i] (rows may repeat, and drop out)."""
        for entry in self.tensors.values():
            for buffer, spare in ((0, 2), (1, 3)):
                if entry[spare].size(0) < index.numel():  # more rows than ever: a larger spare, once
                    entry[spare] = entry[buffer].new_empty(index.numel(), *entry[buffer].shape[1:])
                filled = entry[4]  # only the positions cached so far move
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
        inverse_frequency = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
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


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
    (§3.2.2), with Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (§3.2.1).

    kv_cache says what a DecoderCache keeps: "append" (self-attention: keys and values grow one
    step at a time) or "static" (attention over the encoder output: computed once). self_attention:
    the keys are the queries, so without a cache both have the same positions.

    kv_heads < heads: grouped-query attention, each key/value head serving heads / kv_heads query heads.
    rotary: queries and keys rotated by their positions (RoPE, the two-halves layout); alibi: scores
    biased by -slope * distance. Both count positions from the cache's keys when decoding.
    """

    def __init__(self, d_model, heads, d_k, d_v, kdim=None, vdim=None, causal=False, dropout=0.0,
                 bias=True, kv_heads=None, rotary=False, rotary_base=10000.0, alibi=False, kv_cache="none",
                 self_attention=False):
        super().__init__()
        self.heads, self.kv_heads, self.d_k, self.d_v = heads, kv_heads or heads, d_k, d_v
        self.causal, self.dropout, self.kv_cache = causal, dropout, kv_cache
        self.self_attention, self.rotary, self.alibi = self_attention, rotary, alibi
        self.q_proj = nn.Linear(d_model, heads * d_k, bias=bias)
        self.k_proj = nn.Linear(kdim or d_model, self.kv_heads * d_k, bias=bias)
        self.v_proj = nn.Linear(vdim or d_model, self.kv_heads * d_v, bias=bias)
        self.out_proj = nn.Linear(heads * d_v, d_model, bias=bias)
        for projection in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(projection.weight)
            if bias:
                nn.init.zeros_(projection.bias)
        if rotary:  # derived, so not in checkpoints
            inverse_frequency = rotary_base ** (-torch.arange(0, d_k, 2, dtype=torch.float32) / d_k)
            self.register_buffer("inverse_frequency", inverse_frequency, persistent=False)  # [d_k / 2]
        if alibi:
            self.register_buffer("slopes", self.alibi_slopes(heads), persistent=False)  # [h]

    @staticmethod
    def rotate_half(x):
        """[x1, x2] -> [-x2, x1] over the last dimension's two halves: the rotation of rotary embeddings."""
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([-x2, x1], dim=-1)

    @staticmethod
    def alibi_slopes(heads):
        """ALiBi's per-head slopes (Press et al., 2022): 2^(-8/n), 2^(-16/n), ... for n a power of two; for
        other head counts, those of the power of two below, then every other slope of the one above."""
        below = 2 ** math.floor(math.log2(heads))
        slopes = [2 ** (-8 * (i + 1) / below) for i in range(below)]
        slopes += [2 ** (-8 * (i + 1) / (2 * below)) for i in range(0, 2 * below, 2)][: heads - below]
        return torch.tensor(slopes)

    def _split(self, x, heads, d):
        return x.unflatten(-1, (heads, d)).transpose(1, 2)  # [B, T, h*d] -> [B, h, T, d]

    def _rotate(self, x, start):
        """RoPE: feature pairs (i, i + d/2) of position p rotated by p * base^(-2i/d), in float32."""
        position = torch.arange(start, start + x.size(2), device=x.device, dtype=torch.float32)
        angles = torch.outer(position, self.inverse_frequency).repeat(1, 2)  # [T, d_k]
        rotated = x.float() * angles.cos() + self.rotate_half(x.float()) * angles.sin()
        return rotated.to(x.dtype)

    def _keys_values(self, key, value, cache, start):
        if cache is not None and self.kv_cache == "static":
            kept = cache.memory.get(self)
            if kept is not None and kept[0] is key and kept[1] is value:
                return kept[2], kept[3]
        k = self._split(self.k_proj(key), self.kv_heads, self.d_k)
        v = self._split(self.v_proj(value), self.kv_heads, self.d_v)
        if self.rotary:
            k = self._rotate(k, start)  # cached keys keep their rotation
        if cache is not None and self.kv_cache == "append":
            k, v = cache.append(self, k, v)
        elif cache is not None and self.kv_cache == "static":
            cache.memory[self] = (key, value, k, v)
        return k, v

    def _prepare(self, query, key, value, padding_mask, cache):
        """Heads of queries, keys and values, and the mask SDPA takes (bool: True where attending is
        allowed; float: a bias), or is_causal where SDPA's own causal mask serves."""
        # Positions already in the cache: where this call's queries (and new keys) start.
        start = cache.past(self) if cache is not None else 0
        q = self._split(self.q_proj(query), self.heads, self.d_k)  # [B, h, Tq, d_k]
        if self.rotary:
            q = self._rotate(q, start)
        k, v = self._keys_values(key, value, cache, start)  # [B, kv_h, Tk, d_k], [B, kv_h, Tk, d_v]
        mask = None
        if padding_mask is not None:
            mask = ~padding_mask[:, None, None, :]  # [B, 1, 1, Tk]: True where attending is allowed
        # Decided from static facts only, never from sizes (torch.compile cannot branch on a symbolic
        # size): self-attention over the whole sequence uses SDPA's own causal mask.
        is_causal = self.causal and self.self_attention and cache is None and mask is None and not self.alibi
        # One new query (a decoding step) is the last position: it sees every key, so no mask is built.
        if self.causal and not is_causal and not (cache is not None and q.size(2) == 1):
            # Query i sits at absolute position (Tk - Tq + i) and sees keys up to it (§3.2.3).
            past = k.size(2) - q.size(2)
            allowed = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril(past)
            mask = allowed if mask is None else mask & allowed
        if self.alibi:
            query_position = torch.arange(k.size(2) - q.size(2), k.size(2), device=q.device)
            distance = (query_position[:, None] - torch.arange(k.size(2), device=q.device)).abs()  # [Tq, Tk]
            bias = (-self.slopes[:, None, None] * distance).to(q.dtype)  # [h, Tq, Tk]
            mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        return q, k, v, mask, is_causal

    def forward(self, query, key, value, padding_mask=None, cache=None):
        q, k, v, mask, is_causal = self._prepare(query, key, value, padding_mask, cache)
        dropout = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal,
                                             enable_gqa=self.kv_heads != self.heads)
        return self.out_proj(out.transpose(1, 2).flatten(2))  # [B, h, Tq, d_v] -> [B, Tq, h*d_v]

    def weights(self, query, key, value, padding_mask=None):
        """The attention weights forward computes, softmax(Q K^T / sqrt(d_k) + bias) per head, masked
        as it masks (for diagrams; without dropout or a cache): [B, h, Tq, Tk]."""
        q, k, _, mask, is_causal = self._prepare(query, key, value, padding_mask, None)
        k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)  # each query head's key head
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if is_causal:
            mask = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril()
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        return scores.softmax(dim=-1)
