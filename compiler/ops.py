"""The op table: every op the language knows, in one place.

Each entry (compiler/opdef.py) names the op's tensor inputs, its attribute schema (a pydantic model, so a
spec's arguments are type-checked) and the rules between its arguments, its shape rule, its learned
tensors, its lowering to PyTorch, its cost (FLOPs, saved activations), how diagrams name it (title and key
attributes) and what it says of the model's hyperparameters. Adding an op means adding one entry here
(and, for a new module, a class in the op library, xspec/nn/); an op with much to own keeps its entry in a module of
its own, registered here (op_attention.py, op_experts.py). Nothing outside the entries branches on an op's
name, except the graph's own inputs and outputs.
"""

from __future__ import annotations

import ast as pyast
import math
from typing import Any, Callable, Literal

from pydantic import Field

from .op_attention import ATTENTION, AttentionAttrs  # noqa: F401 (AttentionAttrs: re-exported)
from .op_experts import EXPERT_BANK, EXPERTS, ROUTER
from .op_latent_attention import LATENT_ATTENTION
from .op_recurrent import GATED_DELTA_NET, MAMBA2, SHORT_CONVOLUTION
from .op_attention_mask import ATTENTION_MASK
from .op_rotary import ROTARY_EMBEDDING
from .opdef import Attrs, Family, Inferred, Input, NoAttrs, OpDef, Shapes, Written, linear_params, no_params
from .opdef import size as _size
from .python_code import binary, call, constant, variable
from .shapes import ShapeError, TensorType, broadcast, concrete_last, require

_no_params, _linear_params = no_params, linear_params
__all__ = ["OPS", "INFIX_OPS", "callable_op", "Attrs", "NoAttrs", "Input", "OpDef", "Inferred", "Shapes"]


class EmbeddingAttrs(Attrs):
    vocab: int = Field(gt=0)
    dim: int = Field(gt=0)
    scale: float = 1.0  # §3.4: the paper multiplies embeddings by sqrt(d_model)


class PositionsAttrs(Attrs):
    max_len: int = Field(gt=0)


class LearnedAttrs(PositionsAttrs):
    offset: int = Field(0, ge=0)  # rows before the first position's, which no position reads (BART: 2)


class SinusoidalAttrs(PositionsAttrs):
    # "interleaved": sin and cos alternate (§3.5); "halves": every sine, then every cosine (Marian); "fairseq":
    # halves of fairseq's frequencies (M2M100, NLLB)
    layout: Literal["interleaved", "halves", "fairseq"] = "interleaved"
    offset: int = Field(0, ge=0)  # fairseq: rows before the first position's (its padding id + 1)


# Each layout's class (xspec/nn/embeddings.py).
_SINUSOIDS = {"interleaved": "SinusoidalPositions", "halves": "SinusoidalPositionsInHalves",
              "fairseq": "FairseqSinusoidalPositions"}


def _sinusoids_module(a: SinusoidalAttrs, i: Inferred, w: Written) -> pyast.expr:
    offset = [w.attr("offset")] if a.layout == "fairseq" else []
    return call(_SINUSOIDS[a.layout], w.width("x"), w.attr("max_len"), *offset)


class RelativeBiasAttrs(Attrs):
    heads: int = Field(gt=0)
    buckets: int = 32               # relative_attention_num_buckets
    max_distance: int = 128         # relative_attention_max_distance: farther keys share the last bucket
    bidirectional: bool = True      # keys after the query have buckets of their own (an encoder's)


def _relative_bias_check(a: RelativeBiasAttrs) -> list[tuple[str, str]]:
    """Half the buckets (a direction's) count distances one by one, the rest log-spaced up to
    max_distance: both halves need at least one bucket, and max_distance must lie beyond the exact ones."""
    per_direction = a.buckets // 2 if a.bidirectional else a.buckets
    if per_direction < 2:
        return [("buckets", f"buckets = {a.buckets}: each direction needs at least 2, half of them exact distances "
                            "and half log-spaced ones")]
    if a.max_distance <= per_direction // 2:
        return [("max_distance", f"max_distance = {a.max_distance} must exceed the {per_direction // 2} distances "
                                 "counted one by one")]
    return []


