"""The architecture diagram as graphviz DOT: the paper's Figure 1 (and Figure 2 at depth "full").

Encoder and decoder stacks stand side by side, inputs at the bottom and outputs at the top, as in
Figure 1. Boxes are coloured by op family (OPS[op].family); frames are the entry blocks and the
repeated stacks ("N×"); residual connections, the encoder-decoder attention and tied weights
each have their own edge style.
"""

from __future__ import annotations

from html import escape
from itertools import pairwise
from typing import TYPE_CHECKING, Optional

import graphviz

from .diff import Removed
from .labels import Label, format_count, unit_label
from .view import Edge, Frame, Unit, View, canonical_node, family, kind_letter, schedule
from xspec.compiler.opdef import Family
from xspec.compiler.ir import node_of

if TYPE_CHECKING:
    from .diff import Diff

FONT = "Helvetica"
TEXT = "#222222"
MUTED = "#555555"
# Fill and border per op family: light fills keep black text readable on white paper.
FILL = {
    Family.ATTENTION: "#FCDDB4",
    Family.RECURRENT: "#F9D0C4",
    Family.FEED_FORWARD: "#C6E6F5",
    Family.EXPERTS: "#CDEBE3",
    Family.NORM: "#F4F2B8",
    Family.EMBEDDING: "#F6CED6",
    Family.POSITION: "#E2D7EE",
    Family.ACTIVATION: "#D3EBCB",
    Family.RESIDUAL: "#FFFFFF",
    Family.REGULARIZATION: "#E9E9E9",
    Family.ELEMENTWISE: "#E9E9E9",
    Family.IO: "#FFFFFF",
}
BORDER = {
    Family.ATTENTION: "#C27C2C",
    Family.RECURRENT: "#B0553A",
    Family.FEED_FORWARD: "#3F86B0",
    Family.EXPERTS: "#2F8F7A",
    Family.NORM: "#A29A2A",
    Family.EMBEDDING: "#B85B6F",
    Family.POSITION: "#7E62A3",
    Family.ACTIVATION: "#4C9A3C",
    Family.RESIDUAL: "#444444",
    Family.REGULARIZATION: "#888888",
    Family.ELEMENTWISE: "#888888",
    Family.IO: "#444444",
}
EDGE_STYLE = {
    "data": {"color": "#333333"},
    "residual": {"color": "#2F6DB5", "penwidth": "1.6"},
    "cross_attention": {"color": "#D55E00", "penwidth": "2.4", "fontcolor": "#D55E00"},
    "length": {"color": "#888888", "style": "dotted"},
    "mask": {"color": "#999999", "style": "dashed"},
}
TIE_COLOR = "#AA3377"
DIFF_COLOR = {"changed": "#7B2CBF", "added": "#1A9850", "removed": "#D7191C"}
STACK_FILL = "#F1F1F1"
PORT_LETTERS = {"query": "Q", "key": "K", "value": "V", "mask": "mask"}


def draw(view: View, diff: Optional["Diff"] = None) -> graphviz.Digraph:
    dot = graphviz.Digraph(name=view.spec.name)
    dot.attr(rankdir="BT", newrank="true", nodesep="0.3", ranksep="0.32", fontname=FONT, fontsize="16",
             labelloc="t", label=_title(view, diff), bgcolor="white", pad="0.2")
    dot.attr("node", fontname=FONT, fontcolor=TEXT, shape="box", style="rounded,filled", penwidth="1.2",
             margin="0.14,0.06")
    dot.attr("edge", fontname=FONT, fontsize="10", arrowsize="0.7")
    drawer = _Drawer(view, diff, dot)
    drawer.frame_contents(dot, None)
    for edge in view.drawn_edges():
        drawer.edge(edge)
    drawer.ties()
    drawer.removed_edges()
    return dot


def _title(view: View, diff: Optional["Diff"]) -> str:
    rows = [f"<B>{escape(view.spec.name)}</B>  ({format_count(view.spec.parameters)} parameters)"]
    if view.spec.overrides:
        settings = ", ".join(f"{key} = {str(value).lower() if isinstance(value, bool) else value}"
                             for key, value in view.spec.overrides.items())
        rows.append(f'<FONT POINT-SIZE="12">with --set {escape(settings)}</FONT>')
    if diff is not None:
        keys = " ".join(f'<FONT COLOR="{DIFF_COLOR[k]}"><B>{k}</B></FONT>' for k in ("changed", "added", "removed"))
        rows.append(f'<FONT POINT-SIZE="12">compared with {escape(diff.other.name)} '
                    f'({escape(diff.other.path)}): {keys}</FONT>')
    return "<" + "<BR/>".join(rows) + ">"


