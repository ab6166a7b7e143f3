"""The report `xspec compile` prints: parameters per block, shapes at block boundaries."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from xspec.compiler.ir import Instance
    from xspec.spec import CompiledSpec


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
        "inputs": {node.attrs.name: str(node.shape) for node in spec.ops if node.op == "input"},
        "outputs": {node.attrs.name: str(node.shape) for node in spec.ops if node.op == "output"},
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
            kind = child.block_name or spec.ops[child.node].op
            label, output = name, _shape(spec, child)
        yield {"path": child.path, "label": label, "kind": kind, "depth": depth, "parameters": count,
               "tied": tied, "output": output}
        if depth == 0 and child.kind == "block":
            yield from _rows(spec, child, depth + 1)


def _shape(spec: "CompiledSpec", instance: "Instance") -> str | None:
    node = instance.node if instance.kind == "op" else instance.result_node
    return str(spec.ops[node].shape) if node is not None else None


def render_table(summary: dict[str, Any]) -> str:
    rows = summary["rows"]
    labels = ["  " * r["depth"] + r["label"] for r in rows]
    counts = [("tied" if r["tied"] else f"{r['parameters']:,}") for r in rows]
    width_label = max([len(x) for x in labels] + [len("module"), len("total")])
    width_kind = max([len(r["kind"]) for r in rows] + [len("block/op")])
    total = f"{summary['parameters']:,}"
    width_count = max([len(c) for c in counts] + [len("parameters"), len(total)])
    header = f"{'module':<{width_label}}  {'block/op':<{width_kind}}  {'parameters':>{width_count}}  output"
    lines = [header, "-" * len(header)]
    for label, row, count in zip(labels, rows, counts):
        lines.append(f"{label:<{width_label}}  {row['kind']:<{width_kind}}  {count:>{width_count}}  "
                     f"{row['output'] or ''}".rstrip())
    lines.append(f"{'total':<{width_label}}  {'':<{width_kind}}  {total:>{width_count}}")
    return "\n".join(lines)
