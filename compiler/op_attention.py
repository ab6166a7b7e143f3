"""The attention op's entry in the op table: multi-head scaled dot-product attention (§3.2) and the options
the newer Transformer family adds to it, each an attribute named after the checkpoint configuration's
quantity it holds (docs/language.md):

  kv_heads             grouped-query attention (num_key_value_heads)
  rotary, rotary_*     rotary positions: base (rope_theta), the fraction of each head rotated
                       (partial_rotary_factor), and the frequency scalings checkpoints declare (rope_type
                       linear, llama3, yarn, with their parameters)
  alibi                ALiBi's distance biases
  window               sliding-window attention (sliding_window)
  softcap              c * tanh(scores / c) before the mask (attn_logit_softcapping)
  scale                the scores' scale instead of 1/sqrt(d_k) (query_pre_attn_scalar ** -0.5)
  sinks                a learned logit per head that takes part in the softmax and is dropped after it
  qk_norm, qk_norm_*   RMSNorm of queries and keys before the rotation, per head or over the projection
  bias, out_bias       biases of the Q, K, V projections and of the output projection
  fused_qkv            W^Q, W^K and W^V as rows of one matrix, qkv_proj (Phi-3's checkpoints)

and, beside the query, key, value and padding mask, inputs given by name: `position_bias`, added to the
scores (T5's relative position bias, [1, heads, queries, keys]), `position_embeddings`, the rotary angles
a stack made once for its layers (op_rotary.py's rotary_embedding), which turn queries and keys in place of
an embedding of the attention's own, and `attention_mask`, the keys each query sees, which a stack made once
for its layers of the attention's causality and window (op_attention_mask.py), in place of the attention's own
rule.

Everything about the op is here: schema, rules between arguments, shape rule, learned tensors and buffers,
lowering (xspec/nn/attention.py has the module), FLOPs, saved activations, and what diagrams say.
"""

from __future__ import annotations

import ast as pyast
from typing import Literal, Optional

from pydantic import Field

from .op_attention_mask import PORT, check_mask, check_reader
from .op_rotary import RotaryScaling, Settings, check_angles
from .op_rotary import describe as describe_rotary
from .op_rotary import embedding as rotary_embedding
from .op_rotary import problems as rotary_problems
from .opdef import Attrs, Family, Inferred, Input, OpDef, Shapes, Written, linear_params, size
from .python_code import call, constant, product, variable
from .shapes import ShapeError, TensorType, concrete_last, require

QKNorm = Literal["none", "head", "projection"]


