"""`xspec stats` as text: four short tables a person reads top to bottom, and with `--train-cost` the
training cost beside Table 2's."""

from __future__ import annotations

from xspec.stats import SpecStats
from xspec.stats.architecture import PAPER_NAMES
from xspec.compiler.cost import CATEGORIES
from xspec.stats.train_cost import GPU_TFLOPS, PAPER_RUNS, TrainCost

CATEGORY_LABELS = {
    "attention_qkv": "attention: Q, K, V projections",
    "attention_scores": "attention: Q K^T",
    "attention_values": "attention: softmax(.) V",
    "attention_out": "attention: output projection W^O",
    "recurrent": "recurrent mixers: projections and state",
    "feed_forward": "feed-forward (and other linear layers)",
    "moe_router": "mixture of experts: router",
    "moe_experts": "mixture of experts: the chosen experts",
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
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(header), "-" * len(line(header)), *(line(r) for r in rows)]


def render(stats: SpecStats, plan_line: str = "") -> str:
    arch = stats.architecture.as_dict()
    out = [f"{stats.name} ({stats.file})", "",
           "  ".join(f"{PAPER_NAMES[k]}={_value(v)}" for k, v in arch.items()), ""]

    out += ["Parameters"]
    rows = [["  " * b.depth + b.label, b.kind, "tied" if b.tied else f"{b.parameters:,}"] for b in stats.blocks]
    rows.append(["total", "", f"{stats.parameters:,}"])
    if stats.active_parameters != stats.parameters:  # a mixture of experts: a token uses top_k of them
        rows.append(["active per token", "", f"{stats.active_parameters:,}"])
    out += _table(["module", "block/op", "parameters"], rows, right={2}) + [""]

    f = stats.flops
    experts = "; a mixture of experts: its chosen experts only" if "moe_experts" in f.by_category else ""
    out += [f"Forward FLOPs per token at n = {f.length} (2 per multiply-add, matrix products only; "
            f"src_len = tgt_len = n{experts})"]
    rows = [[CATEGORY_LABELS[c], f"{f.by_category[c]:,}"] for c in CATEGORIES if c in f.by_category]
    rows += [[f"{stack} (per token of its sequence)", f"{count:,}"] for stack, count in f.by_stack.items()]
    rows.append(["total per token", f"{f.per_token:,.0f}"])
    out += _table(["", "FLOPs"], rows, right={1}) + [""]

    m = stats.memory
    out += [f"Training memory at batch {m.batch} x n = {m.length} (float32, Adam; activations estimated)"]
    rows = [["weights", _bytes(m.weights)], ["gradients", _bytes(m.gradients)],
            ["Adam moments (2 per parameter)", _bytes(m.adam)],
            ["activations kept for backward", _bytes(m.activations)],
            ["loss: log-probabilities and gradients over the vocabulary", _bytes(m.loss)],
            ["total", _bytes(m.total)]]
    out += _table(["", "bytes"], rows, right={1})
    out += [plan_line] if plan_line else []
    out += [""]

    c = stats.cache
    if c.layers or c.recurrent_layers:
        kinds = [f"{c.layers} self-attention"] * bool(c.layers) + [f"{c.recurrent_layers} recurrent"] * bool(
            c.recurrent_layers)
        out += [f"Decoding cache of one sequence ({' and '.join(kinds)} layers; runtime/cache.py)"]
        rows = [["numbers per position", f"{c.per_position:,}"]]
        if c.windowed:
            rows.append(["numbers per position, sliding-window layers (kept for their window only)",
                         f"{c.windowed:,}"])
        if c.state:
            rows.append(["numbers of the recurrent layers' states (the same at any length)", f"{c.state:,}"])
        rows += [[f"at n = {c.length}: float32", _bytes(4 * c.at_length)],
                 [f"at n = {c.length}: bf16", _bytes(2 * c.at_length)]]
        out += _table(["", "size"], rows, right={1}) + [""]

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


def render_train_cost(cost: TrainCost) -> str:
    sentences = cost.batch_tokens / cost.length
    out = [f"Training cost (Table 2): {cost.steps:,} steps x {cost.batch_tokens:,} target tokens and as many "
           "source tokens,",
           f"as {sentences:,.4g} sentence pairs of n = {cost.length} tokens (-n); matrix products only, "
           "2 FLOPs per multiply-add,",
           "backward = 2 x forward (softmax, LayerNorm, elementwise ops, loss and optimizer not counted)"]
    per_token = "forward, per token"
    if cost.per_token_slope is not None:
        per_token += f" = {cost.per_token_fixed:,} + {cost.per_token_slope:,} n"
    rows = [[per_token, f"{cost.forward_per_token:,.0f}"], ["forward, per step", f"{cost.forward_per_step:.3e}"],
            ["forward + backward, per step", f"{cost.per_step:.3e}"],
            [f"total, {cost.steps:,} steps", f"{cost.total:.3e}"]]
    out += _table(["", "FLOPs"], rows, right={1}) + [""]

    out += ["Table 2's method: training time x GPUs x sustained single-precision FLOPS per GPU "
            f"(P100: {GPU_TFLOPS['P100']} TFLOPS)"]
    rows = []
    for run in PAPER_RUNS:
        ours = cost.paper is run
        rows.append([run.model, f"{run.steps:,}", f"{run.hours:g} h x {run.gpus} {run.gpu}", f"{run.estimate:.3e}",
                     f"{run.table2:.1e}", f"{cost.total:.3e}" if ours else "-",
                     f"{cost.total / run.table2:.2g}" if ours else "-"])
    out += _table(["paper model", "steps", "GPU time", "that product", "Table 2", "this count", "ratio"], rows,
                  right={1, 3, 4, 5, 6})
    if cost.paper is None:
        out.append("This spec's layers are neither of the paper's two models: their figures are for reference.")
    elif cost.steps != cost.paper.steps:
        out.append(f"This count is for {cost.steps:,} steps, the paper's for {cost.paper.steps:,}.")
    out += ["Table 2 counts GPU time at peak rate, including any time not spent at that rate; this count is the",
            "arithmetic the steps need, so the ratio is the fraction of peak the paper's training implies."]
    return "\n".join(out)
