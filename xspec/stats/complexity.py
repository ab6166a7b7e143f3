"""The paper's Table 1 (§4, "Why self-attention"), evaluated at a spec's sequence length n and width d.

Table 1 compares layer types by complexity per layer, sequential operations and maximum path length
between any two positions. The attention rows describe the spec's own layers, found in its graph;
the recurrent, convolutional and restricted self-attention rows are the paper's formulas at the same
n and d, for comparison only (the spec has no such layers), with kernel width k and neighbourhood r
as options.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xspec.compiler.ops import OPS
from xspec.compiler.opdef import Family
from xspec.compiler.ir import node_of

if TYPE_CHECKING:
    from xspec.compiler.spec import CompiledSpec


@dataclass(frozen=True)
class Table1Row:
    layer: str
    formula: tuple[str, str, str]       # the paper's O(...) entries
    complexity: float                   # the formula evaluated at n, d (k, r)
    sequential: float
    path_length: float
    in_spec: int                        # how many such layers the spec has (0: comparison row)
    multiply_adds: int | None = None  # the exact QK^T and AV multiply-adds of one such layer, from the graph


def attention_kinds(spec: CompiledSpec) -> dict[str, list[str]]:
    """The spec's attention layers by kind: self-attention, masked (causal) self-attention, and
    attention over another sequence (the decoder's encoder-decoder attention, §3.2.3), by the role
    validation recorded on each."""
    kinds: dict[str, list[str]] = {}
    for node, data in spec.graph.nodes(data=True):
        if OPS[data["node"].op].family != Family.ATTENTION:
            continue
        if not data["node"].inferred["self_attention"]:
            kind = "encoder-decoder attention"
        elif data["node"].attrs.causal:
            kind = "self-attention (masked)"
        else:
            kind = "self-attention"
        kinds.setdefault(kind, []).append(node)
    return kinds


def table1(spec: CompiledSpec, n: int, d: int, kernel: int, neighbourhood: int) -> list[Table1Row]:
    rows = []
    for kind, nodes in attention_kinds(spec).items():
        node = node_of(spec.graph, nodes[0])
        facts = OPS[node.op].facts(node.attrs, node.inferred)  # heads, d_k, d_v of any kind of attention
        heads, d_k, d_v = (int(facts[name]) for name in ("heads", "d_k", "d_v"))  # type: ignore[call-overload]
        # During training every position is computed at once, masked or not: O(1) sequential steps,
        # and any two positions are one attention step apart.
        rows.append(Table1Row(kind, ("O(n^2 d)", "O(1)", "O(1)"), n * n * d, 1, 1, len(nodes),
                              multiply_adds=n * n * heads * (d_k + d_v)))
    rows += [
        Table1Row("recurrent (comparison)", ("O(n d^2)", "O(n)", "O(n)"), n * d * d, n, n, 0),
        Table1Row(f"convolutional, k={kernel} (comparison)", ("O(k n d^2)", "O(1)", "O(log_k(n))"),
                  kernel * n * d * d, 1, math.log(n, kernel) if kernel > 1 else n, 0),
        Table1Row(f"self-attention restricted, r={neighbourhood} (comparison)", ("O(r n d)", "O(1)", "O(n/r)"),
                  neighbourhood * n * d, 1, n / neighbourhood, 0),
    ]
    return rows
