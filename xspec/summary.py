"""The table `xspec compile` prints from a compiled spec's summary (compiler/summary.py: parameters per block,
shapes at block boundaries). Kept out of the compiler: the command imports it at start-up, before any spec is
compiled."""

from __future__ import annotations

from typing import Any


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