class _Drawer:
    """Emits the boxes frame by frame, then the edges (which may cross frames)."""

    def __init__(self, view: View, diff: Optional["Diff"], dot: graphviz.Digraph) -> None:
        self.view, self.diff, self.dot = view, diff, dot
        self.removed = diff.removed(view) if diff is not None else Removed({}, [])
        order = {uid: i for i, uid in enumerate(view.units)}
        self.first_unit: dict[Optional[str], int] = {}
        for uid, frame in view.frame_of.items():
            while True:  # a frame comes in the order of its first box (encoder before decoder)
                self.first_unit[frame] = min(self.first_unit.get(frame, order[uid]), order[uid])
                if frame is None:
                    break
                frame = view.frames[frame].parent
        self.expanded = {uid for uid, u in view.units.items()
                         if view.depth == "full" and family(view.graph, u.ops[0]) == Family.ATTENTION}

    # --- boxes and frames ---------------------------------------------------------------------
    def frame_contents(self, graph: graphviz.Digraph, frame: Optional[str]) -> None:
        for uid, unit in self.view.units.items():
            if self.view.frame_of[uid] == frame and uid not in self.view.hidden:
                self.unit(graph, unit)
        self._ghosts(graph, frame)
        children = [f for f in self.view.frames.values() if f.parent == frame and f.path in self.first_unit]
        for child in sorted(children, key=lambda f: self.first_unit[f.path]):
            with graph.subgraph(name=f"cluster_{child.path}") as sub:
                sub.attr(**self._frame_attrs(child))
                self.frame_contents(sub, child.path)

    def _frame_attrs(self, frame: Frame) -> dict[str, str]:
        params = format_count(self.view.spec.count_under(frame.path))
        name = frame.path.rsplit(".", 1)[-1]
        if frame.kind == "kind":  # one kind of layer of a stack whose layers differ
            assert frame.count is not None      # its layers, counted
            each = format_count(self.view.spec.count_under(frame.path))
            stack, _, first = frame.path.rpartition(".")
            letter = kind_letter(self.view.kinds, stack, int(first))
            label = (f'<<FONT POINT-SIZE="16"><B>{letter}: {frame.count}×</B></FONT><BR/>'
                     f'<FONT POINT-SIZE="10" COLOR="{MUTED}">layer{"s" if frame.count > 1 else ""} '
                     f'{escape(frame.layers)}: {each} params{" each" if frame.count > 1 else ""}</FONT>>')
            return {"label": label, "style": "rounded,dashed", "color": "#777777", "labeljust": "l", "labelloc": "b",
                    "class": "kind", "id": f"frame:{frame.path}"}
        if frame.kind == "stack":
            kinds = sum(1 for f in self.view.frames.values() if f.kind == "kind" and f.parent == frame.path)
            # Layers of several kinds: which runs when, as the stack runs them.
            each = (f"{kinds} kinds of layer, run as {schedule(self.view.kinds, frame.path)}" if kinds else
                    f"{format_count(self.view.spec.count_under(f'{frame.path}.0'))} params each")
            change = self.diff.frame_change(frame.path) if self.diff else None
            extra = (f'<BR/><FONT POINT-SIZE="11" COLOR="{DIFF_COLOR["changed"]}"><B>{escape(change)}</B></FONT>'
                     if change else "")
            label = (f'<<FONT POINT-SIZE="22"><B>{frame.count}×</B></FONT><BR/>'
                     f'<FONT POINT-SIZE="10" COLOR="{MUTED}">{escape(name)}: {each}</FONT>{extra}>')
            return {"label": label, "style": "rounded,filled", "fillcolor": STACK_FILL,
                    "color": DIFF_COLOR["changed"] if change else "#777777", "penwidth": "2" if change else "1.2",
                    "labeljust": "l", "labelloc": "b", "class": "stack", "id": f"frame:{frame.path}"}
        title = name.capitalize() if frame.kind == "entry" else name
        size = "16" if frame.kind == "entry" else "11"
        label = (f'<<FONT POINT-SIZE="{size}"><B>{escape(title)}</B></FONT>'
                 f'<FONT POINT-SIZE="10" COLOR="{MUTED}">  {params} params</FONT>>')
        style = "rounded,dashed" if frame.kind == "entry" else "rounded"
        # With rankdir=BT, labelloc "b" puts a frame's title at its top.
        return {"label": label, "style": style, "color": "#999999", "labeljust": "l", "labelloc": "b",
                "class": frame.kind, "id": f"frame:{frame.path}"}

    def unit(self, graph: graphviz.Digraph, unit: Unit) -> None:
        label = unit_label(self.view, unit)
        status = self.diff.unit_status(self.view, unit) if self.diff else None
        if unit.id in self.expanded:
            _draw_attention_internals(graph, self.view, unit, _html(label, status), self._colors(label, status))
            return
        attrs = self._colors(label, status)
        attrs["class"] = f"{unit.kind} {label.family}"
        if (family(self.view.graph, unit.ops[0]) == Family.RESIDUAL and unit.kind == "op" and not label.notes
                and not status):
            # a bare sum, drawn as Figure 1 draws one
            graph.node(unit.id, "+", shape="circle", fixedsize="true", width="0.32", fontsize="16",
                       **{**attrs, "fillcolor": "white"})
            return
        graph.node(unit.id, _html(label, status), **attrs)

    def _colors(self, label: Label, status) -> dict[str, str]:
        fill, border = FILL[label.family], BORDER[label.family]
        if self.diff is None:
            return {"fillcolor": fill, "color": border}
        if status is None:  # unchanged: faded, so the change stands out
            return {"fillcolor": _fade(fill), "color": "#BBBBBB", "fontcolor": "#777777"}
        return {"fillcolor": fill, "color": DIFF_COLOR[status.kind], "penwidth": "3"}

    # --- edges --------------------------------------------------------------------------------
    def edge(self, edge: Edge) -> None:
        attrs = dict(EDGE_STYLE[edge.role], **{"class": edge.role})
        src = f"{edge.src}/out" if edge.src in self.expanded else edge.src
        dst_unit = self.view.units[edge.dst]
        is_attention = family(self.view.graph, dst_unit.ops[0]) == Family.ATTENTION and dst_unit.kind == "op"
        if edge.dst in self.expanded:
            for port in edge.ports:
                self.dot.edge(src, f"{edge.dst}/{_INTERNAL_INPUT[port]}", **attrs)
            return
        if edge.role == "cross_attention" or (is_attention and set(edge.ports) != {"query", "key", "value"}):
            attrs["label"] = ", ".join(PORT_LETTERS.get(p, p) for p in edge.ports)
        self.dot.edge(src, edge.dst, **attrs)

    def ties(self) -> None:
        """§3.4: dashed lines join modules that share one weight matrix."""
        drawn = set()
        for copy, owner in self.view.spec.ties.items():
            a, b = self._unit_of_module(copy.rsplit(".", 1)[0]), self._unit_of_module(owner.rsplit(".", 1)[0])
            if a is None or b is None or a == b or (a, b) in drawn:
                continue
            drawn.add((a, b))
            # No edge label: dot may set it on a frame's border; the boxes' "tied:" notes say it.
            self.dot.edge(a, b, style="dashed", color=TIE_COLOR, dir="none", constraint="false",
                          **{"class": "tie"})

    def _unit_of_module(self, module: str) -> Optional[str]:
        original = self.view.spec.graph
        if module not in original:
            return None
        node = canonical_node(module, node_of(original, module).repeat, self.view.kinds)
        uid = self.view.unit_of.get(node)
        if uid in self.expanded:
            return f"{uid}/out"
        return uid if uid not in self.view.hidden else None

    def removed_edges(self) -> None:
        for src, dst in self.removed.edges:
            self.dot.edge(src, dst, style="dashed", color=DIFF_COLOR["removed"], **{"class": "removed"})

    def _ghosts(self, graph: graphviz.Digraph, frame: Optional[str]) -> None:
        """Boxes of the other spec that this one lacks: dashed red, where they were; those from a
        frame this drawing lacks (a removed encoder) in a dashed red frame of that name."""
        groups: dict[Optional[str], list[str]] = {}
        for gid, (_, where) in self.removed.boxes.items():
            here, lost_frame = self._ghost_frame(where)
            if here == frame:
                groups.setdefault(lost_frame, []).append(gid)
        for lost_frame, ids in groups.items():
            if lost_frame is None:
                self._ghost_boxes(graph, ids)
                continue
            with graph.subgraph(name=f"cluster_removed/{lost_frame}") as sub:
                sub.attr(label=f"removed: {lost_frame}", style="rounded,dashed", color=DIFF_COLOR["removed"],
                         fontcolor=DIFF_COLOR["removed"], labeljust="l", labelloc="b", **{"class": "removed"})
                self._ghost_boxes(sub, ids)

    def _ghost_boxes(self, graph: graphviz.Digraph, ids: list[str]) -> None:
        for gid in ids:
            title = self.removed.boxes[gid][0]
            graph.node(gid, _table([f"<B>removed: {escape(title)}</B>"]), style="rounded,dashed",
                       color=DIFF_COLOR["removed"], fontcolor=DIFF_COLOR["removed"], penwidth="2",
                       **{"class": "removed"})

    def _ghost_frame(self, where: Optional[str]) -> tuple[Optional[str], Optional[str]]:
        """(the innermost frame of this drawing that held the ghost in the other spec, the
        outermost of the other spec's frames around it that this drawing lacks)."""
        lost = None
        while where is not None and where not in self.view.frames:
            lost = where
            where = where.rsplit(".", 1)[0] if "." in where else None
        return where, lost


