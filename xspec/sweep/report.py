"""The sweep's report: table3.md (the table, how to read it, this sweep's noise band), table3.csv (every
figure, each run's beside the means) and curves.png (every run's training curve)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from xspec.base.files import write_atomically
from xspec.stats.architecture import PAPER_NAMES
from xspec.sweep.paper import COLUMNS, METRICS, PAPER_DIRECTIONS, PAPER_TABLE3
from xspec.sweep.rows import MIN_BLEU, WIDTHS, Corpus, Outcome, Row, Run, SweepConfig
from xspec.sweep.verdicts import BAND_WIDTH, Judgement, base_problem, judge

CURVES_FILE = "curves.png"


def write_report(rows: list[Row], config: SweepConfig, corpus: Corpus) -> tuple[Path, Path]:
    curves = write_curves(rows, config)
    judgement = judge(rows)
    markdown = write_atomically(config.report_dir / "table3.md",
                                render_markdown(rows, config, corpus, curves, judgement))
    table = write_atomically(config.report_dir / "table3.csv", render_csv(rows, judgement))
    return markdown, table


def write_curves(rows: list[Row], config: SweepConfig) -> Path | None:
    """The training curves of every run that has logged steps, in the table's order; None before any has."""
    from xspec.plot import plot_runs       # matplotlib: only once there is something to draw

    path = config.report_dir / CURVES_FILE
    run_dirs = [config.out_dir / "runs" / run.name for row in paper_order(rows) for run in row.runs]
    drawn = plot_runs(run_dirs, path, title=f"Table 3 sweep: {config.steps} steps per model", skip_empty=True)
    return path if drawn else None


