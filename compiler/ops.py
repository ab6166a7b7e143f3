"""The op table: every op the language knows, in one place.

Each entry names the op's tensor inputs, its attribute schema (a pydantic model, so a spec's
arguments are type-checked), its shape rule, its learned tensors, and its lowering to PyTorch.
Adding an op means adding one entry here (and, for a new module, a class in prelude.py).
"""

from __future__ import annotations

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
    # Tensors the module allocates that are not learned (e.g. a positional table): counted in memory checks.
    buffers: Callable[[Attrs, Inferred], dict[str, tuple[int, ...]]] = lambda a, i: {}
    precedence: int = 100  # infix ops bind looser than calls: the code generator adds parentheses


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


def _layer_norm_shape(shapes: Shapes, a: LayerNormAttrs) -> tuple[TensorType, Inferred]:
    x = require(shapes["x"], "the input")
    return x, {"dim": concrete_last(x, "the input")}


def _add_shape(shapes: Shapes, a: NoAttrs) -> tuple[TensorType, Inferred]:
    left, right = shapes["a"], shapes["b"]
    try:
        return broadcast(require(left, "the left operand"), require(right, "the right operand")), {}
    except ShapeError:
        raise ShapeError(f"cannot add tensors of shapes {left} and {right}") from None


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


def _attention_params(a: AttentionAttrs, i: Inferred) -> dict[str, tuple[int, ...]]:
    d_model, kdim, vdim = int(i["d_model"]), int(i["kdim"]), int(i["vdim"])  # type: ignore[call-overload]
    return {
        **_linear_params("q_proj.", d_model, a.heads * a.d_k, a.bias),
        **_linear_params("k_proj.", kdim, a.heads * a.d_k, a.bias),
        **_linear_params("v_proj.", vdim, a.heads * a.d_v, a.bias),
        **_linear_params("out_proj.", a.heads * a.d_v, d_model, a.bias),
    }


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
        f"bias={a.bias!r}, kv_cache={i.get('kv_cache', 'none')!r}, "
        f"self_attention={i.get('self_attention', False)!r})"
    )


OPS: dict[str, OpDef] = {
    op.name: op
    for op in (
        OpDef(
            name="embedding", doc="token embedding, times `scale` (§3.4)", family="embedding",
            inputs=(Input("tokens"),), attrs=EmbeddingAttrs, infer=_embedding_shape,
            params=lambda a, i: {"weight": (a.vocab, a.dim)},
            module=lambda a, i: f"Embedding({a.vocab!r}, {a.dim!r}, scale={a.scale!r})",
            call=_call_module,
        ),
        OpDef(
            name="sinusoidal_positions",
            doc="PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...) (§3.5)",
            family="position", inputs=(Input("x"),), attrs=PositionsAttrs, infer=_positions_shape,
            params=_no_params,
            module=lambda a, i: f"SinusoidalPositions({i['dim']!r}, max_len={a.max_len!r})",
            call=_call_with_cache, uses_cache=True,
            buffers=lambda a, i: {"table": (a.max_len, int(i["dim"]))},  # type: ignore[call-overload]
        ),
        OpDef(
            name="learned_positions", doc="learned positional embeddings (Table 3, row E)",
            family="position", inputs=(Input("x"),), attrs=PositionsAttrs, infer=_positions_shape,
            params=lambda a, i: {"weight": (a.max_len, int(i["dim"]))},  # type: ignore[call-overload]
            module=lambda a, i: f"LearnedPositions({i['dim']!r}, max_len={a.max_len!r})",
            call=_call_with_cache, uses_cache=True,
        ),
        OpDef(
            name="linear", doc="x W + b", family="feed_forward",
            inputs=(Input("x"),), attrs=LinearAttrs, infer=_linear_shape,
            params=lambda a, i: _linear_params("", int(i["in_features"]), a.out, a.bias),  # type: ignore[call-overload]
            module=lambda a, i: f"nn.Linear({i['in_features']!r}, {a.out!r}, bias={a.bias!r})",
            call=_call_module,
        ),
        OpDef(
            name="layer_norm", doc="layer normalization (§3.1, Ba et al. 2016)", family="norm",
            inputs=(Input("x"),), attrs=LayerNormAttrs, infer=_layer_norm_shape,
            params=lambda a, i: {"weight": (int(i["dim"]),), "bias": (int(i["dim"]),)},  # type: ignore[call-overload]
            module=lambda a, i: f"nn.LayerNorm({i['dim']!r}, eps={a.eps!r})",
            call=_call_module,
        ),
        OpDef(
            name="attention",
            doc="multi-head scaled dot-product attention, softmax(QK^T / sqrt(d_k)) V (§3.2.1-3.2.2)",
            family="attention",
            inputs=(Input("query"), Input("key"), Input("value"), Input("mask", optional=True)),
            attrs=AttentionAttrs, infer=_attention_shape, params=_attention_params,
            module=_attention_module, call=_call_attention, uses_cache=True,
        ),
        OpDef(
            name="dropout", doc="dropout (§5.4: residual dropout)", family="regularization",
            inputs=(Input("x"),), attrs=DropoutAttrs, infer=_same, params=_no_params, module=None,
            call=lambda t, i, a, c: f"F.dropout({i['x']}, p={a.p!r}, training=self.training)",
        ),
        OpDef(
            name="relu", doc="max(0, x) (§3.3)", family="activation",
            inputs=(Input("x"),), attrs=NoAttrs, infer=_same, params=_no_params, module=None,
            call=lambda t, i, a, c: f"F.relu({i['x']})",
        ),
        OpDef(
            name="gelu", doc="Gaussian error linear unit", family="activation",
            inputs=(Input("x"),), attrs=NoAttrs, infer=_same, params=_no_params, module=None,
            call=lambda t, i, a, c: f"F.gelu({i['x']})",
        ),
        OpDef(
            name="add", doc="a + b, e.g. a residual connection (§3.1)", family="residual",
            inputs=(Input("a"), Input("b")), attrs=NoAttrs, infer=_add_shape, params=_no_params,
            module=None, call=lambda t, i, a, c: f"{i['a']} + {i['b']}", precedence=1,
        ),
        OpDef(
            name="scale", doc="x * factor", family="elementwise",
            inputs=(Input("x"),), attrs=ScaleAttrs, infer=_same, params=_no_params, module=None,
            call=lambda t, i, a, c: f"{i['x']} * {a.factor!r}", precedence=2,
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

# Ops a spec may call by name (inputs and outputs come from the entry blocks' signatures).
CALLABLE_OPS = {name for name in OPS if name not in ("input", "output", "add", "scale")}
