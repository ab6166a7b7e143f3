"""The hyperparameters Table 3 varies, read off a compiled spec's graph (not its parameter names).

Reading the graph means a spec that names its parameters differently, or hard-codes a width inside a
block, still reports what its model really is. Every value is the set of values the graph holds: one
value for the paper's uniform models, several when, e.g., encoder and decoder differ.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Union

from xspec.compiler.ops import OPS
from xspec.compiler.opdef import Family
from xspec.compiler.ir import node_of

if TYPE_CHECKING:
    from xspec.compiler.spec import CompiledSpec

Value = Union[int, float, str, tuple]


@dataclass(frozen=True)
class Architecture:
    """Table 3's columns (plus the vocabulary, which §5.1 fixes per language pair)."""

    layers: Value          # N: layers per stack
    d_model: Value
    d_ff: Value
    heads: Value           # h
    kv_heads: Value        # key/value heads: h, or fewer in grouped-query attention
    d_k: Value
    d_v: Value
    dropout: Value         # P_drop: residual and embedding dropout (§5.4)
    label_smoothing: float  # eps_ls (§5.4): a training setting, from the spec's train section
    positions: Value       # "sinusoidal" (§3.5), "learned" (row E), "rotary" or "alibi"
    vocab: Value

    def as_dict(self) -> dict[str, Value]:
        return asdict(self)


# Column headers in the paper's notation, in Table 3's order.
PAPER_NAMES = {
    "layers": "N", "d_model": "d_model", "d_ff": "d_ff", "heads": "h", "kv_heads": "kv_h", "d_k": "d_k", "d_v": "d_v",
    "dropout": "P_drop", "label_smoothing": "eps_ls", "positions": "positions", "vocab": "vocab",
}


def architecture(spec: CompiledSpec) -> Architecture:
    graph = spec.graph
    facts = [OPS[data["node"].op].facts(data["node"].attrs, data["node"].inferred)
             for _, data in graph.nodes(data=True)]

    def values(name: str) -> Value:
        return _collapse(f[name] for f in facts if name in f)

    stacks = {stack: count for _, data in graph.nodes(data=True) for stack, _, count in data["node"].repeat}
    return Architecture(
        layers=_collapse(stacks.values()) if stacks else 1, d_model=values("d_model"),
        d_ff=_collapse(_ffn_widths(graph)), heads=values("heads"), kv_heads=values("kv_heads"),
        d_k=values("d_k"), d_v=values("d_v"),
        dropout=values("dropout"), label_smoothing=spec.train.label_smoothing, positions=values("positions"),
        vocab=values("vocab"),
    )


def _ffn_widths(graph) -> list[int]:
    """§3.3: the inner width of a feed-forward network is the output of the linear that feeds its activation."""
    widths = []
    for node, data in graph.nodes(data=True):
        if (OPS[data["node"].op].family == Family.FEED_FORWARD
                and any(OPS[node_of(graph, s).op].family == Family.ACTIVATION for s in graph.successors(node))):
            widths.append(data["node"].attrs.out)
        widths += [width for key, width in OPS[data["node"].op].facts(data["node"].attrs, data["node"].inferred).items()
                   if key == "d_ff"]  # a mixture of experts' experts
    return widths


def _collapse(items) -> Value:
    distinct = sorted(set(items), key=str)
    if not distinct:
        return "-"
    return distinct[0] if len(distinct) == 1 else tuple(distinct)