class AttentionAttrs(Attrs):
    heads: int = Field(gt=0)
    d_k: int = Field(gt=0)
    d_v: int = Field(gt=0)
    causal: bool = False
    dropout: float = Field(0.0, ge=0, lt=1)  # on attention weights; the paper's models use none
    bias: bool = True
    # Grouped-query attention (Ainslie et al., 2023): key/value heads, each shared by heads / kv_heads
    # query heads; None: one per query head (§3.2.2), 1: multi-query attention (Shazeer, 2019).
    kv_heads: Optional[int] = Field(None, gt=0)
    rotary: bool = False  # rotary position embeddings on queries and keys (Su et al., 2021)
    rotary_base: float = Field(10000.0, gt=1)
    alibi: bool = False  # linear biases by distance, one slope per head (Press et al., 2022)
    # The output projection's bias, where it differs from the Q, K, V projections' (Qwen2: none).
    out_bias: Optional[bool] = None
    scale: Optional[float] = None  # the scores' scale; None: 1 / sqrt(d_k) (§3.2.1)
    # sliding window: query i sees keys j <= i with i - j < window; not causal, keys with |i - j| < window
    window: Optional[int] = None
    softcap: Optional[float] = None  # scores soft-capped, c * tanh(s / c), before the mask (Gemma 2)
    sinks: bool = False  # a learned logit per head in the softmax's denominator (gpt-oss)
    output_gate: bool = False  # each head's output times sigmoid(x W^G) before W^O (Qwen3-Next)
    fused_qkv: bool = False  # W^Q, W^K and W^V as rows of one matrix, `qkv_proj`: one product (Phi-3)
    qk_norm: QKNorm = "none"  # RMSNorm of queries and keys: per head (Qwen3, Gemma 3) or projection (OLMo 2)
    qk_norm_eps: float = Field(1e-6, gt=0)
    qk_norm_offset: float = 0.0  # the norms' weight is offset + w (Gemma: 1 + w, w starting at 0)
    # Rotary variants: the fraction of each head's features rotated (the rest pass unchanged), and the
    # frequency scaling a checkpoint declares, with its parameters.
    rotary_fraction: float = 1.0
    rotary_scaling: RotaryScaling = "default"
    rotary_factor: float = 1.0
    rotary_original_max_len: Optional[int] = None  # the context length the checkpoint was trained at
    rotary_low_freq_factor: float = 1.0  # llama3
    rotary_high_freq_factor: float = 4.0  # llama3
    rotary_beta_fast: float = 32.0  # yarn
    rotary_beta_slow: float = 1.0  # yarn
    rotary_attention_factor: Optional[float] = None  # yarn: cos and sin scaled by it; None: 0.1 ln(factor) + 1
    rotary_truncate: bool = True  # yarn: the correction range rounded to whole features

    @property
    def key_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def has_out_bias(self) -> bool:
        return self.bias if self.out_bias is None else self.out_bias


def _shape(shapes: Shapes, a: AttentionAttrs) -> tuple[TensorType, Inferred]:
    q = require(shapes["query"], "the query", min_rank=3)
    k = require(shapes["key"], "the key", min_rank=3)
    v = require(shapes["value"], "the value", min_rank=3)
    if k.dims[:-1] != v.dims[:-1]:
        raise ShapeError(f"keys {k} and values {v} must have the same batch and length")
    if q.dims[:-2] != k.dims[:-2]:
        raise ShapeError(f"queries {q} and keys {k} must have the same batch dimensions")
    if "mask" in shapes:
        mask = require(shapes["mask"], "the mask", dtype="bool")
        if mask.dims != k.dims[:-1]:
            raise ShapeError(f"the padding mask {mask} must match the keys' {TensorType(k.dims[:-1])}")
    if "position_bias" in shapes:
        bias = require(shapes["position_bias"], "the position bias", min_rank=3)
        expected = (a.heads, q.dims[-2], k.dims[-2])
        if bias.dims[-3:] != expected or any(d != 1 for d in bias.dims[:-3]):
            raise ShapeError(f"the position bias {bias} must be a score's bias per head, query and key: "
                             f"{TensorType((1, *expected))}")
    if PORT in shapes:
        check_mask(shapes[PORT], q, k)
    inferred: Inferred = {}
    if "position_embeddings" in shapes:
        if a.rotary or a.alibi:
            raise ShapeError(f"position_embeddings and {'rotary' if a.rotary else 'alibi'} = true both encode "
                             "positions: choose one")
        if k.dims[-2] != q.dims[-2]:
            raise ShapeError(f"position_embeddings turn keys of the queries' positions, but the keys {k} are of "
                             f"other positions than the queries {q}")
        inferred["turned"] = check_angles(shapes["position_embeddings"], q, a.d_k, "d_k")
    d_model = concrete_last(q, "the query")
    for name, x in (("key", k), ("value", v)):
        if concrete_last(x, f"the {name}") != d_model:
            raise ShapeError(f"the {name} {x} must have the query's width, d_model = {d_model}: its projection "
                             "reads d_model features")
    return q, {"d_model": d_model, **inferred}


