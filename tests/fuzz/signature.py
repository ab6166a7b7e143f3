"""What "the same model" means when a resolved spec is compiled again: the same op nodes (op,
attributes, shape, module path), the same edges, the same learned tensors and ties, the same
parameter values and sections. Source positions are left out: the resolved text is another file."""

from __future__ import annotations

from typing import Any


def signature(spec: Any) -> dict[str, Any]:
    graph = spec.graph
    return {
        "nodes": {node: (data["node"].op, data["node"].attrs.model_dump(), str(data["node"].shape), data["node"].module)
                  for node, data in graph.nodes(data=True)},
        "edges": {(source, target): tuple(ports) for source, target, ports in graph.edges(data="ports")},
        "parameter shapes": spec.param_shapes,
        "ties": spec.ties,
        "parameter values": dict(spec.params),
        "sections": {name: getattr(spec, name).model_dump() for name in ("train", "data", "decode")},
    }


def differences(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """Each way the two signatures differ, briefly."""
    found = []
    for part, mine in first.items():
        theirs = second[part]
        if mine == theirs:
            continue
        if isinstance(mine, dict):
            missing = sorted(map(str, mine.keys() - theirs.keys()))[:3]
            extra = sorted(map(str, theirs.keys() - mine.keys()))[:3]
            changed = [f"{key}: {mine[key]!r} != {theirs[key]!r}" for key in mine.keys() & theirs.keys()
                       if mine[key] != theirs[key]][:3]
            found.append(f"{part} differ (only before: {missing}, only after: {extra}, changed: {changed})")
        else:
            found.append(f"{part} differ: {mine!r} != {theirs!r}")
    return found
