"""The latent attention op's entry in the op table: multi-head latent attention (MLA; DeepSeek-V2, Liu et
al., 2024, §2.1), as DeepSeek-V2, DeepSeek-V3 and Kimi K2 have it. Attributes carry the names of the
checkpoint configuration's quantities:

    latent_attention(x, heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                     q_lora_rank = 0, norm_eps = 1e-6, bias = false, scale = 1 / sqrt(d_k),
                     position_embeddings = rope)

Each head's query and key are qk_nope_head_dim features without positions and qk_rope_head_dim turned by
rotary positions: the angles a stack made once for its layers (`position_embeddings`, op_rotary.py's
rotary_embedding of qk_rope_head_dim features), or, without them, an embedding of the op's own of its
`rotary_*` settings (the form older specs have). Keys (their first part) and values come from one latent
of kv_lora_rank features per token, RMS-normalized; the key's rotary part is one per token, shared by the
heads. Queries come through their own latent of q_lora_rank features (normalized) or, with 0, straight from
x. The scores' scale is `scale`, or 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim). The attention is causal
self-attention; the decoding cache keeps, per position, the latent and the rotary key (kv_lora_rank +
qk_rope_head_dim numbers, not heads * (d_k + d_v)).

Everything about the op is here; xspec/nn/latent_attention.py has the module.
"""

from __future__ import annotations

import ast as pyast
from typing import Literal, Optional

from pydantic import Field

from .op_attention_mask import PORT, check_mask, check_reader
from .op_rotary import Settings, check_angles
from .op_rotary import embedding as rotary_embedding
from .op_rotary import scaling_problems as rotary_scaling_problems
from .opdef import Attrs, Family, Inferred, Input, OpDef, Shapes, Written, linear_params, size
from .python_code import binary, call, constant, variable
from .shapes import ShapeError, TensorType, concrete_last, require


