"""Table 3 as an experiment: train every variant spec with the same budget, then tabulate them.

The paper's Table 3 (EN-DE dev set, newstest2013; beam search, no checkpoint averaging) compares
each model variation with the base model at 100K steps. `run_sweep` does the same for a folder of
variant specs on whatever corpus is given, at whatever scale fits the machine:

- every variant (and the base model) gets the same `--set` overrides and the same step budget;
- `width_divisor` divides each model's widths (d_model, d_ff, d_k, d_v) by the same factor, so a
  row keeps its ratio to the base model (row A still holds h * d_k constant; row C's d_model 256
  is still half of base) while the model becomes small enough for a CPU;
- variants share the base run's sentencepiece vocabulary (trained once, §5.1), so their
  perplexities count the same subwords;
- dev perplexity is exp(cross entropy per target subword, no label smoothing); dev BLEU is sacreBLEU
  on beam-search output of the last checkpoint (the runtime averages nothing during training).

Each variant trains through the runtime (`xspec.runtime.train.train`) in its own run directory
`OUT/runs/NAME`. A variant whose run has `metrics.json` is finished and is not retrained; one with
checkpoints but no `metrics.json` resumes from its last checkpoint. The report (table3.md, table3.csv
and curves.png, the runs' training curves) is rewritten after every variant, so an interrupted sweep
leaves a partial but valid table.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xspec
from xspec.errors import UserError
from xspec.files import read_regular_file, write_atomically, write_bytes_atomically
from xspec.stats.architecture import PAPER_NAMES, architecture

CONFIG_FILE = "sweep.json"
CURVES_FILE = "curves.png"
WIDTHS = ("d_model", "d_ff", "d_k", "d_v")
# Table 3 of the paper (EN-DE dev set, newstest2013): (PPL, BLEU) by variant file, in the paper's row order.
PAPER_TABLE3: dict[str, tuple[float, float]] = {
    "base": (4.92, 25.8),
    "A_heads1": (5.29, 24.9), "A_heads4": (5.00, 25.5), "A_heads16": (4.91, 25.8), "A_heads32": (5.01, 25.4),
    "B_dk16": (5.16, 25.1), "B_dk32": (5.01, 25.4),
    "C_layers2": (6.11, 23.7), "C_layers4": (5.19, 25.3), "C_layers8": (4.88, 25.5),
    "C_dmodel256": (5.75, 24.5), "C_dmodel1024": (4.66, 26.0), "C_dff1024": (5.12, 25.4), "C_dff4096": (4.75, 26.2),
    "D_drop0": (5.77, 24.6), "D_drop02": (4.95, 25.5), "D_ls0": (4.67, 25.3), "D_ls02": (5.47, 25.7),
    "E_learned_positions": (4.92, 25.7),
    "big": (4.33, 26.4),
}
# Table 3's varied columns, in the paper's order.
COLUMNS = ("layers", "d_model", "d_ff", "heads", "d_k", "d_v", "dropout", "label_smoothing", "positions")


@dataclass(frozen=True)
class Corpus:
    """Training and development text. Table 3 reports the dev set, so dev serves validation and BLEU."""

    train_src: Path
    train_tgt: Path
    dev_src: Path
    dev_tgt: Path
    description: str


@dataclass(frozen=True)
class SweepConfig:
    variants: tuple[Path, ...]          # the base model first
    steps: int
    overrides: dict[str, Any]
    width_divisor: int
    data: str                           # "demo" or a folder (for the record and the report)
    src_lang: str
    tgt_lang: str
    dev_lines: int | None
    out_dir: Path
    report_dir: Path
    command: str                        # the command line that reproduces this sweep
    device: str = "cpu"
    threads: int | None = None          # torch CPU threads; None: torch's default
    progress: bool = False

    def fingerprint(self) -> dict[str, Any]:
        """What must match for an existing sweep directory to be continued rather than mixed."""
        return {"steps": self.steps, "overrides": self.overrides, "width_divisor": self.width_divisor,
                "data": self.data, "src_lang": self.src_lang, "tgt_lang": self.tgt_lang,
                "dev_lines": self.dev_lines}


@dataclass
class Row:
    name: str
    row: str                            # Table 3's row letter, "base" or the model's name
    columns: dict[str, Any]             # the varied columns, at the spec's own size
    trained_columns: dict[str, Any]     # the same, as trained (after overrides and the width divisor)
    spec_parameters: int
    trained_parameters: int
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def finished(self) -> bool:
        return bool(self.metrics)


# --- variants ------------------------------------------------------------------------------------

def find_variants(directory: Path, base: Path) -> tuple[Path, ...]:
    """The base spec, then the folder's specs in natural order (C_dmodel256 before C_dmodel1024)."""
    if not directory.is_dir():
        raise UserError(f"{directory}: not a folder of .xspec files")
    files = sorted(directory.glob("*.xspec"), key=_natural_key)
    if not files:
        raise UserError(f"{directory}: no .xspec files")
    if not base.is_file():
        raise UserError(f"{base}: the base spec does not exist (give one with --base)")
    return (base, *(f for f in files if f.resolve() != base.resolve()))


