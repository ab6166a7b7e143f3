"""What a variant changed, compared op by op with another spec (`xspec viz A --diff B`).

Ops are matched by node id (their module path or scope path), which a variant that `extends` a
model keeps. For each op of A: "added" when B lacks it; "changed" when its op kind, attributes,
shape or inputs differ. Ops of B that A lacks are "removed". A stack whose layer count differs
is marked on its "N×" frame. A stack is drawn as its first layer, but compared layer by layer: an op
that differs in later layers only is marked on the op drawn, naming those layers ("layers 3, 7: ...").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import networkx as nx

from xspec.compiler.ir import node_of

from .labels import format_shape, unit_label_title
from .view import View, build_view, canonical_graph, canonical_node, stack_counts

if TYPE_CHECKING:
    from xspec.compiler.spec import CompiledSpec

    from .view import Unit


@dataclass
class Status:
    kind: str  # "changed" or "added"
    lines: list[str] = field(default_factory=list)


@dataclass
class Removed:
    """The boxes of the other spec (drawn at the same depth) whose ops this spec lacks entirely,
    and the other spec's edges that touch them, for drawing as dashed red ghosts."""

    boxes: dict[str, tuple[str, Optional[str]]]  # ghost id -> (title, frame path in the other spec)
    edges: list[tuple[str, str]]  # between ghosts, or between a ghost and one of this view's boxes


class Diff:
    def __init__(self, spec: "CompiledSpec", other: "CompiledSpec") -> None:
        self.other = other
        self.mine, self.theirs = canonical_graph(spec.graph), canonical_graph(other.graph)
        self.ops: dict[str, Status] = {}
        for node in self.mine:
            status = compare_op(self.mine, self.theirs, node)
            if status is not None:
                self.ops[node] = status
        for node, lines in _later_layers(spec.graph, other.graph).items():
            if node in self.mine:
                self.ops.setdefault(node, Status("changed")).lines.extend(lines)
        self.missing = [n for n in self.theirs if n not in self.mine]
        self.counts, self.other_counts = stack_counts(self.mine), stack_counts(self.theirs)

    @property
    def is_empty(self) -> bool:
        return not self.ops and not self.missing and self.counts == self.other_counts

    def unit_status(self, view: View, unit: "Unit") -> Optional[Status]:
        found = [self.ops[n] for n in unit.ops + unit.folded if n in self.ops]
        count_change = self.frame_change(unit.instance) if unit.kind == "stack" and unit.instance else None
        if count_change:  # depth 1 draws a whole stack as one box
            found.append(Status("changed", [count_change]))
        if not found:
            return None
        kind = "added" if all(s.kind == "added" for s in found) else "changed"
        lines = list(dict.fromkeys(line for s in found for line in s.lines))
        return Status(kind, lines[:4] + ([f"(and {len(lines) - 4} more)"] if len(lines) > 4 else []))

    def frame_change(self, stack: str) -> Optional[str]:
        mine, theirs = self.counts.get(stack), self.other_counts.get(stack)
        if theirs is None or mine == theirs:
            return None
        return f"layers: {theirs} → {mine}"

    def removed(self, view: View) -> Removed:
        theirs = build_view(self.other, view.depth)
        lost = {uid for uid, unit in theirs.units.items()
                if uid not in theirs.hidden and uid not in view.units and not any(op in self.mine for op in unit.ops)}
        ghost = {uid: f"removed/{uid}" for uid in lost}
        boxes = {ghost[uid]: (unit_label_title(theirs, theirs.units[uid]), theirs.frame_of[uid]) for uid in lost}
        drawn = set(view.units) - view.hidden
        edges = [(ghost.get(e.src, e.src), ghost.get(e.dst, e.dst)) for e in theirs.drawn_edges()
                 if (e.src in lost or e.dst in lost) and {e.src, e.dst} <= lost | drawn]
        return Removed(boxes, list(dict.fromkeys(edges)))


def compare_op(mine: nx.DiGraph, theirs: nx.DiGraph, node: str) -> Optional[Status]:
    if node not in theirs:
        return Status("added", ["added"])
    a, b = node_of(mine, node), node_of(theirs, node)
    lines = []
    if a.op != b.op:
        lines.append(f"{b.op} → {a.op}")
    else:
        before, after = b.attrs.model_dump(), a.attrs.model_dump()
        lines += [f"{a.op} {k}: {_value(before.get(k))} → {_value(after.get(k))}"
                  for k in after if before.get(k) != after.get(k)]
    if str(a.shape) != str(b.shape):
        lines.append(_shape_change(b.shape, a.shape))
    lines += _rewired(mine, theirs, node)
    return Status("changed", lines) if lines else None


def _later_layers(mine: nx.DiGraph, theirs: nx.DiGraph) -> dict[str, list[str]]:
    """The changes of ops in the later layers of stacks (which the drawing folds onto the first layer's
    op), by the first layer's op: one line per change, naming the layers it is in."""
    found: dict[str, dict[str, list[str]]] = {}
    for node in mine:
        frames = node_of(mine, node).repeat
        if not frames or all(index == 0 for _, index, _ in frames) or node not in theirs:
            continue
        status = compare_op(mine, theirs, node)
        if status is not None:
            layer = ".".join(str(index) for _, index, _ in frames)
            for line in status.lines:
                found.setdefault(canonical_node(node, frames), {}).setdefault(line, []).append(layer)
    return {node: [f"layer{'s' if len(layers) > 1 else ''} {', '.join(layers)}: {line}"
                   for line, layers in changes.items()] for node, changes in found.items()}


def _shape_change(before, after) -> str:
    """Only the dims that changed ("shape: 512 → 1024"), unless the rank changed."""
    if before is None or after is None or len(before.dims) != len(after.dims):
        return f"shape: {format_shape(before)} → {format_shape(after)}"
    changed = [f"{b} → {a}" for b, a in zip(before.dims, after.dims) if b != a]
    return "shape: " + ", ".join(changed)


def _rewired(mine: nx.DiGraph, theirs: nx.DiGraph, node: str) -> list[str]:
    """Inputs that now come from another op (e.g. a norm moved before the sublayer), or that one gains or
    loses, one line per change: "input query, key, value: add_1 → norm", "input position_embeddings:
    rotary_emb → (none)"."""
    now, before = node_of(mine, node).inputs, node_of(theirs, node).inputs
    changes: dict[tuple[str, str], list[str]] = {}
    for port in dict.fromkeys([*now, *before]):
        if before.get(port) != now.get(port):
            changes.setdefault((_short(before.get(port)), _short(now.get(port))), []).append(port)
    return [f"input {', '.join(ports)}: {old} → {new}" for (old, new), ports in changes.items()]


def _short(node: Optional[str]) -> str:
    return "(none)" if node is None else ".".join(node.split(".")[-2:])


def _value(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
