"""`xspec viz`: diagrams of a spec's architecture (the paper's Figures 1 and 2), what a variant
changed, and attention maps of a trained model (Figures 3-5).

    from xspec.viz import architecture_dot
    dot = architecture_dot(xspec.compile("specs/base.xspec"), depth="2")   # a graphviz.Digraph
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import graphviz

    from xspec.compiler.spec import CompiledSpec


def architecture_dot(spec: "CompiledSpec", depth: str = "2",
                     diff_with: Optional["CompiledSpec"] = None) -> "graphviz.Digraph":
    """The diagram of `spec` at `depth` ("1", "2" or "full"), highlighting what differs from
    `diff_with` when given."""
    from .architecture import draw
    from .diff import Diff
    from .view import build_view

    return draw(build_view(spec, depth), Diff(spec, diff_with) if diff_with is not None else None)
