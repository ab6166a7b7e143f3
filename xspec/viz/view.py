"""What an architecture diagram shows, read off the compiled graph: boxes, arrows and frames.

Everything here is derived from the graph's structure (ops, scopes, `repeat` frames, ports and op
families), never from block names, so a spec that names its blocks differently draws the same way.

Levels of detail (`--depth`):
  "1"    blocks: each child of an entry block (embeddings, a repeated stack, the output projection)
         is one box;
  "2"    sublayers, the level of the paper's Figure 1: attention, feed-forward, "Add & Norm",
         embeddings, positional encodings, output projection;
  "full" every op; architecture.py also opens each attention op into the paper's Figure 2.

A repeated stack is drawn once, as its first layer, in a frame labelled "N×" (Figure 1). A stack whose
layers differ by their index (Gemma 3's local and global attention, dense and mixture-of-experts
feed-forwards) is drawn as one layer of each kind, each in a frame of its own inside the stack's, saying
how many layers it stands for and which.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Optional

import networkx as nx

from xspec.compiler.ops import OPS, IOAttrs
from xspec.compiler.opdef import Family
from xspec.compiler.ir import node_of

if TYPE_CHECKING:
    from xspec.compiler.ir import Instance
    from xspec.compiler.spec import CompiledSpec

DEPTHS = ("1", "2", "full")

# Ops that a residual connection skips around: a skip around only a positional encoding (the
# embeddings' "e + positions(e)") is not a residual connection.
_SUBLAYER_FAMILIES = frozenset({Family.ATTENTION, Family.RECURRENT, Family.FEED_FORWARD, Family.NORM,
                                Family.ACTIVATION})
# A block made only of these is a position-wise feed-forward network, drawn as one box at depth 2.
_DENSE_FAMILIES = frozenset({Family.FEED_FORWARD, Family.ACTIVATION, Family.REGULARIZATION, Family.ELEMENTWISE})


@dataclass
class Unit:
    """One box of the diagram: a single op, "Add & Norm", or a collapsed block or stack."""

    id: str
    kind: str  # "op", "add_norm", "block" or "stack"
    ops: list[str]  # the graph nodes it stands for, in graph order
    instance: Optional[str] = None  # the collapsed block or stack (kinds "block", "stack")
    folded: list[str] = field(default_factory=list)  # ops drawn as a note (dropout), not a box


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    ports: tuple[str, ...]
    role: str  # "data", "residual", "cross_attention", "length", "mask"


@dataclass
class Frame:
    """A drawn frame: an entry block, a repeated stack (with its count), or a block at depth full."""

    path: str
    kind: str  # "entry", "stack", "kind" (the first layer of a kind, in a stack of several) or "block"
    parent: Optional[str]
    count: Optional[int] = None  # layers in a stack, or of a kind
    layers: str = ""  # a kind's layers: "0-4, 6-10"


@dataclass
class View:
    spec: "CompiledSpec"
    depth: str
    graph: nx.DiGraph  # the first layer of every stack, as `canonical_graph` builds it
    units: dict[str, Unit]
    unit_of: dict[str, str]  # graph node -> unit id
    edges: list[Edge]
    frames: dict[str, Frame]
    frame_of: dict[str, Optional[str]]  # unit id -> innermost frame path (None: top level)
    instances: dict[str, "Instance"]
    hidden: set[str]  # units left out of the drawing (mask inputs, intermediate outputs)
    counts: dict[str, int]  # stack path -> number of layers
    kinds: dict[str, dict[int, int]] = field(default_factory=dict)  # stack -> layer -> the first layer of its kind

    def frames_count(self, stack: str) -> int:
        return self.counts[stack]

    def drawn_edges(self) -> list[Edge]:
        return [e for e in self.edges if e.src not in self.hidden and e.dst not in self.hidden]


def build_view(spec: "CompiledSpec", depth: str) -> View:
    if depth not in DEPTHS:
        raise ValueError(f"depth must be one of {DEPTHS}, got {depth!r}")
    kinds = layer_kinds(spec.graph)
    graph = canonical_graph(spec.graph, kinds)
    instances = _instances_by_path(spec.instances)
    unit_of, units = _assign_units(graph, instances, depth)
    frames = _frames(graph, instances, depth, units, kinds)
    frame_of = {uid: _innermost_frame(_location(unit, graph), frames) for uid, unit in units.items()}
    edges = _unit_edges(graph, unit_of, units)
    hidden = set() if depth == "full" else {uid for uid in units if _is_hidden_io(graph, uid)}
    return View(spec, depth, graph, units, unit_of, edges, frames, frame_of, instances, hidden, stack_counts(graph),
                kinds)


def family(graph: nx.DiGraph, node: str) -> str:
    """The op's family (compiler/ops.py): what diagrams know of an op, never its name."""
    return OPS[node_of(graph, node).op].family