def _fmt(value: Any) -> str:
    if isinstance(value, tuple):
        return "/".join(_fmt(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def fmt_number(value: float, signed: bool = False) -> str:
    if not math.isfinite(value):
        return "-"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


HEADER = ("row", "spec", *(PAPER_NAMES[c] for c in COLUMNS), "train steps", "seeds", "learned",
          "PPL (dev)", "Δ PPL", "PPL verdict", "BLEU (dev)", "Δ BLEU", "BLEU verdict",
          "paper: PPL/BLEU", "ours vs paper", "params (spec)", "params (trained)", "paper: PPL", "paper: BLEU")


def render_markdown(rows: list[Row], config: SweepConfig, corpus: Corpus, curves: Path | None = None,
                    judgement: Judgement | None = None) -> str:
    judgement = judgement or judge(rows)
    runs = [run for row in rows for run in row.runs]
    hours = sum(run.metrics.get("wall_s", 0.0) for run in runs) / 3600
    lines = ["# Table 3, regenerated", ""]
    problem = base_problem(rows)
    if problem is not None:
        lines += [f"**Not a result: {problem}. No row is compared with base and no verdicts are written; "
                  "train longer (`--steps`) or wider (a smaller `--width-divisor`).**", ""]
    lines += [
        "Produced by:",
        "",
        "```",
        config.command,
        "```",
        "",
        f"Data: {corpus.description}. Every model: the spec's own values, then {_overrides_text(config)}, "
        f"{config.steps} training steps, no checkpoint averaging, beam search with the spec's decode "
        "settings (§6.1: beam 4, alpha 0.6). PPL is per subword of the shared sentencepiece vocabulary. "
        f"{sum(r.finished for r in runs)} of {len(runs)} runs trained, {hours * 60:.0f} min of runs in all.",
        "",
        f"**These are not the paper's numbers.** The paper trains each model for 100K steps of ~25000 "
        f"tokens on WMT 2014 EN-DE with 8 GPUs; this table trains each at "
        f"{_scale_text(config)} for {config.steps} steps on {config.device.upper()}. "
        "The paper's dev figures (newstest2013) are in the last two columns for reference.",
        "",
        *_reading_guide(config, judgement),
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(_markdown_cells(row, rows[0], judgement)) + " |" for row in paper_order(rows)]
    if curves is not None:
        lines += ["", f"![Training curves of every run]({curves.name})"]
    failures = [f"- {r.name} failed: {r.error}" for r in rows if r.error]
    if failures:
        lines += ["", *failures]
    signature = next((run.metrics["bleu_signature"] for run in runs if "bleu_signature" in run.metrics), None)
    if signature:
        lines += ["", f"sacreBLEU: `{signature.split(' = ')[0]}`"]
    return "\n".join(lines) + "\n"


def _reading_guide(config: SweepConfig, judgement: Judgement) -> list[str]:
    """How the verdict columns are made, with this sweep's band and bar."""
    seeds = f"{config.seeds} seeds" + (", every row" if config.seeds_all else " (the other rows: one)")
    return [
        f"- **Noise band**: base trains with {seeds}, train.seed s, s+1, ...; the band is their mean "
        f"± {BAND_WIDTH:g} sample standard deviations, for dev PPL and dev BLEU apart. "
        f"{_bands_text(judgement)}",
        "- **Learned**: a run learned when its dev PPL is at most the square root of the unigram perplexity "
        "of the dev targets (the training targets' subword frequencies, in the run's own vocabulary: the "
        f"context explains at least half of their cross entropy) and its dev BLEU is at least {MIN_BLEU:g}; "
        "a row learned when all its runs did. Rows that did not learn are judged no further.",
        "- **Verdict**: Δ is a row's value (the mean over its seeds) minus base's mean; above noise when |Δ| "
        "exceeds the band's half width, otherwise within noise.",
        "- **Ours vs paper**: the paper's direction of each row (on PPL / on BLEU: §6.2's words, else Table "
        "3's numbers) beside ours: agrees (above noise in the same direction, or within noise where the paper "
        "saw no change), disagrees (above noise the other way, or where the paper saw none), cannot tell "
        "(within noise).",
    ]


def _bands_text(judgement: Judgement) -> str:
    if not judgement.bands:
        return "(No band: base has not learned.)"
    parts = []
    for metric, band in judgement.bands.items():
        name = metric.upper() if metric == "ppl" else "BLEU"
        if band is None:
            parts.append(f"{name}: no band (one base run)")
        else:
            values = ", ".join(f"{v:.2f}" for v in band.values)
            parts.append(f"{name} {band.mean:.2f} ± {band.half_width:.2f} (runs: {values})")
    return "This sweep: " + "; ".join(parts) + "."


def _markdown_cells(row: Row, base: Row, judgement: Judgement) -> list[str]:
    cells = [row.row, row.name]
    for c in COLUMNS:
        same = row is not base and row.columns[c] == base.columns[c]
        cells.append("" if same else _fmt(row.columns[c]))
    outcome = row.outcome()
    steps = next((str(run.metrics["steps"]) for run in row.done), "(failed)" if row.error else "(not yet)")
    compared = judgement.comparisons.get(row.name, {})
    paper = PAPER_TABLE3.get(row.name)
    direction = PAPER_DIRECTIONS.get(row.name)
    cells += [steps, f"{len(row.done)}/{len(row.runs)}" if not row.finished else str(len(row.runs)),
              _learned_cell(outcome)]
    for metric in METRICS:
        comparison = compared.get(metric)
        value = "" if outcome is None else fmt_number(getattr(outcome, metric))
        cells += [value, fmt_number(comparison.difference, signed=True) if comparison else "",
                  comparison.verdict if comparison else ""]
    agreement = " / ".join(compared[m].agreement for m in METRICS) if compared and direction else ""
    return cells + ["/".join(direction) if direction else "", agreement,
                    f"{row.spec_parameters / 1e6:.1f}M", f"{row.trained_parameters / 1e6:.2f}M",
                    f"{paper[0]:.2f}" if paper else "", f"{paper[1]:.1f}" if paper else ""]


def _learned_cell(outcome: Outcome | None) -> str:
    if outcome is None:
        return ""
    return "yes" if outcome.learned else "**did not learn**"


def paper_order(rows: list[Row]) -> list[Row]:
    """Table 3's own row order where a file is one of its rows; other files after, as found."""
    order = {name: i for i, name in enumerate(PAPER_TABLE3)}
    return sorted(rows, key=lambda r: order.get(r.name, len(order)))


def _overrides_text(config: SweepConfig) -> str:
    if not config.overrides:
        return "no overrides"
    return "`" + " ".join(f"{k}={v}" for k, v in config.overrides.items()) + "`"


def _scale_text(config: SweepConfig) -> str:
    if config.width_divisor == 1:
        return "its own width"
    return f"1/{config.width_divisor} of its width (d_model, d_ff, d_k, d_v)"


CSV_HEADER = ("row", "spec", *COLUMNS, *(f"trained_{c}" for c in WIDTHS), "train_steps", "seeds", "learned",
              "dev_ppl", "dev_bleu", "dev_ppl_runs", "dev_bleu_runs", "unigram_ppl", "ppl_difference",
              "ppl_verdict", "bleu_difference", "bleu_verdict", "paper_ppl_direction", "paper_bleu_direction",
              "ppl_vs_paper", "bleu_vs_paper", "params_spec", "params_trained", "train_seconds", "wall_seconds")


def render_csv(rows: list[Row], judgement: Judgement | None = None) -> str:
    """One line per row: means over its finished runs, each run's figure space-separated beside them."""
    judgement = judgement or judge(rows)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for row in paper_order(rows):
        outcome, done = row.outcome(), row.done
        compared = judgement.comparisons.get(row.name, {})
        direction = PAPER_DIRECTIONS.get(row.name, ("", ""))
        figures = ["", "", "", "", ""] if outcome is None else [
            "yes" if outcome.learned else "no", f"{outcome.ppl:.2f}", f"{outcome.bleu:.2f}",
            " ".join(f"{v:.2f}" for v in outcome.ppls), " ".join(f"{v:.2f}" for v in outcome.bleus)]
        unigram = next((f"{r.unigram_ppl:.2f}" for r in done if r.unigram_ppl is not None), "")
        verdicts = []
        for metric in METRICS:
            c = compared.get(metric)
            verdicts += [f"{c.difference:.4g}", c.verdict] if c else ["", ""]
        writer.writerow([row.row, row.name, *(_fmt(row.columns[c]) for c in COLUMNS),
                         *(_fmt(row.trained_columns[c]) for c in WIDTHS),
                         next((r.metrics.get("steps", "") for r in done), ""), len(done), *figures, unigram,
                         *verdicts, *direction, *(compared[m].agreement if compared else "" for m in METRICS),
                         row.spec_parameters, row.trained_parameters,
                         _total(done, "train_seconds"), _total(done, "wall_s")])
    return out.getvalue()


def _total(runs: list[Run], key: str) -> str:
    values = [run.metrics[key] for run in runs if key in run.metrics]
    return f"{sum(values):.1f}" if values else ""
