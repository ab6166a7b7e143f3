"""What an entry of the op table is (compiler/ops.py): the record every op fills in, and the small helpers
entries share. Ops with much to own (attention, the mixture of experts) keep their entry in a module of
their own, which imports this one; ops.py registers every entry in the one table."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Generic, Optional, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from .shapes import TensorType


class Attrs(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class NoAttrs(Attrs):
    pass


class Family(str, Enum):
    """What kind of op it is: diagrams colour and group boxes by it, reports look for it. A str, so
    it prints, hashes and serializes as its value ("attention")."""

    ATTENTION = "attention"
    RECURRENT = "recurrent"  # a mixer with a state of fixed size (linear attention, state space)
    FEED_FORWARD = "feed_forward"
    EXPERTS = "experts"
    NORM = "norm"
    EMBEDDING = "embedding"
    POSITION = "position"
    ACTIVATION = "activation"
    RESIDUAL = "residual"
    REGULARIZATION = "regularization"
    ELEMENTWISE = "elementwise"
    IO = "io"

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __hash__(self) -> int:
        return hash(str(self.value))


class Written(Protocol):
    """How generated code writes a module's constructor arguments (compiler/lower.py)."""

    def attr(self, name: str) -> ast.expr:
        """The attribute as the spec wrote it over the config (`config.d_ff`), else its value."""
        ...

    def width(self, port: str) -> ast.expr:
        """The last size of the tensor at input `port` as the spec's expressions give it: the attribute
        that made it (`config.d_model` from `embedding(tokens, vocab, d_model)`), followed through the
        ops that keep it."""
        ...

    def from_config(self, name: str) -> bool:
        """Whether the spec wrote the attribute from its parameters: an option then goes into generated
        code even at its default, so that editing the config's field changes the model."""
        ...


@dataclass(frozen=True)
class Input:
    name: str
    optional: bool = False
    # Given by name only (`position_bias = b`): an input added after the attributes a spec may pass by
    # position, which must keep their places.
    keyword: bool = False


Inferred = dict[str, object]  # facts the shape rule derives, e.g. {"in_features": 512}
Shapes = dict[str, TensorType]

# An entry's attribute schema: the entry's functions take the attributes that schema checked.
AttrsT = TypeVar("AttrsT", bound=Attrs)


