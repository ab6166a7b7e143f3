"""What each box says: the op kind, its key attributes, its output shape, its parameter count.

Titles follow the paper's Figure 1 ("Multi-Head Attention", "Add & Norm", "Feed Forward", ...);
the words come from the ops and their attributes, not from block names.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import networkx as nx

from xspec.compiler.entries import LOGITS
from xspec.compiler.ops import OPS

from .view import Unit, View, build_view
from xspec.compiler.opdef import Family
from xspec.compiler.ir import node_of

@dataclass
class Label:
    title: str
    details: list[str] = field(default_factory=list)  # key attributes, one short line each
    shape: Optional[str] = None  # output shape with symbolic dims: "batch × src_len × 512"
    params: Optional[str] = None
    notes: list[str] = field(default_factory=list)  # folded ops, tied weights
    family: Family = Family.IO  # picks the colour


def unit_label(view: View, unit: Unit) -> Label:
    graph, last = view.graph, unit.ops[-1]
    if view.depth == "1" and unit.instance:
        label = _collapsed_label(view, unit, unit.instance)
    elif unit.kind == "block":
        label = _block_label(view, unit)
    elif unit.kind == "add_norm":
        label = Label("Add & Norm", family=Family.NORM)  # §3.1: LayerNorm(x + Sublayer(x))
    else:
        label = op_label(graph, unit.ops[0])
    label.shape = format_shape(node_of(graph, last).shape)
    label.params = _params(view, unit)
    label.notes += [_folded_note(graph, node) for node in unit.folded]
    label.notes += tie_notes(view, unit)
    return label


def op_label(graph: nx.DiGraph, node: str) -> Label:
    data = graph.nodes[node]
    op, attrs = data["node"].op, data["node"].attrs
    family = OPS[op].family
    if family == Family.ATTENTION:
        return _attention_label(graph, node)
    if family == Family.IO and attrs.kind != "output":
        return Label(f"{attrs.name}", [attrs.kind], family=family)
    if family == Family.IO:
        if node == LOGITS.node:  # §3.4: the decoder output goes through a softmax
            return Label("Softmax", ["output probabilities (in the loss and search)"], family=Family.ACTIVATION)
        return Label(attrs.name, ["model output"], family=family)
    entry = OPS[op]
    return Label(entry.title or op, entry.details(attrs, data["node"].inferred), family=family)


def _attention_label(graph: nx.DiGraph, node: str) -> Label:
    attrs, sources = node_of(graph, node).attrs, node_of(graph, node).inputs
    entry = OPS[node_of(graph, node).op]
    title = f"Masked {entry.title}" if getattr(attrs, "causal") else entry.title  # §3.2.3: every attention has it
    first, *rest = entry.details(attrs, node_of(graph, node).inferred)
    kind = _attention_kind(graph, node, sources) + (", padding mask" if "mask" in sources else "")
    return Label(title, [first, kind, *rest], family=Family.ATTENTION)


def _attention_kind(graph: nx.DiGraph, node: str, sources: dict[str, str]) -> str:
    """§3.2.3's three uses: self-attention (the role validation recorded), or keys and values from the
    other stack (the encoder)."""
    if node_of(graph, node).inferred["self_attention"]:
        return "self-attention"
    entry = node_of(graph, node).scope.split(".")[0]
    if node_of(graph, sources["key"]).scope.split(".")[0] not in (entry, ""):
        return "encoder-decoder attention"
    return "keys and values from another input"


def _block_label(view: View, unit: Unit) -> Label:
    """A block of linear layers and activations: the position-wise feed-forward network (§3.3)."""
    nodes = [view.graph.nodes[n] for n in unit.ops]
    linears = [d for d in nodes if OPS[d["node"].op].family == Family.FEED_FORWARD]
    widths = ", ".join(dict.fromkeys(str(d["node"].attrs.out) for d in linears[:-1]))  # a GLU's two: once
    activations = ", ".join(_activation_title(view.graph, n) for n in unit.ops
                            if OPS[node_of(view.graph, n).op].family == Family.ACTIVATION)
    details = [f"d_ff = {widths}" if widths else f"{len(linears)} linear"]
    if activations:
        details[0] += f", {activations}"
    return Label("Feed Forward", details, family=Family.FEED_FORWARD)


def _activation_title(graph: nx.DiGraph, node: str) -> str:
    """The activation's name, or the gated linear unit's when it gates a product (SiLU -> SwiGLU)."""
    entry = OPS[node_of(graph, node).op]
    gated = any(OPS[node_of(graph, s).op].gates for s in graph.successors(node))
    return entry.glu_title if gated and entry.glu_title else entry.title


# The colour of a collapsed block: its most characteristic op family.
_FAMILY_PRIORITY = (Family.ATTENTION, Family.RECURRENT, Family.EXPERTS, Family.FEED_FORWARD, Family.EMBEDDING,
                    Family.POSITION, Family.NORM, Family.ACTIVATION)
_SUBLAYER_ENDS = ("Add & Norm", "Add")


def _collapsed_label(view: View, unit: Unit, instance: str) -> Label:
    """A block or a whole repeated stack at depth 1 (`instance`: unit.instance), named by the depth-2 boxes
    it holds, in order."""
    inner = build_view(view.spec, "2")
    boxes = [u for uid, u in inner.units.items() if _inside(inner, uid, instance)]
    titles = [unit_label_title(inner, u) for u in boxes]
    families = {unit_label(inner, u).family for u in boxes}
    family = next((f for f in _FAMILY_PRIORITY if f in families), Family.IO)
    if unit.kind == "stack":
        name = instance.rsplit(".", 1)[-1]
        return Label(f"{view.frames_count(instance)}× {name}", _sublayer_lines(titles), family=family)
    named = [t for t in titles if t not in _SUBLAYER_ENDS]
    return Label(" + ".join(dict.fromkeys(named)) or instance, family=family)


def _sublayer_lines(titles: list[str]) -> list[str]:
    """One line per sublayer: a line ends at each residual add ("... → Add & Norm")."""
    lines, current = [], []
    for title in titles:
        current.append(title)
        if title in _SUBLAYER_ENDS:
            lines.append(" → ".join(current))
            current = []
    return lines + ([" → ".join(current)] if current else [])


def _inside(view: View, uid: str, path: str) -> bool:
    """Whether a box of `view` lies in the module `path` (a frame, or a block collapsed at depth 2)."""
    unit = view.units[uid]
    where = unit.instance or node_of(view.graph, unit.ops[0]).scope
    return where == path or where.startswith(path + ".")


def unit_label_title(view: View, unit: Unit) -> str:
    if unit.kind == "add_norm":
        return "Add & Norm"
    if unit.kind == "block":
        return "Feed Forward"
    return op_label(view.graph, unit.ops[0]).title


def _params(view: View, unit: Unit) -> Optional[str]:
    if unit.instance:
        total = view.spec.count_under(unit.instance)
        if unit.kind == "stack" and len(set(view.kinds.get(unit.instance, {0: 0}).values())) > 1:
            return f"{view.frames_count(unit.instance)} layers of {len(set(view.kinds[unit.instance].values()))} " \
                   f"kinds, {format_count(total)} params"
        if unit.kind == "stack":
            each = view.spec.count_under(f"{unit.instance}.0")
            return f"{view.frames_count(unit.instance)} × {format_count(each)} = {format_count(total)} params"
        return f"{format_count(total)} params" if total else None
    modules = [module for n in unit.ops if (module := node_of(view.graph, n).module)]
    total = sum(view.spec.count_under(m) for m in modules)
    return f"{format_count(total)} params" if total else None


def tie_notes(view: View, unit: Unit) -> list[str]:
    """§3.4: weights shared between modules (counted once, at their owner)."""
    modules = {node_of(view.graph, n).module for n in unit.ops} - {None}
    notes = [f"tied: {copy.rsplit('.', 1)[1]} shared with {_module_of(owner)}"
             for copy, owner in view.spec.ties.items() if _module_of(copy) in modules]
    copies = Counter(owner for owner in view.spec.ties.values() if _module_of(owner) in modules)
    notes += [f"tied: {owner.rsplit('.', 1)[1]} shared by {count + 1} modules" for owner, count in copies.items()]
    return notes


def _module_of(tensor: str) -> str:
    """"decoder.generator.weight" -> "decoder.generator"."""
    return tensor.rsplit(".", 1)[0]


def _folded_note(graph: nx.DiGraph, node: str) -> str:
    data = graph.nodes[node]
    if OPS[data["node"].op].family == Family.REGULARIZATION:
        return f"dropout {data['node'].attrs.p:g} on output"  # §5.4: residual dropout
    return OPS[data["node"].op].title or data["node"].op


def format_shape(shape) -> Optional[str]:
    return " × ".join(str(d) for d in shape.dims) if shape is not None else None


def format_count(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.2f}M".replace(".00M", "M")
    if n >= 10_000:
        return f"{n / 1000:.1f}k".replace(".0k", "k")
    return f"{n:,}"
