"""The op graph the compiler builds, checks and lowers: typed nodes, in the order they were made.

A node is one op applied to its inputs (torch.fx's Node is the model): the op, its checked attributes,
which node feeds each input port, the spec text it comes from, and what validation infers. Nodes are
added only after the nodes they read, so the order of `nodes` is a topological order and the graph
cannot have a cycle. `to_networkx()` gives the same graph as a `networkx.DiGraph`, which is what
`CompiledSpec.graph` exposes to tools (docs/graph.md); the compiler itself never needs networkx.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Optional

if TYPE_CHECKING:
    import networkx as nx

    from .diagnostics import Span
    from .ops import Attrs
    from .shapes import TensorType


@dataclass
class Node:
    id: str                          # "encoder.layers.3.self_attn" (a module path) or "encoder.add_1"
    op: str                          # a key of the op table (compiler/ops.py)
    attrs: "Attrs"                   # checked by the op's attribute schema
    inputs: dict[str, str]           # input port -> the id of the node that feeds it
    span: "Span"                     # the spec text that made it
    module: Optional[str]            # the nn.Module path, for ops with weights
    scope: str                       # the block instance whose body made it
    repeat: tuple[tuple[str, int, int], ...] = ()  # (stack path, index, count) of each enclosing repeat
    cached: bool = False             # in the decoder, where positions and attention continue from the cache
    shape: Optional["TensorType"] = None           # inferred by validation
    inferred: dict[str, object] = field(default_factory=dict)  # facts the shape rule derives

    def attributes(self) -> dict[str, object]:
        """The node as networkx attribute data (docs/graph.md)."""
        return {"op": self.op, "attrs": self.attrs, "span": self.span, "module": self.module, "scope": self.scope,
                "repeat": self.repeat, "shape": self.shape, "inferred": self.inferred, "cached": self.cached}


class OpGraph:
    """Nodes by id, in creation (and so topological) order."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}

    def add(self, node: Node) -> Node:
        assert node.id not in self.nodes, f"node {node.id} made twice"
        assert all(source in self.nodes for source in node.inputs.values()), f"{node.id} reads a node made later"
        self.nodes[node.id] = node
        return node

    def __contains__(self, node_id: str) -> bool:
        return node_id in self.nodes

    def __getitem__(self, node_id: str) -> Node:
        return self.nodes[node_id]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes.values())

    def __len__(self) -> int:
        return len(self.nodes)

    def descendants(self, node_id: str) -> set[str]:
        """The nodes that depend on `node_id`, found in one pass over the topological order."""
        reached = {node_id}
        for node in self.nodes.values():
            if any(source in reached for source in node.inputs.values()):
                reached.add(node.id)
        return reached - {node_id}

    def to_networkx(self) -> "nx.DiGraph":
        """A `networkx.DiGraph` of the same nodes; an edge's `ports` are the inputs its source feeds."""
        import networkx as nx

        graph = nx.DiGraph()
        for node in self.nodes.values():
            graph.add_node(node.id, **node.attributes())
            for port, source in node.inputs.items():
                if graph.has_edge(source, node.id):  # attention(h, h, h): one edge, three ports
                    graph.edges[source, node.id]["ports"] += (port,)
                else:
                    graph.add_edge(source, node.id, ports=(port,))
        return graph
