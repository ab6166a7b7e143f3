"""The op table: every op the language knows, in one place.

Each entry names the op's tensor inputs, its attribute schema (a pydantic model, so a spec's
arguments are type-checked) and the rules between its arguments, its shape rule, its learned tensors,
its lowering to PyTorch, its cost (FLOPs, saved activations), how diagrams name it (title and key
attributes) and what it says of the model's hyperparameters. Adding an op means adding one entry here
(and, for a new module, a class in prelude.py); nothing outside this file branches on an op's name,
except the graph's own inputs and outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from .shapes import ShapeError, TensorType, broadcast, concrete_last, require


class Attrs(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class NoAttrs(Attrs):
    pass


class EmbeddingAttrs(Attrs):
    vocab: int = Field(gt=0)
    dim: int = Field(gt=0)
    scale: float = 1.0  # §3.4: the paper multiplies embeddings by sqrt(d_model)


class PositionsAttrs(Attrs):
    max_len: int = Field(gt=0)


class LinearAttrs(Attrs):
    out: int = Field(gt=0)
    bias: bool = True


class LayerNormAttrs(Attrs):
    eps: float = Field(1e-5, gt=0)
    bias: bool = True


class RMSNormAttrs(Attrs):
    eps: float = Field(1e-6, gt=0)


class DropoutAttrs(Attrs):
    p: float = Field(ge=0, lt=1)


class ScaleAttrs(Attrs):
    factor: float


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

    @property
    def key_heads(self) -> int:
        return self.kv_heads or self.heads


class IOAttrs(Attrs):
    name: str
    kind: Literal["tokens", "mask", "output"]


@dataclass(frozen=True)
class Input:
    name: str
    optional: bool = False


Inferred = dict[str, object]  # facts the shape rule derives, e.g. {"in_features": 512}
Shapes = dict[str, TensorType]


@dataclass(frozen=True)
class OpDef:
    name: str
    doc: str  # what it computes, with the paper section
    family: str  # for diagrams: attention, feed_forward, norm, embedding, position, ...
    inputs: tuple[Input, ...]
    attrs: type[Attrs]
    infer: Callable[[Shapes, Attrs], tuple[TensorType, Inferred]]
    params: Callable[[Attrs, Inferred], dict[str, tuple[int, ...]]]  # learned tensors, by attribute name
    # Lowering. `module` builds the nn.Module (None: a plain function of its inputs); `call` is the
    # forward expression, given the module's attribute name, the inputs' code and the cache's code.
    module: Optional[Callable[[Attrs, Inferred], str]]
    call: Callable[[str, dict[str, str], Attrs, Optional[str]], str]
    uses_cache: bool = False  # positions and attention continue from the decoder cache
    title: str = ""  # diagrams: the box's title (the paper's words where it has them, Figure 1)
    details: Callable[[Attrs, Inferred], list[str]] = lambda a, i: []  # diagrams: key attributes
    glu_title: str = ""  # an activation: the name of a gated linear unit it gates ("SwiGLU")
    gates: bool = False  # multiplies two tensors: with an activation on one side, a gated linear unit
    # Rules between arguments that their types cannot state: (argument, message) for each one broken.
    check: Callable[[Attrs], list[tuple[str, str]]] = lambda a: []
    # Cost (docs/stats.md), given the sequence positions of one example's output and of each input:
    # forward FLOPs by category (matrix products only), and the values autograd keeps beyond the output.
    flops: Callable[[Attrs, Inferred, int, dict[str, int]], dict[str, int]] = lambda a, i, n, n_in: {}
    saved: Callable[[Attrs, Inferred, int, dict[str, int]], int] = lambda a, i, n, n_in: 0
    # What the op says about the model's hyperparameters, by Table 3's column names (`xspec stats`).
    facts: Callable[[Attrs, Inferred], dict[str, object]] = lambda a, i: {}
    # Tensors the module allocates that are not learned (e.g. a positional table): counted in memory checks.
    buffers: Callable[[Attrs, Inferred], dict[str, tuple[int, ...]]] = lambda a, i: {}


def _size(inferred: Inferred, key: str) -> int:
    """A size the shape rule inferred (`in_features`, `d_model`...): always a whole number."""
    value = inferred[key]
    assert isinstance(value, int), f"{key} = {value!r} is not a size"
    return value


def _no_params(attrs: Attrs, inferred: Inferred) -> dict[str, tuple[int, ...]]:
    return {}


def _same(shapes: Shapes, attrs: Attrs) -> tuple[TensorType, Inferred]:
    return require(shapes["x"], "the input"), {}


def _linear_params(prefix: str, n_in: int, n_out: int, bias: bool) -> dict[str, tuple[int, ...]]:
    params: dict[str, tuple[int, ...]] = {f"{prefix}weight": (n_out, n_in)}
    if bias:
        params[f"{prefix}bias"] = (n_out,)
    return params


# --- shape rules ---------------------------------------------------------------------------


def _embedding_shape(shapes: Shapes, a: EmbeddingAttrs) -> tuple[TensorType, Inferred]:
    tokens = require(shapes["tokens"], "the tokens", dtype="long")
    return TensorType((*tokens.dims, a.dim)), {}


def _positions_shape(shapes: Shapes, a: PositionsAttrs) -> tuple[TensorType, Inferred]:
    x = require(shapes["x"], "the input", min_rank=2)
    dim = concrete_last(x, "the input")
    return TensorType((x.dims[-2], dim)), {"dim": dim}


def _linear_shape(shapes: Shapes, a: LinearAttrs) -> tuple[TensorType, Inferred]:
    x = require(shapes["x"], "the input")
    return x.with_last(a.out), {"in_features": concrete_last(x, "the input")}


def _norm_shape(shapes: Shapes, a: Attrs) -> tuple[TensorType, Inferred]:
    x = require(shapes["x"], "the input")
    return x, {"dim": concrete_last(x, "the input")}


def _elementwise(verb: str) -> Callable[[Shapes, Attrs], tuple[TensorType, Inferred]]:
    """The shape rule of a binary elementwise op: its operands broadcast."""
    def infer(shapes: Shapes, a: Attrs) -> tuple[TensorType, Inferred]:
        left, right = shapes["a"], shapes["b"]
        try:
            return broadcast(require(left, "the left operand"), require(right, "the right operand")), {}
        except ShapeError:
            raise ShapeError(f"cannot {verb} tensors of shapes {left} and {right}") from None
    return infer


def _attention_shape(shapes: Shapes, a: AttentionAttrs) -> tuple[TensorType, Inferred]:
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
    inferred = {
        "d_model": concrete_last(q, "the query"),
        "kdim": concrete_last(k, "the key"),
        "vdim": concrete_last(v, "the value"),
    }
    return q, inferred


def _attention_flops(a: AttentionAttrs, i: Inferred, n_q: int, n_in: dict[str, int]) -> dict[str, int]:
    """§3.2.2: project Q, K, V per head, softmax(QK^T / sqrt(d_k)) V, concatenate, project with W^O.
    The full n_q x n_k scores are computed, also where a causal mask discards half of them."""
    n_k, d_model = n_in["key"], _size(i, "d_model")
    return {
        "attention_qkv": 2 * (n_q * d_model * a.heads * a.d_k + n_k * _size(i, "kdim") * a.key_heads * a.d_k
                              + n_k * _size(i, "vdim") * a.key_heads * a.d_v),
        "attention_scores": 2 * n_q * n_k * a.heads * a.d_k,
        "attention_values": 2 * n_q * n_k * a.heads * a.d_v,
        "attention_out": 2 * n_q * a.heads * a.d_v * d_model,
    }


def _attention_saved(a: AttentionAttrs, i: Inferred, n_q: int, n_in: dict[str, int]) -> int:
    """What SDPA keeps for backward: Q, K, V, the per-head context and each query's log-sum-exp. Where it
    falls back to its plain path (measured on CPUs: dropout on the weights, or ALiBi's additive bias), the
    n_q x n_k weights too: before and after dropout, and dropout's mask."""
    n_k = n_in["key"]
    kept = n_q * a.heads * (a.d_k + a.d_v + 1) + n_k * a.key_heads * (a.d_k + a.d_v)
    if a.dropout or a.alibi:
        kept += (3 if a.dropout else 2) * a.heads * n_q * n_k
    return kept


def _attention_check(a: AttentionAttrs) -> list[tuple[str, str]]:
    problems = []
    if a.heads % a.key_heads:
        problems.append(("kv_heads", f"kv_heads = {a.key_heads} must divide heads = {a.heads}: each key/value "
                                     "head serves the same number of query heads"))
    if a.rotary and a.d_k % 2:
        problems.append(("d_k", f"rotary positions rotate pairs of features, so d_k must be even, got {a.d_k}"))
    if a.rotary and a.alibi:
        problems.append(("alibi", "rotary = true and alibi = true both encode positions: choose one"))
    return problems


def _attention_params(a: AttentionAttrs, i: Inferred) -> dict[str, tuple[int, ...]]:
    d_model, kdim, vdim = _size(i, "d_model"), _size(i, "kdim"), _size(i, "vdim")
    return {
        **_linear_params("q_proj.", d_model, a.heads * a.d_k, a.bias),
        **_linear_params("k_proj.", kdim, a.key_heads * a.d_k, a.bias),
        **_linear_params("v_proj.", vdim, a.key_heads * a.d_v, a.bias),
        **_linear_params("out_proj.", a.heads * a.d_v, d_model, a.bias),
    }


def _scale_text(scale: float) -> str:
    squared = round(scale * scale)
    if squared > 1 and math.isclose(scale * scale, squared, rel_tol=1e-9):
        return f"√{squared}"  # §3.4: embeddings are multiplied by sqrt(d_model)
    return f"{scale:.4g}"


def _io_shape(shapes: Shapes, a: IOAttrs) -> tuple[TensorType, Inferred]:
    raise AssertionError("inputs and outputs are typed by the graph builder")


# --- lowering ------------------------------------------------------------------------------


def _call_module(target: str, inputs: dict[str, str], attrs: Attrs, cache: Optional[str]) -> str:
    args = list(inputs.values())
    return f"self.{target}({', '.join(args)})"


def _call_with_cache(target: str, inputs: dict[str, str], attrs: Attrs, cache: Optional[str]) -> str:
    return f"self.{target}({inputs['x']}{', cache' if cache else ''})"


def _call_attention(target: str, inputs: dict[str, str], attrs: Attrs, cache: Optional[str]) -> str:
    args = [inputs["query"], inputs["key"], inputs["value"]]
    if "mask" in inputs:
        args.append(f"padding_mask={inputs['mask']}")
    if cache:
        args.append("cache=cache")
    return f"self.{target}({', '.join(args)})"


def _attention_module(a: AttentionAttrs, i: Inferred) -> str:
    return (
        f"MultiHeadAttention({i['d_model']!r}, heads={a.heads!r}, d_k={a.d_k!r}, d_v={a.d_v!r}, "
        f"kdim={i['kdim']!r}, vdim={i['vdim']!r}, causal={a.causal!r}, dropout={a.dropout!r}, "
        f"bias={a.bias!r}, kv_heads={a.key_heads!r}, rotary={a.rotary!r}, rotary_base={a.rotary_base!r}, "
        f"alibi={a.alibi!r}, kv_cache={i.get('kv_cache', 'none')!r}, "
        f"self_attention={i.get('self_attention', False)!r})"
    )


def _attention_buffers(a: AttentionAttrs, i: Inferred) -> dict[str, tuple[int, ...]]:
    """Derived tables: rotary's inverse frequencies, ALiBi's slopes."""
    return {**({"inverse_frequency": (a.d_k // 2,)} if a.rotary else {}), **({"slopes": (a.heads,)} if a.alibi else {})}


def _attention_facts(a: AttentionAttrs, i: Inferred) -> dict[str, object]:
    facts: dict[str, object] = {"heads": a.heads, "kv_heads": a.key_heads, "d_k": a.d_k, "d_v": a.d_v}
    if a.rotary or a.alibi:
        facts["positions"] = "rotary" if a.rotary else "alibi"
    return facts


def _attention_details(a: AttentionAttrs, i: Inferred) -> list[str]:
    heads = f"h = {a.heads}" + (f", kv heads {a.key_heads}" if a.key_heads != a.heads else "")
    details = [f"{heads}, d_k = {a.d_k}, d_v = {a.d_v}"]
    if a.rotary:
        details.append("rotary positions")
    if a.alibi:
        details.append("ALiBi")
    if a.dropout:
        details.append(f"attention dropout {a.dropout:g}")
    return details


def _activation(name: str, title: str, glu_title: str, doc: str, function: str) -> OpDef:
    return OpDef(name=name, doc=doc, family="activation", inputs=(Input("x"),), attrs=NoAttrs, infer=_same,
                 params=_no_params, module=None, call=lambda t, i, a, c: f"{function}({i['x']})", title=title,
                 glu_title=glu_title)


def _infix(name: str, symbol: str, verb: str, title: str, doc: str, family: str,
           gates: bool = False) -> OpDef:
    """A binary elementwise op written `a <symbol> b` in specs and in generated code."""
    return OpDef(name=name, doc=doc, family=family, inputs=(Input("a"), Input("b")), attrs=NoAttrs,
                 infer=_elementwise(verb), params=_no_params, module=None,
                 call=lambda t, i, a, c: f"{i['a']} {symbol} {i['b']}", title=title, gates=gates)


OPS: dict[str, OpDef] = {
    op.name: op
    for op in (
        OpDef(
            name="embedding", doc="token embedding, times `scale` (§3.4)", family="embedding",
            inputs=(Input("tokens"),), attrs=EmbeddingAttrs, infer=_embedding_shape,
            params=lambda a, i: {"weight": (a.vocab, a.dim)},
            module=lambda a, i: f"Embedding({a.vocab!r}, {a.dim!r}, scale={a.scale!r})",
            call=_call_module, title="Embedding", facts=lambda a, i: {"d_model": a.dim, "vocab": a.vocab},
            details=lambda a, i: [f"{a.vocab} × {a.dim}"] + ([f"scaled by {_scale_text(a.scale)}"] if a.scale != 1
                                                             else []),
        ),
        OpDef(
            name="sinusoidal_positions",
            doc="PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...) (§3.5)",
            family="position", inputs=(Input("x"),), attrs=PositionsAttrs, infer=_positions_shape,
            params=_no_params,
            module=lambda a, i: f"SinusoidalPositions({i['dim']!r}, max_len={a.max_len!r})",
            call=_call_with_cache, uses_cache=True,
            buffers=lambda a, i: {"table": (a.max_len, _size(i, "dim"))},
            title="Positional Encoding", details=lambda a, i: [f"sinusoidal, max_len {a.max_len}"],
            facts=lambda a, i: {"positions": "sinusoidal"},
        ),
        OpDef(
            name="learned_positions", doc="learned positional embeddings (Table 3, row E)",
            family="position", inputs=(Input("x"),), attrs=PositionsAttrs, infer=_positions_shape,
            params=lambda a, i: {"weight": (a.max_len, _size(i, "dim"))},
            module=lambda a, i: f"LearnedPositions({i['dim']!r}, max_len={a.max_len!r})",
            call=_call_with_cache, uses_cache=True,
            title="Positional Embedding", details=lambda a, i: [f"learned, max_len {a.max_len}"],
            facts=lambda a, i: {"positions": "learned"},
        ),
        OpDef(
            name="linear", doc="x W + b", family="feed_forward",
            inputs=(Input("x"),), attrs=LinearAttrs, infer=_linear_shape,
            params=lambda a, i: _linear_params("", _size(i, "in_features"), a.out, a.bias),
            module=lambda a, i: f"nn.Linear({i['in_features']!r}, {a.out!r}, bias={a.bias!r})",
            call=_call_module, title="Linear",
            flops=lambda a, i, n, n_in: {"feed_forward": 2 * n * _size(i, "in_features") * a.out},
            details=lambda a, i: [f"{i['in_features']} → {a.out}" + ("" if a.bias else ", no bias")],
        ),
        OpDef(
            name="layer_norm", doc="layer normalization (§3.1, Ba et al. 2016)", family="norm",
            inputs=(Input("x"),), attrs=LayerNormAttrs, infer=_norm_shape,
            params=lambda a, i: {"weight": (_size(i, "dim"),), **({"bias": (_size(i, "dim"),)} if a.bias else {})},
            module=lambda a, i: f"nn.LayerNorm({i['dim']!r}, eps={a.eps!r}, bias={a.bias!r})",
            call=_call_module, title="Layer Norm", details=lambda a, i: [] if a.bias else ["no bias"],
        ),
        OpDef(
            name="rms_norm", doc="x / sqrt(mean(x^2) + eps) * g: root mean square normalization (Zhang & Sennrich, "
                                 "2019)",
            family="norm", inputs=(Input("x"),), attrs=RMSNormAttrs, infer=_norm_shape,
            params=lambda a, i: {"weight": (_size(i, "dim"),)},
            module=lambda a, i: f"nn.RMSNorm({i['dim']!r}, eps={a.eps!r})",
            call=_call_module, title="RMS Norm",
        ),
        OpDef(
            name="attention",
            doc="multi-head scaled dot-product attention, softmax(QK^T / sqrt(d_k)) V (§3.2.1-3.2.2)",
            family="attention",
            inputs=(Input("query"), Input("key"), Input("value"), Input("mask", optional=True)),
            attrs=AttentionAttrs, infer=_attention_shape, params=_attention_params, check=_attention_check,
            module=_attention_module, call=_call_attention, uses_cache=True, buffers=_attention_buffers,
            title="Multi-Head Attention", details=_attention_details, facts=_attention_facts,
            flops=_attention_flops, saved=_attention_saved,
        ),
        OpDef(
            name="dropout", doc="dropout (§5.4: residual dropout)", family="regularization",
            inputs=(Input("x"),), attrs=DropoutAttrs, infer=_same, params=_no_params, module=None,
            call=lambda t, i, a, c: f"F.dropout({i['x']}, p={a.p!r}, training=self.training)",
            title="Dropout", details=lambda a, i: [f"p = {a.p:g}"], facts=lambda a, i: {"dropout": a.p},
        ),
        # GLU variants (Shazeer, 2020) take their names from the activation on the gate.
        _activation("relu", "ReLU", "ReGLU", "max(0, x) (§3.3)", "F.relu"),
        _activation("gelu", "GELU", "GEGLU", "Gaussian error linear unit (Hendrycks & Gimpel, 2016)", "F.gelu"),
        _activation("silu", "SiLU", "SwiGLU", "x * sigmoid(x), also called swish", "F.silu"),
        _activation("sigmoid", "Sigmoid", "GLU", "1 / (1 + exp(-x)): GLU's gate (Dauphin et al., 2017)",
                    "F.sigmoid"),
        _activation("tanh", "Tanh", "", "hyperbolic tangent", "F.tanh"),
        _infix("add", "+", "add", "Add", "a + b, e.g. a residual connection (§3.1)", "residual"),
        _infix("sub", "-", "subtract", "Subtract", "a - b", "elementwise"),
        _infix("mul", "*", "multiply", "Multiply", "a * b, elementwise: e.g. a GLU's gate", "elementwise", gates=True),
        OpDef(
            name="scale", doc="x * factor", family="elementwise",
            inputs=(Input("x"),), attrs=ScaleAttrs, infer=_same, params=_no_params, module=None,
            call=lambda t, i, a, c: f"{i['x']} * {a.factor!r}",
            title="Scale", details=lambda a, i: [f"× {a.factor:.4g}"],
        ),
        OpDef(
            name="input", doc="a model input", family="io", inputs=(), attrs=IOAttrs,
            infer=_io_shape, params=_no_params, module=None, call=lambda t, i, a, c: t,
        ),
        OpDef(
            name="output", doc="a model output", family="io", inputs=(Input("x"),), attrs=IOAttrs,
            infer=lambda shapes, a: (shapes["x"], {}), params=_no_params, module=None,
            call=lambda t, i, a, c: i["x"],
        ),
    )
}

# Ops written as operators (`a + b`, `x * 2`), and those that come from the entry blocks' signatures:
# all other ops are called by name.
INFIX_OPS = frozenset({"add", "sub", "mul", "scale"})


def callable_op(name: str) -> bool:
    """Whether a spec calls `name(...)` as an op (read from the table as it is, so an op added to it
    is callable at once)."""
    return name in OPS and name not in INFIX_OPS and OPS[name].family != "io"