def _is_hidden_io(graph: nx.DiGraph, node: str) -> bool:
    """Figure 1 draws neither the padding masks (attention boxes say they use one) nor an output
    that other ops also read (the encoder output, drawn as the arrow into cross-attention)."""
    data = graph.nodes[node] if node in graph else None
    if data is None or family(graph, node) != Family.IO:
        return False
    if data["node"].attrs.kind != "output":
        return data["node"].attrs.kind == "mask"
    (producer,) = graph.predecessors(node)
    return graph.out_degree(producer) > 1


# --- the first layer of each stack ---------------------------------------------------------


Kinds = dict[str, dict[int, int]]  # stack path -> layer index -> the first layer of the same kind


def layer_kinds(graph: nx.DiGraph) -> Kinds:
    """Each stack's layers by kind: layers of one kind compute the same ops with the same attributes (the
    paper's stacks are all of one kind; Gemma 3's has a local and a global kind)."""
    ops: dict[str, dict[int, list]] = {}
    for node, data in graph.nodes(data=True):
        for stack, index, _ in data["node"].repeat:
            prefix = f"{stack}.{index}."
            relative = node[len(prefix):] if node.startswith(prefix) else node
            ops.setdefault(stack, {}).setdefault(index, []).append((relative, data["node"].op, data["node"].attrs))
    kinds: Kinds = {}
    for stack, layers in ops.items():
        first: dict[tuple, int] = {}
        kinds[stack] = {index: first.setdefault(tuple(sorted(layer, key=lambda o: o[:2])), index)
                        for index, layer in sorted(layers.items())}
    return kinds


def canonical_graph(graph: nx.DiGraph, kinds: Optional[Kinds] = None) -> nx.DiGraph:
    """The graph with each repeated stack cut down to its first layer (of each kind, given `kinds`).

    Nodes of later layers map onto the same node in the first layer of their kind; edges that carry a
    value from one layer to the next are dropped (the "N×" frame stands for them), except from a kind to
    one first met later (local to global attention). The stack's output, read by later ops (the encoder
    output feeding every decoder layer), then comes from the first layer of its last layer's kind.
    """
    kept = nx.DiGraph()
    for node, data in graph.nodes(data=True):
        if all(index == _first(kinds, stack, index) for stack, index, _ in data["node"].repeat):
            kept.add_node(node, **data)
    for src, dst, ports in graph.edges(data="ports"):
        src_frames, dst_frames = node_of(graph, src).repeat, node_of(graph, dst).repeat
        a, b = canonical_node(src, src_frames, kinds), canonical_node(dst, dst_frames, kinds)
        if _crosses_iterations(src_frames, dst_frames) and not _into_a_later_kind(src_frames, dst_frames, kinds):
            continue
        if a in kept and b in kept:
            previous = kept.edges[a, b]["ports"] if kept.has_edge(a, b) else ()
            kept.add_edge(a, b, ports=previous + tuple(p for p in ports if p not in previous))
    # Each kept node's record reads what the view's edges bring it (the first layer's nodes, not a later
    # layer's).
    for node in kept:
        inputs = {port: source for source, _, ports in kept.in_edges(node, data="ports") for port in ports}
        kept.nodes[node]["node"] = dataclasses.replace(node_of(kept, node), inputs=inputs)
    return kept


def _first(kinds: Optional[Kinds], stack: str, index: int) -> int:
    return kinds[stack][index] if kinds is not None and stack in kinds else 0