def _natural_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.stem)]


def row_label(name: str, is_base: bool) -> str:
    """Files are named after their rows: `A_heads1` is row A; `big` has no letter."""
    if is_base:
        return "base"
    prefix, sep, _ = name.partition("_")
    return prefix if sep and len(prefix) == 1 and prefix.isupper() else name


def shrink(spec_path: Path, overrides: dict[str, Any], divisor: int) -> dict[str, Any]:
    """The overrides that train `spec_path` at 1/divisor of its widths, after the sweep's own overrides."""
    if divisor == 1:
        return dict(overrides)
    params = xspec.compile(str(spec_path), overrides=overrides).params
    shrunk = dict(overrides)
    for name in WIDTHS:
        if name not in params:
            raise UserError(f"{spec_path}: --width-divisor needs a parameter named {name}")
        value = params[name]
        if value % divisor:
            raise UserError(f"{spec_path}: {name} = {value} is not divisible by --width-divisor {divisor}")
        shrunk[name] = value // divisor
    return shrunk


def describe(path: Path, config: SweepConfig, is_base: bool) -> tuple[Row, xspec.CompiledSpec]:
    """The row's columns at the spec's own size, and the spec as the sweep trains it."""
    full = xspec.compile(str(path))
    trained = xspec.compile(str(path), overrides=shrink(path, {**config.overrides, "train.max_steps": config.steps},
                                                        config.width_divisor))
    row = Row(name=path.stem, row=row_label(path.stem, is_base),
              columns={c: getattr(architecture(full), c) for c in COLUMNS},
              trained_columns={c: getattr(architecture(trained), c) for c in COLUMNS},
              spec_parameters=full.parameters, trained_parameters=trained.parameters)
    return row, trained


# --- data ----------------------------------------------------------------------------------------

def prepare_corpus(config: SweepConfig) -> Corpus:
    """The demo task (generated once into OUT/data) or a folder with train.SRC/TGT and val.SRC/TGT."""
    if config.data == "demo":
        from xspec.runtime.demo_data import write_demo_data

        folder = config.out_dir / "data"
        if not (folder / "valid.tgt").exists():
            write_demo_data(folder)
        train_src, train_tgt = folder / "train.src", folder / "train.tgt"
        dev_src, dev_tgt = folder / "valid.src", folder / "valid.tgt"
        description = "the built-in demo task (xspec.runtime.demo_data)"
    else:
        folder = Path(config.data)
        train_src = _corpus_file(folder, "train", config.src_lang)
        train_tgt = _corpus_file(folder, "train", config.tgt_lang)
        dev_src, dev_tgt = _dev_file(folder, config.src_lang), _dev_file(folder, config.tgt_lang)
        description = f"{folder} ({config.src_lang}->{config.tgt_lang})"
    if config.dev_lines is not None:
        dev_src, dev_tgt = (_head(f, config.dev_lines, config.out_dir / "dev") for f in (dev_src, dev_tgt))
        description += f", dev = the first {config.dev_lines} lines of {dev_src.name}"
    return Corpus(train_src, train_tgt, dev_src, dev_tgt, description)


def _corpus_file(folder: Path, split: str, lang: str) -> Path:
    path = folder / f"{split}.{lang}"
    if not path.is_file():
        raise UserError(f"{path}: missing; --data FOLDER needs train.SRC, train.TGT, val.SRC and val.TGT "
                        "(languages from --src-lang/--tgt-lang)")
    return path


def _dev_file(folder: Path, lang: str) -> Path:
    for split in ("val", "valid", "dev"):
        if (folder / f"{split}.{lang}").is_file():
            return folder / f"{split}.{lang}"
    return _corpus_file(folder, "val", lang)


def _head(path: Path, lines: int, folder: Path) -> Path:
    """The first `lines` lines of a dev file, written into the sweep directory (not the corpus)."""
    from xspec.runtime.corpus import read_lines

    return write_atomically(folder / path.name, "".join(line + "\n" for line in read_lines(path)[:lines]))


# --- training ------------------------------------------------------------------------------------

