"""The weights that write into a residual stream, for GPT-2's scaled initialization (Radford et al.,
2019; nanoGPT's `c_proj`): each sublayer's output projection scaled by 1/sqrt(N), N the residual
additions of its stream (2 per layer of a pre-norm decoder), so that the stream's variance does not grow
with depth.

A residual addition is an `add` one of whose operands is computed from the other (`x + f(norm(x))`), or
that adds a branch to a residual addition (PaLM's parallel `x + attn(n(x)) + ffn(n(x))`). Its
writers are found walking back from the other operand: through dropout and scaling; through an
addition or a product of branches (a shared expert beside the routed ones, its gate), into each; ending
at an op whose entry names its output weight (a linear layer's, attention's W^O, the experts' down
projection). A norm on the way (Gemma's sandwich norms) ends the walk with none: it sets the scale
itself."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .ir import Node
from .ops import OPS

if TYPE_CHECKING:
    import networkx as nx

THROUGH = frozenset({"dropout", "scale"})  # ops a writer's output passes unchanged in kind
BRANCHES = frozenset({"add", "mul"})       # ops that join branches, each of which may hold a writer


def residual_writers(nodes: dict[str, Node], graph: nx.DiGraph) -> dict[str, float]:
    """The weight names (`decoder.layers.0.self_attn.out_proj.weight`) and the factor each is scaled by:
    1/sqrt(N), N the residual additions of the top-level module (encoder, decoder, ...) it is in, counting
    those that add a weight's output (not an embedding's positions)."""
    import networkx as nx

    writers: dict[str, str] = {}             # weight -> its stream
    additions: dict[str, int] = {}           # stream -> residual additions
    residual: set[str] = set()
    for node in nodes.values():              # in the order they compute
        a, b = node.inputs.get("a"), node.inputs.get("b")
        if node.op != "add" or not isinstance(a, str) or not isinstance(b, str):
            continue
        for branch, stream in ((b, a), (a, b)):
            found = _writers(nodes, branch)
            if found and (stream in residual or nx.has_path(graph, stream, branch)):
                top = node.scope.split(".", 1)[0]
                additions[top] = additions.get(top, 0) + 1
                writers |= {weight: top for weight in found}
                residual.add(node.id)
                break
    return {weight: 1 / math.sqrt(additions[top]) for weight, top in writers.items()}


def _writers(nodes: dict[str, Node], ref: str) -> list[str]:
    node = nodes.get(ref)
    if node is None:
        return []
    weight = OPS[node.op].output_weight
    if weight is not None and node.module is not None:
        return [f"{node.module}.{weight}"]
    if node.op in THROUGH or node.op in BRANCHES:
        return [w for source in node.inputs.values() if isinstance(source, str) for w in _writers(nodes, source)]
    return []