class LatentAttentionAttrs(Attrs):
    heads: int = Field(gt=0)
    kv_lora_rank: int = Field(gt=0)  # the latent's features, from which keys and values are made
    qk_nope_head_dim: int = Field(gt=0)  # each head's query and key features without positions
    qk_rope_head_dim: int = Field(gt=0)  # ... and with rotary positions (the key's part shared by the heads)
    v_head_dim: int = Field(gt=0)
    q_lora_rank: int = Field(0, ge=0)  # the queries' latent; 0: queries straight from x (a checkpoint's null)
    norm_eps: float = Field(1e-6, gt=0)  # the latents' RMSNorm
    bias: bool = False  # the biases of the latents' down projections and of the output projection
    scale: Optional[float] = None  # the scores' scale; None: 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)
    # Its own rotary positions, as attention's (none where position_embeddings are passed): the base and the
    # frequency scaling a checkpoint declares.
    rotary_base: float = Field(10000.0, gt=1)
    rotary_scaling: Literal["default", "yarn"] = "default"
    rotary_factor: float = 1.0
    rotary_original_max_len: Optional[int] = None
    rotary_beta_fast: float = 32.0
    rotary_beta_slow: float = 1.0
    rotary_attention_factor: Optional[float] = None
    rotary_truncate: bool = True

    @property
    def causal(self) -> bool:
        """Latent attention is causal self-attention (reports and validation read it as attention's)."""
        return True

    @property
    def d_k(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def _shape(shapes: Shapes, a: LatentAttentionAttrs) -> tuple[TensorType, Inferred]:
    x = require(shapes["x"], "the input", min_rank=3)
    inferred: Inferred = {"d_model": concrete_last(x, "the input"), "self_attention": True}
    if PORT in shapes:
        check_mask(shapes[PORT], x, x)
    if "position_embeddings" in shapes:
        turned = check_angles(shapes["position_embeddings"], x, a.qk_rope_head_dim, "qk_rope_head_dim")
        if turned != a.qk_rope_head_dim:
            raise ShapeError(f"the position embeddings turn {turned} features, but latent attention turns "
                             f"qk_rope_head_dim = {a.qk_rope_head_dim}")
        if _own_rotary_set(a):
            raise ShapeError(f"position_embeddings and {', '.join(_own_rotary_set(a))}: the rotary settings belong "
                             "to the rotary_embedding that makes the position embeddings")
        inferred["turned"] = turned
    return x, inferred


def _own_rotary_set(a: LatentAttentionAttrs) -> list[str]:
    """The rotary settings given to the op itself (its own embedding's)."""
    return [name for name in a.model_fields_set if name.startswith("rotary_")]


def _rotary(a: LatentAttentionAttrs) -> Settings:
    return Settings.of(a, "rotary_", "qk_rope_head_dim")


def _check(a: LatentAttentionAttrs) -> list[tuple[str, str]]:
    problems = []
    if a.qk_rope_head_dim % 2:
        problems.append(("qk_rope_head_dim", f"rotary positions rotate pairs of features, so qk_rope_head_dim must "
                                             f"be even, got {a.qk_rope_head_dim}"))
    if a.scale is not None and a.scale <= 0:
        problems.append(("scale", f"scale = {a.scale}: the scores' scale must be positive"))
    return problems + rotary_scaling_problems(_rotary(a))


def _params(a: LatentAttentionAttrs, i: Inferred) -> dict[str, tuple[int, ...]]:
    d_model, queries = size(i, "d_model"), a.heads * a.d_k
    if not a.q_lora_rank:
        params = linear_params("q_proj.", d_model, queries, False)
    else:
        params = {**linear_params("q_a_proj.", d_model, a.q_lora_rank, a.bias),
                  "q_a_layernorm.weight": (a.q_lora_rank,), **linear_params("q_b_proj.", a.q_lora_rank, queries, False)}
    return {
        **params,
        **linear_params("kv_a_proj_with_mqa.", d_model, a.kv_lora_rank + a.qk_rope_head_dim, a.bias),
        "kv_a_layernorm.weight": (a.kv_lora_rank,),
        **linear_params("kv_b_proj.", a.kv_lora_rank, a.heads * (a.qk_nope_head_dim + a.v_head_dim), False),
        **linear_params("o_proj.", a.heads * a.v_head_dim, d_model, a.bias),
    }


def _flops(a: LatentAttentionAttrs, i: Inferred, n: int, n_in: dict[str, int]) -> dict[str, int]:
    """The queries (through their latent where one), the latent and rotary key, the latent's keys and
    values for every position, then §3.2.2's scores, weighted values and output projection."""
    d_model, queries = size(i, "d_model"), a.heads * a.d_k
    q = d_model * queries if not a.q_lora_rank else a.q_lora_rank * (d_model + queries)
    kv = (d_model * (a.kv_lora_rank + a.qk_rope_head_dim)
          + a.kv_lora_rank * a.heads * (a.qk_nope_head_dim + a.v_head_dim))
    return {
        "attention_qkv": 2 * n * (q + kv),
        "attention_scores": 2 * n * n * a.heads * a.d_k,
        "attention_values": 2 * n * n * a.heads * a.v_head_dim,
        "attention_out": 2 * n * a.heads * a.v_head_dim * d_model,
    }


def _saved(a: LatentAttentionAttrs, i: Inferred, n: int, n_in: dict[str, int]) -> int:
    """SDPA's Q, K, V, context and log-sum-exp per head, and the latents and rotary parts they are made of."""
    latents = a.kv_lora_rank + a.qk_rope_head_dim + a.q_lora_rank
    return n * (a.heads * (2 * a.d_k + 2 * a.v_head_dim + 1) + latents)


# --- lowering ----------------------------------------------------------------------------------


def _module(a: LatentAttentionAttrs, i: Inferred, w: Written) -> pyast.expr:
    """LatentAttention(d_model, heads, kv_lora_rank, nope, rope, v, q_rank=..., eps, bias, scale, and
    rotary=... where no angles are passed in): q_rank 0 for queries made directly."""
    d_model, heads = w.width("x"), w.attr("heads")
    nope, rope = w.attr("qk_nope_head_dim"), w.attr("qk_rope_head_dim")
    head_dim = binary(nope, pyast.Add(), rope)
    scale = w.attr("scale") if a.scale is not None else binary(head_dim, pyast.Pow(), constant(-0.5))
    own = {} if i.get("turned") else {"rotary": rotary_embedding(_rotary(a), w)}
    return call("LatentAttention", d_model, heads, w.attr("kv_lora_rank"), nope, rope, w.attr("v_head_dim"),
                q_rank=w.attr("q_lora_rank"), eps=w.attr("norm_eps"), bias=w.attr("bias"), scale=scale, **own)


def _call(target: str, inputs: dict[str, pyast.expr], attrs: Attrs, cache: bool) -> pyast.expr:
    named = {name: inputs[name] for name in ("position_embeddings", PORT) if name in inputs}
    return call(f"self.{target}", inputs["x"], **({"cache": variable("cache")} if cache else {}), **named)


def _details(a: LatentAttentionAttrs, i: Inferred) -> list[str]:
    queries = "queries direct" if not a.q_lora_rank else f"query latent {a.q_lora_rank}"
    return [f"h = {a.heads}, d_k = {a.qk_nope_head_dim} + {a.qk_rope_head_dim} rotary, d_v = {a.v_head_dim}",
            f"key/value latent {a.kv_lora_rank}, {queries}",
            f"cached per position: {a.kv_lora_rank + a.qk_rope_head_dim} numbers"]


LATENT_ATTENTION = OpDef(
    name="latent_attention",
    doc="multi-head latent attention: causal self-attention whose keys and values come from a small latent per "
        "token (DeepSeek-V2 §2.1)",
    family=Family.ATTENTION,
    inputs=(Input("x"), Input("position_embeddings", optional=True, keyword=True),
            Input(PORT, optional=True, keyword=True)),
    attrs=LatentAttentionAttrs, infer=_shape, params=_params, check=_check,
    reads=lambda a, producers: check_reader(True, None, producers),
    module=_module, call=_call, uses_cache=True,
    buffers=lambda a, i: {} if i.get("turned") else {"rotary.inverse_frequency": (a.qk_rope_head_dim // 2,)},
    title="Multi-Head Latent Attention", details=_details,
    facts=lambda a, i: {"heads": a.heads, "kv_heads": a.heads, "d_k": a.d_k, "d_v": a.v_head_dim,
                        "positions": "rotary", "kv_lora_rank": a.kv_lora_rank},
    flops=_flops, saved=_saved, cache=lambda a, i: ((1, a.kv_lora_rank, a.qk_rope_head_dim), None),
    output_weight="o_proj.weight",
)
