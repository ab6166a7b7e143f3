"""What the compiler builds, checks and lowers: the op graph, the module tree, and each module's program.

The op graph holds typed nodes in the order they were made. A node is one op applied to its inputs
(torch.fx's Node is the model): the op, its checked attributes, which node feeds each input port, the
spec text it comes from, and what validation infers. Nodes are added only after the nodes they read, so
the order of `nodes` is a topological order and the graph cannot have a cycle. `to_networkx()` gives the
same graph as a `networkx.DiGraph` whose nodes hold these records, which is what `CompiledSpec.graph`
exposes to tools (docs/graph.md); the compiler itself never needs networkx.

The graph is every layer expanded; the code keeps the spec's structure. So each module of the tree (an
`Instance`: an entry block, a block call, a repeated stack, an op with weights) also holds the program
of its `forward`: the steps that compute it, in order, each one line of generated code. A step reads and
defines values by ref: a string naming one runtime value (a tensor or a function) within the forward
that computes it. An op step's ref is its graph node's id, which ties the program to the graph.
"""

from __future__ import annotations

import ast as pyast
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Iterator, Literal, Mapping, Optional, Union

import pydantic

from .diagnostics import Span
from .opdef import Attrs
from .shapes import TensorType

if TYPE_CHECKING:
    import networkx as nx

    from . import ast
    from .opdef import AttrsT


# Every field's type is checked when a node is made (strictly: no coercion); validation fills `shape` and
# `inferred` afterwards.
@pydantic.dataclasses.dataclass(config=pydantic.ConfigDict(arbitrary_types_allowed=True, strict=True))
class Node:
    id: str                          # "encoder.layers.3.self_attn" (a module path) or "encoder.add_1"
    op: str                          # a key of the op table (compiler/ops.py)
    attrs: Attrs                     # checked by the op's attribute schema
    inputs: dict[str, str]           # input port -> the id of the node that feeds it
    span: Span                       # the spec text that made it
    module: Optional[str]            # the nn.Module path, for ops with weights
    scope: str                       # the block instance whose body made it
    repeat: tuple[tuple[str, int, int], ...] = ()  # (stack path, index, count) of each enclosing repeat
    cached: bool = False             # in the decoder, where positions and attention continue from the cache
    shape: Optional[TensorType] = None             # inferred by validation
    inferred: dict[str, object] = field(default_factory=dict)  # facts the shape rule derives
    # Attributes the spec wrote as parameters: their expression over the generated config
    # (`config.d_ff`, a Python syntax tree), which generated code writes instead of the value
    # (compiler/config.py).
    sources: dict[str, pyast.expr] = field(default_factory=dict)

    def attrs_as(self, schema: type[AttrsT]) -> AttrsT:
        """Its attributes, read as the schema of its op (`node.attrs_as(AttentionAttrs).causal`): the
        graph holds nodes of every op, so `attrs` is typed only as some schema."""
        assert isinstance(self.attrs, schema), f"{self.id}: {self.op}'s attributes are not {schema.__name__}"
        return self.attrs

    def checked_shape(self) -> TensorType:
        """Its shape, which validation has inferred for every node of a compiled spec."""
        assert self.shape is not None, f"{self.id}: its shape is read before validation inferred it"
        return self.shape

    def to_json(self) -> dict[str, object]:
        """The node as graph.json writes it (docs/graph.md)."""
        return {"id": self.id, "op": self.op, "attrs": self.attrs.model_dump(),
                "shape": str(self.shape) if self.shape is not None else None, "module": self.module,
                "span": f"{self.span.file}:{self.span.line}:{self.span.col}", "repeat": [list(r) for r in self.repeat]}


@dataclass(frozen=True)
class Const:
    """A constant a step passes or a program returns (a number, string or boolean): written as a literal."""
    value: object


Operand = Union[str, Const]  # a value's ref, or a constant


@dataclass
class Program:
    """The body of a forward, of a spec function (`h => ...`), or of one iteration of a repeat."""

    params: dict[str, str] = field(default_factory=dict)  # argument name -> the ref it binds, in order
    steps: list["Step"] = field(default_factory=list)
    results: tuple[Operand, ...] = ()
    hints: dict[str, str] = field(default_factory=dict)  # ref -> the spec name it was assigned to

    def hint(self, ref: str, name: str) -> None:
        self.hints.setdefault(ref, name)

    def reads(self) -> set[str]:
        """The refs its steps and results read, inside loops and functions too."""
        refs = {r for r in self.results if isinstance(r, str)}
        for step in self.steps:
            refs |= step.reads()
        return refs


