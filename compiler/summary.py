"""A compiled spec's summary as plain data (`CompiledSpec.summary()`, what `xspec compile --json` prints):
parameters per block, shapes at block boundaries. xspec/summary.py renders it as the table `xspec compile` prints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from .ops import IOAttrs

if TYPE_CHECKING:
    from .ir import Instance
    from .spec import CompiledSpec


def summarize(spec: "CompiledSpec") -> dict[str, Any]:
    """The summary as plain data (what `--json` prints)."""
    rows = list(_rows(spec, spec.instances, depth=0))
    return {
        "name": spec.name,
        "file": spec.path,
        "valid": True,
        "parameters": spec.parameters,
        "blocks": {row["path"]: row["parameters"] for row in rows},
        "shapes": {row["path"]: row["output"] for row in rows if row["output"]},
        "inputs": {node.attrs_as(IOAttrs).name: str(node.shape) for node in spec.ops if node.op == "input"},
        "outputs": {node.attrs_as(IOAttrs).name: str(node.shape) for node in spec.ops if node.op == "output"},
        "warnings": [line for line in spec.warnings.splitlines() if ": warning: " in line],
        "rows": rows,
    }


def _rows(spec: "CompiledSpec", instance: "Instance", depth: int) -> Iterator[dict[str, Any]]:
    """Entries and their direct children: the level at which the paper describes the model."""
    for name, child in instance.children.items():
        tied = spec.all_tied_under(child.path)
        count = spec.count_under(child.path)
        if child.kind == "stack":
            first = child.children["0"]
            kind = first.block_name or "layers"
            label = f"{name} ({len(child.children)}x)"
            output = _shape(spec, child.children[str(len(child.children) - 1)])
        else:
            kind = child.block_name or (spec.ops[child.node].op if child.node is not None else child.kind)
            label, output = name, _shape(spec, child)
        yield {"path": child.path, "label": label, "kind": kind, "depth": depth, "parameters": count,
               "tied": tied, "output": output}
        if depth == 0 and child.kind == "block":
            yield from _rows(spec, child, depth + 1)


def _shape(spec: "CompiledSpec", instance: "Instance") -> str | None:
    node = instance.node if instance.kind == "op" else instance.result_node
    return str(spec.ops[node].shape) if node is not None else None