def _check(a: AttentionAttrs) -> list[tuple[str, str]]:
    problems = []
    if a.heads % a.key_heads:
        problems.append(("kv_heads", f"kv_heads = {a.key_heads} must divide heads = {a.heads}: each key/value "
                                     "head serves the same number of query heads"))
    if a.rotary and a.alibi:
        problems.append(("alibi", "rotary = true and alibi = true both encode positions: choose one"))
    problems += _rotary_problems(a)
    if a.window is not None:
        if a.window < 1:
            problems.append(("window", f"a sliding window of {a.window} positions: a query sees itself and the "
                                       "window - 1 positions before it, so window must be at least 1"))
        if a.alibi:
            problems.append(("window", "window and alibi = true: ALiBi already fades distant keys; choose one"))
    if a.softcap is not None and a.softcap <= 0:
        problems.append(("softcap", f"softcap = {a.softcap} caps scores at +-softcap: it must be positive"))
    if a.scale is not None and a.scale <= 0:
        problems.append(("scale", f"scale = {a.scale}: the scores' scale must be positive"))
    return problems


def _rotary_problems(a: AttentionAttrs) -> list[tuple[str, str]]:
    """The attention's own rotary settings (op_rotary.py's rules), each needing rotary = true."""
    if not a.rotary:
        return [(name, f"{name} applies to rotary positions: it needs rotary = true")
                for name in ("rotary_fraction", "rotary_scaling")
                if getattr(a, name) != AttentionAttrs.model_fields[name].default]
    return rotary_problems(_rotary(a))


def _rotary(a: AttentionAttrs) -> Settings:
    return Settings.of(a, "rotary_", "d_k")


def _params(a: AttentionAttrs, i: Inferred) -> dict[str, tuple[int, ...]]:
    d_model = size(i, "d_model")
    # with a gate, W^G's rows are W^Q's: each head's queries, then its gate's (transformers' layout)
    rows = {"q_proj.": a.heads * (a.d_k + (a.d_v if a.output_gate else 0)), "k_proj.": a.key_heads * a.d_k,
            "v_proj.": a.key_heads * a.d_v}
    if a.fused_qkv:
        rows = {"qkv_proj.": sum(rows.values())}
    params: dict[str, tuple[int, ...]] = {}
    for part, n in rows.items():
        params |= linear_params(part, d_model, n, a.bias)
    params |= linear_params("o_proj.", a.heads * a.d_v, d_model, a.has_out_bias)
    if a.qk_norm != "none":
        q_size, k_size = _qk_norm_sizes(a)
        params |= {"q_norm.weight": (q_size,), "k_norm.weight": (k_size,)}
    if a.sinks:
        params["sinks"] = (a.heads,)
    return params


def _qk_norm_sizes(a: AttentionAttrs) -> tuple[int, int]:
    """The features each of the query and key norms normalizes: one head's, or the whole projection's."""
    if a.qk_norm == "head":
        return a.d_k, a.d_k
    return a.heads * a.d_k, a.key_heads * a.d_k


def _flops(a: AttentionAttrs, i: Inferred, n_q: int, n_in: dict[str, int]) -> dict[str, int]:
    """§3.2.2: project Q, K, V per head, softmax(QK^T / sqrt(d_k)) V, concatenate, project with W^O.
    The full n_q x n_k scores are computed, also where a causal mask or a sliding window discards some of
    them (what SDPA and the plain path run)."""
    n_k, d_model = n_in["key"], size(i, "d_model")
    return {
        "attention_qkv": 2 * d_model * (n_q * a.heads * a.d_k + n_k * a.key_heads * (a.d_k + a.d_v)),
        "attention_scores": 2 * n_q * n_k * a.heads * a.d_k,
        "attention_values": 2 * n_q * n_k * a.heads * a.d_v,
        "attention_out": 2 * n_q * a.heads * a.d_v * d_model * (2 if a.output_gate else 1),
    }


SCORE_COPIES = 4      # n_q x n_k tensors the plain path keeps: scores, capped, masked, probabilities