@dataclass
class Step:
    """One line of generated code (a loop or a function: a few lines around its own program).

    kind      target                   inputs                          outputs
    op        the graph node           the op's input ports            the node
    block     the child module's name  its forward's arguments         its result
    stack     the stack's name         -                               each value the loop carries out
    layer     -                        the layer's arguments           its results (in a stack's body only)
    function  the function's id        -                               the function (`None` if never called)
    apply     the spec's name for it   "fn"; "x" unless `argument`     its result
    branch    -                        -                               what either arm yields (its `results`)
    """

    kind: Literal["op", "block", "stack", "layer", "function", "apply", "branch"]
    target: str
    inputs: dict[str, Operand]
    outputs: tuple[str, ...]
    span: "Span"
    body: Optional[Program] = None  # stack: the first layer's iteration; function: its body once called
    # stack: for each value the loop carries, its ref before the loop, as the body reads it, after the
    # first layer and after the last (the first two None where only the layers define it). The loop gives
    # the last three one local name.
    carried: tuple[tuple[Optional[str], Optional[str], str, str], ...] = ()
    argument: Optional[Const] = None  # apply: the constant passed, where it is one
    # branch: a layer class's choice by its kind (compiler/layer_branches.py): the arm `body` runs where
    # `condition` (code over the layer's own attributes) holds, else `orelse`; each arm's results, in
    # the order of `outputs`, take their names.
    orelse: Optional[Program] = None
    condition: Optional[pyast.expr] = None
    also: tuple[Span, ...] = ()  # other spec lines it stands for (a step two kinds of layer write at two)

    def reads(self) -> set[str]:
        """The refs it reads, inside its loop's or function's body (or a branch's arms) too."""
        refs = {v for v in self.inputs.values() if isinstance(v, str)}
        refs.update(before for before, _, _, _ in self.carried if before is not None)
        for program in self.programs():
            refs |= program.reads()
        return refs

    def programs(self) -> list[Program]:
        """The programs it holds: a loop's or function's body, or a branch's two arms."""
        return [program for program in (self.body, self.orelse) if program is not None]

    def reading(self, renamed: Mapping[str, Operand]) -> Step:
        """The step reading renamed[ref] wherever it read ref, in the programs it holds too."""
        if not renamed:
            return self

        def read(operand: Operand) -> Operand:
            return renamed.get(operand, operand) if isinstance(operand, str) else operand

        def read_ref(ref: Optional[str]) -> Optional[str]:
            value = read(ref) if ref is not None else None
            assert value is None or isinstance(value, str), f"{ref}: a value carried by a loop became a constant"
            return value

        def program(inner: Optional[Program]) -> Optional[Program]:
            if inner is None:
                return None
            return Program(inner.params, [step.reading(renamed) for step in inner.steps],
                           tuple(read(r) for r in inner.results), inner.hints)

        carried = tuple((read_ref(before), loop, first, last) for before, loop, first, last in self.carried)
        return replace(self, inputs={port: read(value) for port, value in self.inputs.items()},
                       body=program(self.body), orelse=program(self.orelse), carried=carried)


@dataclass
class Instance:
    """A module of the model: an entry block, a block call, a repeated stack, or an op with weights."""

    path: str
    kind: Literal["block", "stack", "op"]
    span: "Span"
    block_name: Optional[str] = None  # the spec block it runs (none for a layer of a repeat's own body)
    block_span: Optional["Span"] = None  # where that block is defined (`span` is where it is called)
    children: dict[str, "Instance"] = field(default_factory=dict)
    program: Program = field(default_factory=Program)  # blocks: the forward
    node: Optional[str] = None  # ops: the graph node
    has_cache: bool = False  # forward() takes the decoder cache
    has_token_types: bool = False  # forward() takes the encoder's token types (entries.TOKEN_TYPES)
    result_node: Optional[str] = None  # blocks: the graph node of the tensor they return
    count_source: Optional[pyast.expr] = None  # stacks: their count read from the config (`config.layers`), if so
    # Stacks of one block call passed the layer's index as it is (`repeat i in layers { lm_layer(x, i) }`):
    # the block parameter that receives it, by which a layer's class may choose its modules.
    index_param: Optional[str] = None
    # Blocks: the arguments given as constants, each with the expression that gave it (`lm_layer(x, layers)`:
    # {"i": (layers, 2)}).
    constant_args: dict[str, tuple["ast.Expr", object]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]