# An entry of the op table, of attribute schema `AttrsT`. The table holds entries of every schema
# (`OpDef[Any]`): a node's op name, known only when the spec is read, ties its attributes to its entry.
@dataclass(frozen=True)
class OpDef(Generic[AttrsT]):
    name: str
    doc: str  # what it computes, with the paper section
    family: Family  # for diagrams and reports: attention, feed_forward, norm, embedding, ...
    inputs: tuple[Input, ...]
    attrs: type[AttrsT]
    infer: Callable[[Shapes, AttrsT], tuple[TensorType, Inferred]]
    params: Callable[[AttrsT, Inferred], dict[str, tuple[int, ...]]]  # learned tensors, by attribute name
    # Lowering, as Python syntax trees (compiler/python_code.py). `module` builds the nn.Module (None: a
    # plain function of its inputs), its arguments written as the spec wrote them (`Written`); `call` is
    # the forward expression, given the module's attribute path (`self_attn`, `sublayer_1.norm`), the
    # inputs' code and whether it passes the decoder cache on.
    module: Optional[Callable[[AttrsT, Inferred, Written], ast.expr]]
    call: Callable[[str, dict[str, ast.expr], AttrsT, bool], ast.expr]
    # An op without weights that generated code calls through a module of no state (nn.Dropout), which
    # the class whose forward calls it holds, named after the spec's parameter: its constructor.
    holder: Optional[Callable[[AttrsT, Written], ast.expr]] = None
    # The attributes a module-less op's forward code reads (a soft-cap's cap): where the spec computes one
    # from parameters, the class holds it over the config (`self.scale = 1 / math.sqrt(config.d_model)`)
    # and `call` finds that attribute's code among its inputs, under the attribute's name.
    forward_attrs: tuple[str, ...] = ()
    uses_cache: bool = False  # positions and attention continue from the decoder cache
    # Reads each position's token type (BERT's segments): the encoder's token types follow its inputs in
    # the call where its block is given them (entries.TOKEN_TYPES).
    reads_token_types: bool = False
    title: str = ""  # diagrams: the box's title (the paper's words where it has them, Figure 1)
    details: Callable[[AttrsT, Inferred], list[str]] = lambda a, i: []  # diagrams: key attributes
    glu_title: str = ""  # an activation: the name of a gated linear unit it gates ("SwiGLU")
    gates: bool = False  # multiplies two tensors: with an activation on one side, a gated linear unit
    # Rules between arguments that their types cannot state: (argument, message) for each one broken.
    check: Callable[[AttrsT], list[tuple[str, str]]] = lambda a: []
    # Rules over the ops that feed its inputs: given each input port's (op name, attributes), (argument,
    # message) for each one broken (an experts op reads a router's routing, of the same top_k).
    reads: Callable[[AttrsT, dict[str, tuple[str, Attrs]]], list[tuple[str, str]]] = lambda a, producers: []
    # Cost (docs/stats.md), given the sequence positions of one example's output and of each input:
    # forward FLOPs by category (matrix products only), and the values autograd keeps beyond the output.
    flops: Callable[[AttrsT, Inferred, int, dict[str, int]], dict[str, int]] = lambda a, i, n, n_in: {}
    saved: Callable[[AttrsT, Inferred, int, dict[str, int]], int] = lambda a, i, n, n_in: 0
    # What the op says about the model's hyperparameters, by Table 3's column names (`xspec stats`).
    facts: Callable[[AttrsT, Inferred], dict[str, object]] = lambda a, i: {}
    # Tensors the module allocates that are neither learned nor kept, derived when it is built (a positional
    # table), and those checkpoints keep (state_dict's persistent buffers): state that is not learned but
    # changes what the model computes (a router's load-correction bias, which training moves). Memory checks
    # count both.
    buffers: Callable[[AttrsT, Inferred], dict[str, tuple[int, ...]]] = lambda a, i: {}
    state: Callable[[AttrsT, Inferred], dict[str, tuple[int, ...]]] = lambda a, i: {}
    # A self-attention's decoding cache per position: (heads, key features, value features) of the two
    # tensors it keeps (keys and values; a latent attention's latent and rotary key, one "head"), and the
    # window that caps the positions it keeps (None: every one). `xspec stats` and export read it.
    cache: Callable[[AttrsT, Inferred], tuple[tuple[int, int, int], Optional[int]]] = lambda a, i: ((0, 0, 0), None)
    # A recurrent mixer's state per sequence while decoding, in numbers: the same at any length.
    recurrent_state: Callable[[AttrsT, Inferred], int] = lambda a, i: 0
    # Learned tensors' elements a token does not use (a mixture of experts' unchosen experts): the model's
    # active parameters per token are its parameters less these.
    inactive: Callable[[AttrsT, Inferred], int] = lambda a, i: 0
    # The module's keywords whose None turns their option off (an attention's sliding window): the layers a
    # condition chooses between share one call, that keyword chosen (compiler/layer_choice.py).
    optional_keywords: frozenset[str] = frozenset()
    # The attribute whose value is the output's last size (linear: `out`); None: the op keeps the last
    # size of an input (a norm, attention, an addition), which generated code then names as that input's.
    width: Optional[str] = None
    # ... or, where no one attribute is it, the code that computes it from them (int(dim * fraction)).
    width_of: Optional[Callable[[AttrsT, Written], ast.expr]] = None
    # The learned tensor that makes its output (attention's W^O), where the op ends a sublayer whose output
    # is added to a residual stream: the weight a depth-scaled initialization scales (compiler/residual.py).
    output_weight: Optional[str] = None
    joins: bool = False  # the output's last size is its inputs' added (concat): generated code writes the sum
    # A function of one tensor that keeps its shape (an activation, a soft cap): reports that look for
    # the module that makes the logits (the pre-softmax projection) look through it.
    elementwise: bool = False


def size(inferred: Inferred, key: str) -> int:
    """A size the shape rule inferred (`in_features`, `d_model`...): always a whole number."""
    value = inferred[key]
    assert isinstance(value, int), f"{key} = {value!r} is not a size"
    return value


def no_params(attrs: Attrs, inferred: Inferred) -> dict[str, tuple[int, ...]]:
    return {}


def linear_params(prefix: str, n_in: int, n_out: int, bias: bool) -> dict[str, tuple[int, ...]]:
    params: dict[str, tuple[int, ...]] = {f"{prefix}weight": (n_out, n_in)}
    if bias:
        params[f"{prefix}bias"] = (n_out,)
    return params