def _relative_bias_shape(shapes: Shapes, a: RelativeBiasAttrs) -> tuple[TensorType, Inferred]:
    x = require(shapes["x"], "the input", min_rank=2)
    return TensorType((1, a.heads, x.dims[-2], x.dims[-2])), {"dim": concrete_last(x, "the input")}


class TokenTypeAttrs(Attrs):
    types: int = Field(2, gt=0)     # type_vocab_size: BERT's two sentences of a pair


def _token_type_shape(shapes: Shapes, a: TokenTypeAttrs) -> tuple[TensorType, Inferred]:
    """x's shape: each position's type's row (without the token types, the first type's at every position)."""
    x = require(shapes["x"], "the input")
    dim = concrete_last(x, "the input")
    return TensorType(x.dims), {"dim": dim}


class LinearAttrs(Attrs):
    out: int = Field(gt=0)
    bias: bool = True


class LayerNormAttrs(Attrs):
    eps: float = Field(1e-5, gt=0)
    bias: bool = True


class RMSNormAttrs(Attrs):
    eps: float = Field(1e-6, gt=0)
    offset: float = 0.0  # the weight is offset + w: Gemma's (1 + w), its w starting at 0


class SoftCapAttrs(Attrs):
    cap: float


class DropoutAttrs(Attrs):
    p: float = Field(ge=0, lt=1)


class ScaleAttrs(Attrs):
    factor: float


class GLUAttrs(Attrs):
    activation: Literal["silu", "gelu", "gelu_tanh", "relu", "sigmoid"]  # on the gate, the first half


class ActivationAttrs(Attrs):
    function: Literal["gelu", "gelu_tanh", "relu", "silu", "sigmoid", "tanh"]


class IOAttrs(Attrs):
    name: str
    kind: Literal["tokens", "mask", "hidden", "output"]


def _same(shapes: Shapes, attrs: Attrs) -> tuple[TensorType, Inferred]:
    return require(shapes["x"], "the input"), {}


# --- shape rules ---------------------------------------------------------------------------


def _embedding_module(a: EmbeddingAttrs, i: Inferred, w: Written) -> pyast.expr:
    if a.scale != 1 or w.from_config("scale"):
        return call("ScaledEmbedding", w.attr("vocab"), w.attr("dim"), w.attr("scale"))
    return call("Embedding", w.attr("vocab"), w.attr("dim"))


def _embedding_shape(shapes: Shapes, a: EmbeddingAttrs) -> tuple[TensorType, Inferred]:
    tokens = require(shapes["tokens"], "the tokens", dtype="long")
    return TensorType((*tokens.dims, a.dim)), {}


def _positions_shape(shapes: Shapes, a: PositionsAttrs) -> tuple[TensorType, Inferred]:
    x = require(shapes["x"], "the input", min_rank=2)
    dim = concrete_last(x, "the input")
    return TensorType((x.dims[-2], dim)), {"dim": dim}


def _unless_default(w: Written, name: str, value: object, default: object) -> dict[str, pyast.expr]:
    """A keyword argument torch's default would give, written where the spec reads it from a parameter (so
    that editing the config changes it) or sets it otherwise; else left out."""
    return {name: w.attr(name)} if w.from_config(name) or value != default else {}


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


def _scale_text(scale: float) -> str:
    squared = round(scale * scale)
    if squared > 1 and math.isclose(scale * scale, squared, rel_tol=1e-9):
        return f"√{squared}"  # §3.4: embeddings are multiplied by sqrt(d_model)
    return f"{scale:.4g}"


def _concat_shape(shapes: Shapes, a: Attrs) -> tuple[TensorType, Inferred]:
    left, right = require(shapes["a"], "the left operand"), require(shapes["b"], "the right operand")
    if left.dims[:-1] != right.dims[:-1] or left.dtype != right.dtype:
        raise ShapeError(f"cannot join {left} and {right}: they must agree but in their last dimension")
    return left.with_last(concrete_last(left, "the left operand") + concrete_last(right, "the right operand")), {}