def _html(label: Label, status=None) -> str:
    rows = [f'<B>{escape(label.title)}</B>']
    rows += [f'<FONT POINT-SIZE="10">{escape(line)}</FONT>' for line in label.details]
    if label.shape:
        rows.append(f'<FONT POINT-SIZE="9" COLOR="{MUTED}">{escape(label.shape)}</FONT>')
    if label.params:
        rows.append(f'<FONT POINT-SIZE="9" COLOR="{MUTED}">{escape(label.params)}</FONT>')
    for note in label.notes:
        color = TIE_COLOR if note.startswith("tied") else MUTED
        rows.append(f'<FONT POINT-SIZE="9" COLOR="{color}"><I>{escape(note)}</I></FONT>')
    if status is not None:
        rows += [f'<FONT POINT-SIZE="10" COLOR="{DIFF_COLOR[status.kind]}"><B>{escape(line)}</B></FONT>'
                 for line in status.lines]
    return _table(rows)


def _table(rows: list[str]) -> str:
    cells = "".join(f"<TR><TD>{row}</TD></TR>" for row in rows)
    return f'<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">{cells}</TABLE>>'


def _fade(color: str) -> str:
    """Halfway to white."""
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{(c + 255) // 2:02X}" for c in rgb)


# --- Figure 2: multi-head attention opened up -----------------------------------------------------

_INTERNAL_INPUT = {"query": "q", "key": "k", "value": "v", "mask": "mask"}


def _draw_attention_internals(graph: graphviz.Digraph, view: View, unit: Unit, header: str,
                              colors: dict[str, str]) -> None:
    """§3.2.2 / Figure 2: h parallel projections of Q, K, V; scaled dot-product attention (§3.2.1:
    MatMul, Scale, Mask (opt.), SoftMax, MatMul); Concat; the output projection W^O."""
    node = unit.ops[0]
    data = view.graph.nodes[node]
    a, inferred = data["node"].attrs, data["node"].inferred
    padded = any("mask" in e.ports for e in view.edges if e.dst == unit.id)
    window = getattr(a, "window", None)
    masks = ((["causal"] if a.causal else []) + ([f"window {window}"] if window else [])
             + (["padding"] if padded else []))
    scale = f"Scale  {a.scale:.4g}" if getattr(a, "scale", None) is not None else f"Scale  1/√{a.d_k}"
    softcap = getattr(a, "softcap", None)

    def n(part: str) -> str:
        return f"{node}/{part}"

    def box(title: str, detail: str) -> str:
        return _table([f"<B>{title}</B>", f'<FONT POINT-SIZE="9">{detail}</FONT>'])

    inner = {"fillcolor": "white", "color": colors["color"]}
    with graph.subgraph(name=f"cluster_{node}") as mha:
        # labelloc "b" is the top with rankdir=BT: away from the three inputs entering below.
        mha.attr(label=header, style="rounded,filled", fillcolor=colors["fillcolor"], color=colors["color"],
                 labeljust="c", labelloc="b", **{"class": "attention", "id": f"frame:{node}"})
        for part, width in (("q", a.d_k), ("k", a.d_k), ("v", a.d_v)):
            mha.node(n(part), box(f"Linear {part.upper()}", f"{inferred['d_model']} → {a.heads}·{width}"), **inner)
        with mha.subgraph(name=f"cluster_{node}/sdpa") as sdpa:
            sdpa.attr(label=f"Scaled Dot-Product Attention  (×{a.heads} heads)", fontsize="10", labelloc="b",
                      style="rounded,filled", fillcolor="white", color="#BBBBBB")
            sdpa.node(n("scores"), "MatMul  Q·Kᵀ", **inner)
            sdpa.node(n("scale"), scale, **inner)
            if softcap is not None:
                sdpa.node(n("softcap"), f"Soft-cap  {softcap:g}·tanh(·/{softcap:g})", **inner)
            if masks:
                sdpa.node(n("mask"), f"Mask ({', '.join(masks)})", **inner)
            sdpa.node(n("softmax"), "SoftMax (with sinks)" if getattr(a, "sinks", False) else "SoftMax", **inner)
            sdpa.node(n("weighted"), "MatMul  ·V", **inner)
        mha.node(n("concat"), "Concat", **inner)
        mha.node(n("out"), box("Linear", f"{a.heads}·{a.d_v} → {inferred['d_model']}"), **inner)
    chain = (["scores", "scale"] + (["softcap"] if softcap is not None else []) + (["mask"] if masks else [])
             + ["softmax", "weighted", "concat", "out"])
    graph.edge(n("q"), n("scores"))
    graph.edge(n("k"), n("scores"))
    graph.edge(n("v"), n("weighted"))
    for a_part, b_part in pairwise(chain):
        graph.edge(n(a_part), n(b_part))