def _into_a_later_kind(src_frames: tuple, dst_frames: tuple, kinds: Optional[Kinds]) -> bool:
    """An edge from one layer to the next whose kinds differ, the next's first met later than the first's."""
    src_index = {stack: index for stack, index, _ in src_frames}
    return any(stack in src_index and _first(kinds, stack, src_index[stack]) < _first(kinds, stack, index)
               for stack, index, _ in dst_frames)


def canonical_node(node: str, frames: tuple, kinds: Optional[Kinds] = None) -> str:
    """`encoder.layers.3.ffn.w_1` -> `encoder.layers.0.ffn.w_1` (the first layer of layer 3's kind, given
    `kinds`), for every enclosing `repeat`."""
    renamed: list[tuple[str, str]] = []
    for stack, index, _ in frames:  # outermost first; inner stack paths contain the outer index
        first = _first(kinds, stack, index)
        for old, new in renamed:
            stack = stack.replace(old, new, 1)
        old, new = f"{stack}.{index}.", f"{stack}.{first}."
        node = node.replace(old, new, 1) if node.startswith(old) else node
        renamed.append((old, new))
    return node


def kind_layers(kinds: Kinds, stack: str, first: int) -> list[int]:
    """The layers of the kind whose first layer is `first`."""
    return [index for index, kind in kinds.get(stack, {}).items() if kind == first]


def layer_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 3, 4, 6, 7] -> "0-4, 6-7"."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def kind_letter(kinds: Kinds, stack: str, first: int) -> str:
    """The letter that names the kind whose first layer is `first` (A for the kind of layer 0, B for the next
    kind to appear, ...), as the stack's schedule writes it."""
    firsts = sorted(set(kinds[stack].values()))
    return _letter(firsts.index(first))


def _letter(number: int) -> str:
    return chr(ord("A") + number) if number < 26 else f"K{number}"