def _saved(a: AttentionAttrs, i: Inferred, n_q: int, n_in: dict[str, int]) -> int:
    """What attention keeps for backward. SDPA's kernels: Q, K, V, the per-head context and each query's
    log-sum-exp. Where the n_q x n_k weights are written out, several of them too (measured on CPUs):
    SDPA's own fallback for dropout on the weights (3) or an additive bias, ALiBi's or a position bias (2),
    and the plain path of soft caps and sinks (SCORE_COPIES, one more with dropout)."""
    n_k = n_in["key"]
    kept = n_q * a.heads * (a.d_k + a.d_v + 1) + n_k * a.key_heads * (a.d_k + a.d_v)
    if a.softcap is not None or a.sinks:
        kept += (SCORE_COPIES + (1 if a.dropout else 0)) * a.heads * n_q * n_k
    elif a.dropout or a.alibi or "position_bias" in n_in:
        kept += (3 if a.dropout else 2) * a.heads * n_q * n_k
    return kept


# --- lowering ----------------------------------------------------------------------------------


def _call(target: str, inputs: dict[str, pyast.expr], attrs: Attrs, cache: bool) -> pyast.expr:
    args = [inputs["query"], inputs["key"], inputs["value"]]
    if "mask" in inputs:
        args.append(inputs["mask"])  # forward(query, key, value, padding_mask=None, cache=None)
    named = {name: inputs[name] for name in ("position_bias", "position_embeddings", PORT) if name in inputs}
    return call(f"self.{target}", *args, **({"cache": variable("cache")} if cache else {}), **named)


def _norm(features: pyast.expr, a: AttentionAttrs, w: Written) -> pyast.expr:
    if a.qk_norm_offset == 0:
        return call("nn.RMSNorm", features, eps=w.attr("qk_norm_eps"))
    return call("RMSNorm", features, eps=w.attr("qk_norm_eps"), offset=w.attr("qk_norm_offset"))


def _product(w: Written, names: tuple[str, ...], value: float) -> pyast.expr:
    """A size the attributes `names` multiply to (heads * d_k): over the config where the spec read one of
    them from it, else the value."""
    if not any(w.from_config(name) for name in names):
        return constant(value)
    return product(*(w.attr(name) for name in names))


def _module(a: AttentionAttrs, i: Inferred, w: Written) -> pyast.expr:
    """xspec/nn/attention.py's Attention (d_model, heads, kv_heads, d_k, d_v, bias, out_bias, causal) and
    the parts its options take, each only where the spec uses it: its norms and rotary embedding built
    here, and the written-out weights for soft caps and sinks."""
    kv_heads = w.attr("kv_heads") if a.kv_heads is not None else w.attr("heads")
    out_bias = w.attr("bias") if a.out_bias is None else w.attr("out_bias")
    keywords = {"bias": w.attr("bias"), "out_bias": out_bias, "causal": w.attr("causal")}
    if not i.get("self_attention", False):
        keywords["cross"] = constant(True)
    if a.fused_qkv:
        keywords["fused"] = w.attr("fused_qkv")
    if a.qk_norm != "none":
        q_size, k_size = _qk_norm_sizes(a)
        key_heads = "kv_heads" if a.kv_heads is not None else "heads"
        q_features = w.attr("d_k") if a.qk_norm == "head" else _product(w, ("heads", "d_k"), q_size)
        k_features = w.attr("d_k") if a.qk_norm == "head" else _product(w, (key_heads, "d_k"), k_size)
        keywords |= {"q_norm": _norm(q_features, a, w), "k_norm": _norm(k_features, a, w)}
        if a.qk_norm == "projection":
            keywords["norm_over"] = constant("projection")
    if a.rotary:
        keywords["rotary"] = rotary_embedding(_rotary(a), w)
    for keyword, attr, used in (("scale", "scale", a.scale is not None), ("window", "window", a.window is not None),
                                ("alibi", "alibi", a.alibi), ("gate", "output_gate", a.output_gate),
                                ("sinks", "sinks", a.sinks)):
        if used:
            keywords[keyword] = w.attr(attr)
    dropout = {"dropout": w.attr("dropout")} if a.dropout > 0 else {}
    if a.softcap is not None or a.sinks:
        softcap = {"softcap": w.attr("softcap")} if a.softcap is not None else {}
        keywords["inner_attention"] = call("WrittenOutAttention", **softcap, **dropout)
    else:
        keywords |= dropout
    return call("Attention", w.width("query"), w.attr("heads"), kv_heads, w.attr("d_k"), w.attr("d_v"), **keywords)