def _halves_shape(shapes: Shapes, a: GLUAttrs) -> tuple[TensorType, Inferred]:
    x = require(shapes["x"], "the input")
    features = concrete_last(x, "the input")
    if features % 2:
        raise ShapeError(f"a gated linear unit splits its input {x} into a gate and a value of equal size: "
                         f"its last size, {features}, must be even")
    return x.with_last(features // 2), {}


def _mean_pool_shape(shapes: Shapes, a: Attrs) -> tuple[TensorType, Inferred]:
    x = require(shapes["x"], "the input", min_rank=2)
    mask = require(shapes["mask"], "the mask", dtype="bool")
    if mask.dims != x.dims[:-1]:
        raise ShapeError(f"the padding mask {mask} must mark the input's positions: {TensorType(x.dims[:-1], 'bool')}")
    return x, {}


def _io_shape(shapes: Shapes, a: IOAttrs) -> tuple[TensorType, Inferred]:
    raise AssertionError("inputs and outputs are typed by the graph builder")


# --- lowering ------------------------------------------------------------------------------


def _written(inputs: dict[str, pyast.expr], attrs: Attrs, name: str) -> pyast.expr:
    """A `forward_attrs` attribute as an op's forward code writes it: the class's attribute that holds it
    where lowering gave one (compiler/forward.py), else its value."""
    held = inputs.get(name)
    return held if held is not None else constant(getattr(attrs, name))


def _call_module(target: str, inputs: dict[str, pyast.expr], attrs: Attrs, cache: bool) -> pyast.expr:
    return call(f"self.{target}", *inputs.values())


def _call_with_cache(target: str, inputs: dict[str, pyast.expr], attrs: Attrs, cache: bool) -> pyast.expr:
    return call(f"self.{target}", inputs["x"], **({"cache": variable("cache")} if cache else {}))


def _activation(op_name: str, title: str, glu_title: str, doc: str, function: str,
                **options: object) -> OpDef[NoAttrs]:
    keywords = {key: constant(value) for key, value in options.items()}
    return OpDef(name=op_name, doc=doc, family=Family.ACTIVATION, inputs=(Input("x"),), attrs=NoAttrs, infer=_same,
                 params=_no_params, module=None, call=lambda t, i, a, c: call(function, i["x"], **keywords),
                 title=title, glu_title=glu_title, elementwise=True)


def _infix(op_name: str, operator: type[pyast.operator], verb: str, title: str, doc: str, family: Family,
           gates: bool = False) -> OpDef[NoAttrs]:
    """A binary elementwise op written `a <operator> b` in specs and in generated code."""
    return OpDef(name=op_name, doc=doc, family=family, inputs=(Input("a"), Input("b")), attrs=NoAttrs,
                 infer=_elementwise(verb), params=_no_params, module=None,
                 call=lambda t, i, a, c: binary(i["a"], operator(), i["b"]), title=title, gates=gates)


OPS: dict[str, OpDef[Any]] = {
    op.name: op
    for op in (
        OpDef(
            name="embedding", doc="token embedding, times `scale` (§3.4)", family=Family.EMBEDDING,
            inputs=(Input("tokens"),), attrs=EmbeddingAttrs, infer=_embedding_shape,
            params=lambda a, i: {"weight": (a.vocab, a.dim)},
            module=_embedding_module, width="dim",
            call=_call_module, title="Embedding", facts=lambda a, i: {"d_model": a.dim, "vocab": a.vocab},
            details=lambda a, i: [f"{a.vocab} × {a.dim}"] + ([f"scaled by {_scale_text(a.scale)}"] if a.scale != 1
                                                             else []),
        ),
        OpDef(
            name="sinusoidal_positions",
            doc="PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...) (§3.5)",
            family=Family.POSITION, inputs=(Input("x"),), attrs=SinusoidalAttrs, infer=_positions_shape,
            params=_no_params,
            module=_sinusoids_module, call=_call_with_cache, uses_cache=True,
            buffers=lambda a, i: {"table": (a.max_len + a.offset, _size(i, "dim"))},
            check=lambda a: [] if a.layout == "fairseq" or not a.offset else
            [("offset", "offset applies to layout = \"fairseq\", whose table starts at its padding id + 1")],
            title="Positional Encoding",
            details=lambda a, i: [f"sinusoidal{', sines then cosines' if a.layout == 'halves' else ''}, "
                                  f"max_len {a.max_len}"],
            facts=lambda a, i: {"positions": "sinusoidal"},
        ),
        OpDef(
            name="learned_positions", doc="learned positional embeddings (Table 3, row E)",
            family=Family.POSITION, inputs=(Input("x"),), attrs=LearnedAttrs, infer=_positions_shape,
            params=lambda a, i: {"weight": (a.max_len + a.offset, _size(i, "dim"))},
            module=lambda a, i, w: (call("LearnedPositions", w.width("x"), w.attr("max_len")) if not a.offset else
                                    call("OffsetLearnedPositions", w.width("x"), w.attr("max_len"),
                                         w.attr("offset"))),
            call=_call_with_cache, uses_cache=True,
            title="Positional Embedding", details=lambda a, i: [f"learned, max_len {a.max_len}"],
            facts=lambda a, i: {"positions": "learned"},
        ),
        OpDef(
            name="relative_position_bias",
            doc="a learned bias per head and bucket of the key's distance from the query, for attention's scores "
                "(T5; Shaw et al., 2018, in Raffel et al.'s bucketed form)",
            family=Family.POSITION, inputs=(Input("x"),), attrs=RelativeBiasAttrs, infer=_relative_bias_shape,
            params=lambda a, i: {"weight": (a.buckets, a.heads)}, check=_relative_bias_check,
            module=lambda a, i, w: call("RelativePositionBias", w.width("x"), w.attr("heads"),
                                        **_unless_default(w, "buckets", a.buckets, 32),
                                        **_unless_default(w, "max_distance", a.max_distance, 128),
                                        **_unless_default(w, "bidirectional", a.bidirectional, True)),
            call=_call_with_cache, uses_cache=True, title="Relative Position Bias",
            details=lambda a, i: [f"{a.buckets} buckets to distance {a.max_distance}, "
                                  f"{'both directions' if a.bidirectional else 'keys before the query'}"],
            facts=lambda a, i: {"positions": "relative"},
        ),
        OpDef(
            name="token_type_embedding",
            doc="BERT's token type embeddings: each position's type's row, given the encoder's token types (a "
                "sentence pair's), else the first type's row for every position",
            family=Family.EMBEDDING, inputs=(Input("x"),), attrs=TokenTypeAttrs, infer=_token_type_shape,
            params=lambda a, i: {"weight": (a.types, _size(i, "dim"))},
            module=lambda a, i, w: call("TokenTypeEmbedding", w.width("x"), **_unless_default(w, "types", a.types, 2)),
            call=_call_module, reads_token_types=True, title="Token Type Embedding",
            details=lambda a, i: [f"{a.types} types, each position's row added"],
        ),
        OpDef(
            name="linear", doc="x W + b", family=Family.FEED_FORWARD,
            inputs=(Input("x"),), attrs=LinearAttrs, infer=_linear_shape,
            params=lambda a, i: _linear_params("", _size(i, "in_features"), a.out, a.bias),
            module=lambda a, i, w: call("nn.Linear", w.width("x"), w.attr("out"),
                                        **_unless_default(w, "bias", a.bias, True)),
            width="out", call=_call_module, title="Linear", output_weight="weight",
            flops=lambda a, i, n, n_in: {"feed_forward": 2 * n * _size(i, "in_features") * a.out},
            details=lambda a, i: [f"{i['in_features']} → {a.out}" + ("" if a.bias else ", no bias")],
        ),
        OpDef(
            name="layer_norm", doc="layer normalization (§3.1, Ba et al. 2016)", family=Family.NORM,
            inputs=(Input("x"),), attrs=LayerNormAttrs, infer=_norm_shape,
            params=lambda a, i: {"weight": (_size(i, "dim"),), **({"bias": (_size(i, "dim"),)} if a.bias else {})},
            module=lambda a, i, w: call("nn.LayerNorm", w.width("x"), **_unless_default(w, "eps", a.eps, 1e-5),
                                        **_unless_default(w, "bias", a.bias, True)),
            call=_call_module, title="Layer Norm", details=lambda a, i: [] if a.bias else ["no bias"],
        ),
        OpDef(
            name="rms_norm", doc="x / sqrt(mean(x^2) + eps) * g: root mean square normalization (Zhang & Sennrich, "
                                 "2019); with offset, * (offset + g) (Gemma's 1 + g)",
            family=Family.NORM, inputs=(Input("x"),), attrs=RMSNormAttrs, infer=_norm_shape,
            params=lambda a, i: {"weight": (_size(i, "dim"),)},
            module=lambda a, i, w: (call("nn.RMSNorm", w.width("x"), eps=w.attr("eps")) if a.offset == 0
                                    else call("RMSNorm", w.width("x"), eps=w.attr("eps"), offset=w.attr("offset"))),
            call=_call_module, title="RMS Norm", details=lambda a, i: [f"× ({a.offset:g} + w)"] if a.offset else [],
        ),
        ROTARY_EMBEDDING,
        ATTENTION_MASK,
        ATTENTION,
        LATENT_ATTENTION,
        SHORT_CONVOLUTION,
        GATED_DELTA_NET,
        MAMBA2,
        EXPERTS,
        ROUTER,
        EXPERT_BANK,
        OpDef(
            name="dropout", doc="dropout (§5.4: residual dropout)", family=Family.REGULARIZATION,
            inputs=(Input("x"),), attrs=DropoutAttrs, infer=_same, params=_no_params, module=None,
            holder=lambda a, w: call("nn.Dropout", w.attr("p")), call=lambda t, i, a, c: call(f"self.{t}", i["x"]),
            title="Dropout", details=lambda a, i: [f"p = {a.p:g}"], facts=lambda a, i: {"dropout": a.p},
            elementwise=True,
        ),
        # GLU variants (Shazeer, 2020) take their names from the activation on the gate.
        _activation("relu", "ReLU", "ReGLU", "max(0, x) (§3.3)", "F.relu"),
        _activation("gelu", "GELU", "GEGLU", "Gaussian error linear unit (Hendrycks & Gimpel, 2016)", "F.gelu"),
        _activation("silu", "SiLU", "SwiGLU", "x * sigmoid(x), also called swish", "F.silu"),
        _activation("sigmoid", "Sigmoid", "GLU", "1 / (1 + exp(-x)): GLU's gate (Dauphin et al., 2017)",
                    "F.sigmoid"),
        _activation("tanh", "Tanh", "", "hyperbolic tangent", "F.tanh"),
        # The tanh approximation of GELU (Gemma's gelu_pytorch_tanh): gating it is Gemma's GeGLU.
        _activation("gelu_tanh", "GELU (tanh)", "GeGLU", "GELU with its tanh approximation",
                    "F.gelu", approximate="tanh"),
        OpDef(
            name="softcap", doc="cap * tanh(x / cap): values squashed smoothly into (-cap, cap) (Gemma 2's logits)",
            family=Family.ACTIVATION, inputs=(Input("x"),), attrs=SoftCapAttrs, infer=_same, params=_no_params,
            module=None, forward_attrs=("cap",),
            call=lambda t, i, a, c: binary(call("F.tanh", binary(i["x"], pyast.Div(), _written(i, a, "cap"))),
                                           pyast.Mult(), _written(i, a, "cap")),
            check=lambda a: [] if a.cap > 0 else [("cap", f"cap = {a.cap}: values are capped at +-cap, so it must "
                                                           "be positive")],
            title="Soft-cap", details=lambda a, i: [f"{a.cap:g} · tanh(x / {a.cap:g})"], elementwise=True,
        ),
        OpDef(
            name="identity", doc="x itself, as a module: what one kind of layer has where another has a module of "
                                 "the same name (ModernBERT's first layer, whose attn_norm is nn.Identity())",
            family=Family.ELEMENTWISE, inputs=(Input("x"),), attrs=NoAttrs, infer=_same, params=_no_params,
            module=lambda a, i, w: call("nn.Identity"), call=_call_module, title="Identity",
        ),
        OpDef(
            name="activation", doc="an activation chosen by name, as a config names it (transformers' hidden_act): "
                                   "one module whose function an edited config changes",
            family=Family.ACTIVATION, inputs=(Input("x"),), attrs=ActivationAttrs, infer=_same, params=_no_params,
            module=lambda a, i, w: call("Activation", w.attr("function")), call=_call_module,
            title="Activation", details=lambda a, i: [a.function], elementwise=True,
        ),
        OpDef(
            name="glu", doc="activation(a) * b, a and b the first and second halves of x: a gated linear unit "
                            "after one projection that makes both (Phi-3's gate_up_proj)",
            family=Family.ACTIVATION, inputs=(Input("x"),), attrs=GLUAttrs, infer=_halves_shape, params=_no_params,
            module=lambda a, i, w: call("GLU", w.attr("activation")), call=_call_module,
            title="Gated Linear Unit", details=lambda a, i: [f"{a.activation}(first half) × second half"],
        ),
        OpDef(
            name="mean_pool", doc="each row's mean over its positions the padding mask leaves, at every position: "
                                  "a text's one state, read wherever its scores are (ModernBERT's mean pooling)",
            family=Family.ELEMENTWISE, inputs=(Input("x"), Input("mask")), attrs=NoAttrs, infer=_mean_pool_shape,
            params=_no_params, module=lambda a, i, w: call("MeanPool"), call=_call_module,
            title="Mean Pool", details=lambda a, i: ["over the positions that are not padding"],
        ),
        _infix("add", pyast.Add, "add", "Add", "a + b, e.g. a residual connection (§3.1)", Family.RESIDUAL),
        _infix("sub", pyast.Sub, "subtract", "Subtract", "a - b", Family.ELEMENTWISE),
        _infix("mul", pyast.Mult, "multiply", "Multiply", "a * b, elementwise: e.g. a GLU's gate", Family.ELEMENTWISE,
               gates=True),
        OpDef(
            name="concat", doc="[a; b]: the features of a, then those of b (DeepSeek-V3's multi-token prediction)",
            family=Family.ELEMENTWISE, inputs=(Input("a"), Input("b")), attrs=NoAttrs, infer=_concat_shape,
            params=_no_params, module=None, title="Concatenate", joins=True,
            call=lambda t, i, a, c: call("torch.cat", pyast.List([i["a"], i["b"]], pyast.Load()), dim=constant(-1)),
        ),
        OpDef(
            name="scale", doc="x * factor", family=Family.ELEMENTWISE,
            inputs=(Input("x"),), attrs=ScaleAttrs, infer=_same, params=_no_params, module=None,
            forward_attrs=("factor",), call=lambda t, i, a, c: binary(i["x"], pyast.Mult(), _written(i, a, "factor")),
            title="Scale", details=lambda a, i: [f"× {a.factor:.4g}"], elementwise=True,
        ),
        OpDef(
            name="input", doc="a model input", family=Family.IO, inputs=(), attrs=IOAttrs,
            infer=_io_shape, params=_no_params, module=None, call=lambda t, i, a, c: variable(a.name),
        ),
        OpDef(
            name="output", doc="a model output", family=Family.IO, inputs=(Input("x"),), attrs=IOAttrs,
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
    return name in OPS and name not in INFIX_OPS and OPS[name].family != Family.IO