def schedule(kinds: Kinds, stack: str) -> str:
    """The stack's layers in the order they run, by kind letter: its period repeated where it has one
    (Qwen3-Next's "(A×3 B)×12"; Gemma 3's 26 layers, "(A×5 B)×4 A×2"), else each run of one kind in turn."""
    firsts = sorted(set(kinds[stack].values()))
    letters = [_letter(firsts.index(kinds[stack][i])) for i in sorted(kinds[stack])]
    period = next((p for p in range(1, len(letters) // 2 + 1)
                   if all(letters[i] == letters[i % p] for i in range(len(letters)))), None)
    if period is None:
        return _runs(letters)
    repeats, rest = divmod(len(letters), period)
    return f"({_runs(letters[:period])})×{repeats}" + (f" {_runs(letters[:rest])}" if rest else "")


def _runs(letters: list[str]) -> str:
    """["A", "A", "B"] -> "A×2 B"."""
    runs: list[list] = []
    for letter in letters:
        if runs and runs[-1][0] == letter:
            runs[-1][1] += 1
        else:
            runs.append([letter, 1])
    return " ".join(letter if count == 1 else f"{letter}×{count}" for letter, count in runs)


def _crosses_iterations(src_frames: tuple, dst_frames: tuple) -> bool:
    """True for an edge from one iteration of a `repeat` to another (layer i -> layer i + 1)."""
    src_index = {stack: index for stack, index, _ in src_frames}
    return any(stack in src_index and src_index[stack] != index for stack, index, _ in dst_frames)


def stack_counts(graph: nx.DiGraph) -> dict[str, int]:
    """Each stack's path (in layer 0 terms) and its number of layers, from the `repeat` frames."""
    counts: dict[str, int] = {}
    for node, data in graph.nodes(data=True):
        frames = data["node"].repeat
        for depth, (stack, _, count) in enumerate(frames):
            counts[canonical_node(stack + ".", frames[:depth]).removesuffix(".")] = count
    return counts


# --- boxes ------------------------------------------------------------------------------------


def _instances_by_path(root: "Instance") -> dict[str, "Instance"]:
    found: dict[str, "Instance"] = {}
    pending = list(root.children.values())
    while pending:
        instance = pending.pop()
        found[instance.path] = instance
        pending.extend(instance.children.values())
    return found


class _Placement(NamedTuple):
    """Where one graph node goes: into which box, and whether it is only a note on that box."""

    unit: str
    kind: str = "op"
    instance: Optional[str] = None  # the block or stack the box collapses
    folded: bool = False


def _assign_units(graph: nx.DiGraph, instances: dict, depth: str) -> tuple[dict[str, str], dict[str, Unit]]:
    unit_of: dict[str, str] = {}
    units: dict[str, Unit] = {}
    dense = _dense_blocks(graph, instances) if depth == "2" else set()
    for node in nx.topological_sort(graph):  # producers first: folding looks up their boxes
        place = _place(graph, node, depth, unit_of, instances, dense)
        unit = units.setdefault(place.unit, Unit(place.unit, place.kind, [], place.instance))
        if place.kind == "add_norm":  # the norm joins the add's box
            unit.kind = "add_norm"
        (unit.folded if place.folded else unit.ops).append(node)
        unit_of[node] = place.unit
    return unit_of, units


def _place(graph: nx.DiGraph, node: str, depth: str, unit_of: dict[str, str], instances: dict,
           dense: set[str]) -> _Placement:
    data = graph.nodes[node]
    if family(graph, node) == Family.IO or depth == "full":
        return _Placement(node)
    if depth == "1":
        block = _entry_child(data["node"].scope, instances)
        return _Placement(block, instances[block].kind, block) if block else _Placement(node)
    # depth 2: the paper's Figure 1
    if data["node"].scope in dense:
        return _Placement(data["node"].scope, "block", data["node"].scope)
    producer = _single_producer(graph, node)
    if family(graph, node) == Family.REGULARIZATION and producer is not None and family(graph, producer) != Family.IO:
        return _Placement(unit_of[producer], folded=True)  # §5.4: dropout on a sublayer's output
    if family(graph, node) == Family.NORM and producer is not None and _is_post_norm(graph, producer, node):
        return _Placement(unit_of[producer], "add_norm")  # §3.1: LayerNorm(x + Sublayer(x))
    return _Placement(node)


def _entry_child(scope: str, instances: dict) -> Optional[str]:
    """At depth 1, the child of an entry block that holds an op (None: the op sits in the entry)."""
    parts = scope.split(".")
    if len(parts) < 2:
        return None
    path = ".".join(parts[:2])
    return path if path in instances else None


def _dense_blocks(graph: nx.DiGraph, instances: dict) -> set[str]:
    """Blocks made only of linear layers and activations (§3.3's FFN), without sub-blocks."""
    ops_in: dict[str, list[str]] = {}
    for node, data in graph.nodes(data=True):
        ops_in.setdefault(data["node"].scope, []).append(data["node"].op)
    dense = set()
    for path, ops in ops_in.items():
        instance = instances.get(path)
        if instance is None or instance.kind != "block" or any(c.kind != "op" for c in instance.children.values()):
            continue
        families = {OPS[op].family for op in ops}
        if families <= _DENSE_FAMILIES and sum(OPS[op].family != Family.REGULARIZATION for op in ops) >= 2:
            dense.add(path)
    return dense


def _single_producer(graph: nx.DiGraph, node: str) -> Optional[str]:
    producers = list(graph.predecessors(node))
    return producers[0] if len(producers) == 1 else None


def _is_post_norm(graph: nx.DiGraph, add: str, norm: str) -> bool:
    """An add whose only reader is this norm, in the same block: one "Add & Norm" box."""
    return (family(graph, add) == Family.RESIDUAL and list(graph.successors(add)) == [norm]
            and node_of(graph, add).scope == node_of(graph, norm).scope)


# --- arrows -----------------------------------------------------------------------------------


def residual_sources(graph: nx.DiGraph, add: str) -> set[str]:
    """The operand(s) of an add that skip around a sublayer (§3.1's residual connection): the
    operand from which the other one is computed, through attention, feed-forward or a norm."""
    sources = node_of(graph, add).inputs
    if set(sources) != {"a", "b"}:
        return set()
    found = set()
    for skip, other in ((sources["a"], sources["b"]), (sources["b"], sources["a"])):
        if skip == other or not nx.has_path(graph, skip, other):
            continue
        between = (nx.descendants(graph, skip) & nx.ancestors(graph, other)) | {other}
        if any(OPS[node_of(graph, n).op].family in _SUBLAYER_FAMILIES for n in between):
            found.add(skip)
    return found


def edge_role(graph: nx.DiGraph, src: str, dst: str) -> str:
    ports = graph.edges[src, dst]["ports"]
    if family(graph, src) == Family.IO and node_of(graph, src).attrs_as(IOAttrs).kind == "mask":
        return "mask"
    if family(graph, dst) == Family.RESIDUAL and src in residual_sources(graph, dst):
        return "residual"
    if (family(graph, dst) == Family.ATTENTION and "query" not in ports
            and node_of(graph, dst).inputs.get("query") != src):
        return "cross_attention"  # §3.2.3: keys and values from the encoder output
    if family(graph, dst) == Family.POSITION:
        return "length"  # a positional encoding reads only the length of its input
    return "data"


def _unit_edges(graph: nx.DiGraph, unit_of: dict[str, str], units: dict[str, Unit]) -> list[Edge]:
    merged: dict[tuple[str, str, str], tuple[str, ...]] = {}
    for src, dst, ports in graph.edges(data="ports"):
        a, b = unit_of[src], unit_of[dst]
        if a == b:
            continue
        key = (a, b, edge_role(graph, src, dst))
        merged[key] = merged.get(key, ()) + tuple(p for p in ports if p not in merged.get(key, ()))
    # A residual edge into a box that the same source also feeds directly (depth 1, where a whole
    # layer is one box) adds nothing.
    return [Edge(a, b, ports, role) for (a, b, role), ports in merged.items()
            if not (role == "residual" and (a, b, "data") in merged)]


# --- frames -----------------------------------------------------------------------------------


def _frames(graph: nx.DiGraph, instances: dict, depth: str, units: dict[str, Unit], kinds: Kinds) -> dict[str, Frame]:
    collapsed = {u.instance for u in units.values() if u.instance}
    counts = stack_counts(graph)
    frames: dict[str, Frame] = {}
    for path in sorted(instances, key=lambda p: p.count(".")):
        instance, parent = instances[path], _parent_frame(path, frames)
        if instance.kind == "op" or path in collapsed or any(path.startswith(c + ".") for c in collapsed):
            continue
        stack, _, index = path.rpartition(".")
        if "." not in path:
            frames[path] = Frame(path, "entry", None)
        elif not _has_layer0_ops(graph, path):
            continue  # a later layer of a stack: drawn as the first of its kind
        elif instance.kind == "stack" and depth != "1":
            frames[path] = Frame(path, "stack", parent, counts.get(path, len(instance.children)))
        elif _is_stack_item(path, instances) and len(set(kinds.get(stack, {}).values())) > 1 and depth != "1":
            layers = kind_layers(kinds, stack, int(index))
            frames[path] = Frame(path, "kind", parent, len(layers), layer_ranges(layers))
        elif depth == "full" and instance.kind == "block" and not _is_stack_item(path, instances):
            frames[path] = Frame(path, "block", parent)
    return frames


def _parent_frame(path: str, frames: dict[str, Frame]) -> Optional[str]:
    return _innermost_frame(path.rsplit(".", 1)[0] if "." in path else "", frames)


def _innermost_frame(location: str, frames: dict[str, Frame]) -> Optional[str]:
    parts = location.split(".") if location else []
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in frames:
            return candidate
    return None


def _is_stack_item(path: str, instances: dict) -> bool:
    parent = path.rsplit(".", 1)[0]
    return parent in instances and instances[parent].kind == "stack"


def _has_layer0_ops(graph: nx.DiGraph, path: str) -> bool:
    return any(d["node"].scope == path or d["node"].scope.startswith(path + ".") for _, d in graph.nodes(data=True))


def _location(unit: Unit, graph: nx.DiGraph) -> str:
    """Where a unit sits in the module tree: its op's block, or the parent of a collapsed block."""
    if unit.instance:
        return unit.instance.rsplit(".", 1)[0] if "." in unit.instance else ""
    return node_of(graph, unit.ops[0]).scope