# Attention's keywords whose None turns their option off (a sliding window, None in a global layer): layers
# a condition chooses between share one call, that keyword chosen (compiler/layer_choice.py).
OPTIONAL_KEYWORDS = frozenset({"window"})


def _buffers(a: AttentionAttrs, i: Inferred) -> dict[str, tuple[int, ...]]:
    """Derived tables: rotary's inverse frequencies, ALiBi's slopes."""
    buffers: dict[str, tuple[int, ...]] = {}
    if a.rotary:
        buffers["rotary.inverse_frequency"] = (int(_rotary(a).features) // 2,)
    if a.alibi:
        buffers["slopes"] = (a.heads,)
    return buffers


def _facts(a: AttentionAttrs, i: Inferred) -> dict[str, object]:
    facts: dict[str, object] = {"heads": a.heads, "kv_heads": a.key_heads, "d_k": a.d_k, "d_v": a.d_v}
    if a.rotary or a.alibi:  # rotary angles passed in: the op that makes them says so
        facts["positions"] = "rotary" if a.rotary else "alibi"
    return facts



def _details(a: AttentionAttrs, i: Inferred) -> list[str]:
    heads = f"h = {a.heads}" + (f", kv heads {a.key_heads}" if a.key_heads != a.heads else "")
    details = [f"{heads}, d_k = {a.d_k}, d_v = {a.d_v}"]
    if a.rotary:
        details.append(describe_rotary(_rotary(a)))
    elif i.get("turned"):
        details.append("rotary positions, the stack's")
    if a.alibi:
        details.append("ALiBi")
    if a.window is not None:
        details.append(f"sliding window {a.window}")
    if a.qk_norm != "none":
        details.append("QK-norm " + ("per head" if a.qk_norm == "head" else "over the projection"))
    if a.softcap is not None:
        details.append(f"scores soft-capped at {a.softcap:g}")
    if a.scale is not None:
        details.append(f"scale {a.scale:.4g}")
    if a.sinks:
        details.append("attention sinks")
    if a.output_gate:
        details.append("output gated")
    if a.fused_qkv:
        details.append("Q, K, V in one matrix")
    if a.dropout:
        details.append(f"attention dropout {a.dropout:g}")
    return details


ATTENTION = OpDef(
    name="attention",
    doc="multi-head scaled dot-product attention, softmax(QK^T / sqrt(d_k)) V (§3.2.1-3.2.2)",
    family=Family.ATTENTION,
    inputs=(Input("query"), Input("key"), Input("value"), Input("mask", optional=True),
            Input("position_bias", optional=True, keyword=True),
            Input("position_embeddings", optional=True, keyword=True), Input(PORT, optional=True, keyword=True)),
    attrs=AttentionAttrs, infer=_shape, params=_params, check=_check,
    reads=lambda a, producers: check_reader(a.causal, a.window, producers),
    module=_module, call=_call, uses_cache=True, buffers=_buffers,
    title="Multi-Head Attention", details=_details, facts=_facts,
    flops=_flops, saved=_saved, optional_keywords=OPTIONAL_KEYWORDS,
    cache=lambda a, i: ((a.key_heads, a.d_k, a.d_v), a.window), output_weight="o_proj.weight",
)