class OpGraph:
    """Nodes by id, in creation (and so topological) order."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}

    @classmethod
    def of(cls, nodes: dict[str, Node]) -> OpGraph:
        """A graph of these nodes, in this order (which must be topological)."""
        graph = cls()
        graph.nodes = dict(nodes)
        return graph

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
        """A `networkx.DiGraph` of the same nodes, each holding its record (`graph.nodes[n]["node"]`, read
        with `node_of`); an edge's `ports` are the inputs its source feeds."""
        import networkx as nx

        graph = nx.DiGraph()
        for node in self.nodes.values():
            graph.add_node(node.id, node=node)
            for port, source in node.inputs.items():
                if graph.has_edge(source, node.id):  # attention(h, h, h): one edge, three ports
                    graph.edges[source, node.id]["ports"] += (port,)
                else:
                    graph.add_edge(source, node.id, ports=(port,))
        return graph


def node_of(graph: "nx.DiGraph", node_id: str) -> Node:
    """The typed record of a node of `CompiledSpec.graph` (or of a view made from it)."""
    record = graph.nodes[node_id]["node"]
    assert isinstance(record, Node), f"{node_id} holds no node record"
    return record


def lint_programs(root: Instance, graph: OpGraph) -> None:
    """Invariants of the module tree's programs (bugs, not user errors): each step reads values defined
    before it, in its forward or in what encloses it; each names a node, child or body that exists."""
    pending = [root]
    while pending:
        instance = pending.pop()
        pending += instance.children.values()
        if instance.kind == "block" and instance.path:
            lint_program(instance, graph)


def lint_program(instance: Instance, graph: OpGraph) -> None:
    """The invariants of one block instance's forward (`lint_programs`)."""
    _lint_program(instance.program, set(), instance, graph, in_loop=False)


def _lint_program(program: Program, outer: set[str], instance: Instance, graph: OpGraph, in_loop: bool) -> None:
    scope = outer | set(program.params.values())
    for step in program.steps:
        read = {v for v in step.inputs.values() if isinstance(v, str)}
        assert read <= scope, f"{instance.path}: a {step.kind} step reads {sorted(read - scope)} before they are made"
        if step.kind == "op":
            node = graph[step.target]
            assert step.outputs == (node.id,) and set(step.inputs) == set(node.inputs), f"{node.id}: step, node differ"
        elif step.kind in ("block", "stack"):
            assert instance.children[step.target].kind == step.kind, f"{instance.path}.{step.target} is no {step.kind}"
        elif step.kind == "layer":
            assert in_loop, f"{instance.path}: a layer step outside a stack's loop"
        if step.kind == "stack":
            assert step.body is not None
            befores = {before for before, _, _, _ in step.carried if before is not None}
            assert befores <= scope, f"{instance.path}.{step.target} carries values made after it"
            loops = {loop for _, loop, _, _ in step.carried if loop is not None}
            _lint_program(step.body, scope | loops, instance, graph, in_loop=True)
            firsts = {first for _, _, first, _ in step.carried}
            assert firsts <= _defined(step.body), f"{instance.path}.{step.target}: the loop does not make its values"
        elif step.kind == "function" and step.body is not None:
            assert len(step.body.params) == 1, f"{step.target} takes {len(step.body.params)} arguments"
            _lint_program(step.body, scope, instance, graph, in_loop=False)
        elif step.kind == "branch":
            assert step.body is not None and step.orelse is not None and step.condition is not None
            for arm in (step.body, step.orelse):
                _lint_program(arm, scope, instance, graph, in_loop)
                assert len(arm.results) == len(step.outputs), f"{instance.path}: an arm yields other values"
            assert step.body.results == step.outputs, f"{instance.path}: a branch's outputs are not its arm's"
        scope.update(step.outputs)
    returned = {r for r in program.results if isinstance(r, str)}
    assert returned <= scope, f"{instance.path} returns {sorted(returned - scope)}, which it does not make"


def _defined(program: Program) -> set[str]:
    return {ref for step in program.steps for ref in step.outputs}
