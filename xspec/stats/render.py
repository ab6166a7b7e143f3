"""`xspec stats` as text: four short tables a person reads top to bottom."""

from __future__ import annotations

from xspec.stats import SpecStats
from xspec.stats.architecture import PAPER_NAMES
from xspec.stats.cost import CATEGORIES

CATEGORY_LABELS = {
    "attention_qkv": "attention: Q, K, V projections",
    "attention_scores": "attention: Q K^T",
    "attention_values": "attention: softmax(.) V",
    "attention_out": "attention: output projection W^O",
    "feed_forward": "feed-forward (and other linear layers)",
    "generator": "pre-softmax projection to the vocabulary",
}


def _bytes(count: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:,.2f} {unit}"
    return f"{count} B"


def _number(value: float) -> str:
    if value >= 1e6:
        return f"{value:.3g}"
    return f"{value:,.0f}" if value == int(value) else f"{value:,.2f}"


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(header), "-" * len(line(header)), *(line(r) for r in rows)]


def render(stats: SpecStats) -> str:
    arch = stats.architecture.as_dict()
    out = [f"{stats.name} ({stats.file})", "",
           "  ".join(f"{PAPER_NAMES[k]}={_value(v)}" for k, v in arch.items()), ""]

    out += ["Parameters"]
    rows = [["  " * b.depth + b.label, b.kind, "tied" if b.tied else f"{b.parameters:,}"] for b in stats.blocks]
    rows.append(["total", "", f"{stats.parameters:,}"])
    out += _table(["module", "block/op", "parameters"], rows, right={2}) + [""]

    f = stats.flops
    out += [f"Forward FLOPs per token at n = {f.length} (2 per multiply-add, matrix products only; "
            f"src_len = tgt_len = n)"]
    rows = [[CATEGORY_LABELS[c], f"{f.by_category[c]:,}"] for c in CATEGORIES if c in f.by_category]
    rows += [[f"{stack} (per token of its sequence)", f"{count:,}"] for stack, count in f.by_stack.items()]
    rows.append(["total per token", f"{f.per_token:,.0f}"])
    out += _table(["", "FLOPs"], rows, right={1}) + [""]

    m = stats.memory
    out += [f"Training memory at batch {m.batch} x n = {m.length} (float32, Adam; activations estimated)"]
    rows = [["weights", _bytes(m.weights)], ["gradients", _bytes(m.gradients)],
            ["Adam moments (2 per parameter)", _bytes(m.adam)], ["activations kept for backward", _bytes(m.activations)],
            ["total", _bytes(m.total)]]
    out += _table(["", "bytes"], rows, right={1}) + [""]

    out += [f"Table 1 (§4) at n = {f.length}, d = {stats.d}: the spec's attention layers; "
            "comparison rows are the paper's formulas, not layers of this spec"]
    rows = [[r.layer, str(r.in_spec or "-"), f"{r.formula[0]} = {_number(r.complexity)}",
             f"{r.formula[1]} = {_number(r.sequential)}", f"{r.formula[2]} = {_number(r.path_length)}"]
            for r in stats.table1]
    out += _table(["layer type", "in spec", "complexity per layer", "sequential ops", "max path length"], rows,
                  right=set())
    return "\n".join(out)


def _value(value) -> str:
    return "/".join(str(v) for v in value) if isinstance(value, tuple) else str(value)