def train_variant(spec, corpus: Corpus, vocab_file: Path | None, run_dir: Path,
                  config: SweepConfig) -> dict[str, Any]:
    """Trains one variant to the budget (or resumes it); returns the runtime's final figures.

    `vocab_file`: a sentencepiece model to reuse (the runtime keeps a run directory's vocabulary),
    so that every variant reads the same subwords; None lets the runtime train one.
    """
    from xspec.runtime import checkpoint
    from xspec.runtime.run_dir import METRICS_FILE, DataFiles, Split
    from xspec.runtime.train import RunOptions, train
    from xspec.runtime.vocab import MODEL_FILE

    finished = run_dir / METRICS_FILE
    if finished.exists():
        return _read_json(finished, "the final figures of a run")
    if vocab_file is not None and not (run_dir / MODEL_FILE).exists():
        # The runtime reuses a run's vocabulary.
        write_bytes_atomically(run_dir / MODEL_FILE, read_regular_file(vocab_file))
    dev = Split(corpus.dev_src, corpus.dev_tgt)
    data = DataFiles(train=Split(corpus.train_src, corpus.train_tgt), valid=dev, test=dev)
    options = RunOptions(out_dir=run_dir, data=data, device=config.device, compile="off",
                         resume=bool(checkpoint.list_checkpoints(run_dir)), progress=config.progress)
    return train(spec, options)


def run_sweep(config: SweepConfig, say=print) -> list[Row]:
    from xspec.runtime.train import Interrupted

    _check_or_record(config)
    if config.threads is not None:
        import torch

        torch.set_num_threads(config.threads)
    corpus = prepare_corpus(config)
    say(f"sweep: {len(config.variants)} models, {config.steps} steps each, on {corpus.description}")
    described = [describe(path, config, is_base=i == 0) for i, path in enumerate(config.variants)]
    rows = [row for row, _ in described]
    base_spec, base_dir = described[0][1], config.out_dir / "runs" / rows[0].name
    for index, (row, spec) in enumerate(described, start=1):
        tag = f"[{index}/{len(rows)}] {row.name}"
        run_dir = config.out_dir / "runs" / row.name
        if (run_dir / "metrics.json").exists():
            say(f"{tag}: finished earlier, not retrained")
        else:
            say(f"{tag}: training {config.steps} steps ({spec.parameters:,} parameters)")
        started = time.time()
        try:
            row.metrics = train_variant(spec, corpus, _shared_vocabulary(spec, base_spec, base_dir), run_dir, config)
        except Interrupted:
            raise                       # Ctrl-C: the run wrote a checkpoint; the sweep stops here
        except UserError as error:
            # One variant that diverges (or lacks memory) must not cost the others their runs; the
            # report shows it, and re-running the sweep tries it again.
            row.error = str(error)
            say(f"{tag}: failed: {error}")
        else:
            say(f"{tag}: dev ppl {_ppl(row.metrics)}, dev BLEU {row.metrics.get('bleu', '-')} "
                f"({time.time() - started:.0f} s)")
        write_report(rows, config, corpus)
    return rows


def _shared_vocabulary(spec, base_spec, base_dir: Path) -> Path | None:
    """§5.1: one shared vocabulary. The base model's run trains it; variants of the same vocabulary
    size reuse it, so their perplexities count the same subwords."""
    from xspec.runtime.vocab import MODEL_FILE

    same = (spec.data.vocab_size, spec.data.vocab_model) == (base_spec.data.vocab_size, base_spec.data.vocab_model)
    shared = base_dir / MODEL_FILE
    return shared if same and spec is not base_spec and shared.exists() else None


def _check_or_record(config: SweepConfig) -> None:
    """A sweep directory continues only the sweep that made it: mixed budgets would make the table lie."""
    path = config.out_dir / CONFIG_FILE
    wanted = config.fingerprint()
    if path.exists():
        recorded = _read_json(path, "a sweep's settings")
        if recorded != json.loads(json.dumps(wanted)):
            differing = sorted(k for k in wanted if recorded.get(k) != json.loads(json.dumps(wanted[k])))
            raise UserError(f"{config.out_dir} holds a sweep with different settings ({', '.join(differing)}); "
                            "use another --output, or the same settings to continue it")
    else:
        write_atomically(path, json.dumps(wanted, indent=2) + "\n")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        value = json.loads(read_regular_file(path).decode("utf-8"))
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise UserError(f"{path}: not {what} as xspec writes them (not a JSON object)")
    return value


def _ppl(metrics: dict[str, Any]) -> str:
    loss = metrics.get("valid_loss")
    return "-" if loss is None else f"{math.exp(loss):.2f}"


# --- the report ----------------------------------------------------------------------------------

def write_report(rows: list[Row], config: SweepConfig, corpus: Corpus) -> tuple[Path, Path]:
    curves = write_curves(rows, config)
    markdown = write_atomically(config.report_dir / "table3.md", render_markdown(rows, config, corpus, curves))
    table = write_atomically(config.report_dir / "table3.csv", render_csv(rows))
    return markdown, table


def write_curves(rows: list[Row], config: SweepConfig) -> Path | None:
    """The training curves of every run that has logged steps, in the table's order; None before any has."""
    from xspec.plot import plot_runs       # matplotlib: only once there is something to draw

    path = config.report_dir / CURVES_FILE
    run_dirs = [config.out_dir / "runs" / row.name for row in paper_order(rows)]
    drawn = plot_runs(run_dirs, path, title=f"Table 3 sweep: {config.steps} steps per model", skip_empty=True)
    return path if drawn else None


def _fmt(value: Any) -> str:
    if isinstance(value, tuple):
        return "/".join(_fmt(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def render_markdown(rows: list[Row], config: SweepConfig, corpus: Corpus, curves: Path | None = None) -> str:
    header = ["row", "spec", *(PAPER_NAMES[c] for c in COLUMNS), "train steps", "PPL (dev)", "BLEU (dev)",
              "params (spec)", "params (trained)", "paper: PPL", "paper: BLEU"]
    finished = [r for r in rows if r.finished]
    hours = sum(r.metrics.get("wall_s", 0.0) for r in finished) / 3600
    lines = [
        "# Table 3, regenerated",
        "",
        "Produced by:",
        "",
        "```",
        config.command,
        "```",
        "",
        f"Data: {corpus.description}. Every model: the spec's own values, then {_overrides_text(config)}, "
        f"{config.steps} training steps, no checkpoint averaging, beam search with the spec's decode "
        "settings (§6.1: beam 4, alpha 0.6). PPL is per subword of the shared sentencepiece vocabulary. "
        f"{len(finished)} of {len(rows)} models trained, {hours * 60:.0f} minutes of runs in all.",
        "",
        f"**These are not the paper's numbers.** The paper trains each model for 100K steps of ~25000 "
        f"tokens on WMT 2014 EN-DE with 8 GPUs; this table trains each at "
        f"{_scale_text(config)} for {config.steps} steps on {config.device.upper()}. "
        "It shows the experiment end to end, not the paper's effect sizes; the paper's dev figures "
        "(newstest2013) are in the last two columns for reference.",
        "",
        "Columns show the spec's own values where they differ from base (blank: as base), as in the paper; "
        "`params (spec)` is the spec's size, `params (trained)` the size actually trained.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += ["| " + " | ".join(_markdown_cells(row, rows[0])) + " |" for row in paper_order(rows)]
    if curves is not None:
        lines += ["", f"![Training curves of every run]({curves.name})"]
    failures = [f"- {r.name} failed: {r.error}" for r in rows if r.error]
    if failures:
        lines += ["", *failures]
    signature = next((r.metrics["bleu_signature"] for r in rows if "bleu_signature" in r.metrics), None)
    if signature:
        lines += ["", f"sacreBLEU: `{signature.split(' = ')[0]}`"]
    return "\n".join(lines) + "\n"


def _markdown_cells(row: Row, base: Row) -> list[str]:
    cells = [row.row, row.name]
    for c in COLUMNS:
        same = row is not base and row.columns[c] == base.columns[c]
        cells.append("" if same else _fmt(row.columns[c]))
    m = row.metrics
    status = str(m["steps"]) if row.finished else "(failed)" if row.error else "(not yet)"
    paper = PAPER_TABLE3.get(row.name)
    return cells + [status, _ppl(m) if row.finished else "", f"{m['bleu']:.2f}" if "bleu" in m else "",
                    f"{row.spec_parameters / 1e6:.1f}M", f"{row.trained_parameters / 1e6:.2f}M",
                    f"{paper[0]:.2f}" if paper else "", f"{paper[1]:.1f}" if paper else ""]


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


def render_csv(rows: list[Row]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["row", "spec", *COLUMNS, *(f"trained_{c}" for c in ("d_model", "d_ff", "d_k", "d_v")),
                     "train_steps", "dev_ppl", "dev_bleu", "dev_valid_loss", "params_spec", "params_trained",
                     "train_seconds", "wall_seconds"])
    for row in paper_order(rows):
        m = row.metrics
        writer.writerow([row.row, row.name, *(_fmt(row.columns[c]) for c in COLUMNS),
                         *(_fmt(row.trained_columns[c]) for c in ("d_model", "d_ff", "d_k", "d_v")),
                         m.get("steps", ""), _ppl(m) if row.finished else "", m.get("bleu", ""),
                         m.get("valid_loss", ""), row.spec_parameters, row.trained_parameters,
                         m.get("train_seconds", ""), m.get("wall_s", "")])
    return out.getvalue()
