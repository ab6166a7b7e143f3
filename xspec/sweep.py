"""Table 3 as an experiment: train every variant spec with the same budget, then tabulate and judge them.

The paper's Table 3 (EN-DE dev set, newstest2013; beam search, no checkpoint averaging) compares
each model variation with the base model at 100K steps, and §6.2 reads a direction of effect off each
row. `run_sweep` does the same for a folder of variant specs on whatever corpus is given, at whatever
scale fits the machine:

- every variant (and the base model) gets the same `--set` overrides and the same step budget;
- `width_divisor` divides each model's widths (d_model, d_ff, d_k, d_v) by the same factor, so a
  row keeps its ratio to the base model (row A still holds h * d_k constant; row C's d_model 256
  is still half of base) while the model becomes small enough for a CPU;
- variants share the base run's sentencepiece vocabulary (trained once, §5.1), so their
  perplexities count the same subwords;
- dev perplexity is exp(cross entropy per target subword, no label smoothing); dev BLEU is sacreBLEU
  on beam-search output of the last checkpoint (the runtime averages nothing during training).

A difference from base means something only beside the spread of base itself, and a table means
something only when its models learned. So:

- the base row trains with `seeds` seeds (train.seed s, s+1, ...; the first run in OUT/runs/base, the
  k-th in OUT/runs/base-seedK); its **noise band** is mean ± 2 sample standard deviations over them
  (`noise_band`), for dev PPL and dev BLEU apart. `seeds_all` gives every row that many seeds.
- a run **learned** when its dev cross entropy is at most half that of the unigram model of the
  training targets (PPL <= sqrt(unigram PPL) of the dev targets, in the run's own subwords: context
  explains at least half of what subword frequencies leave open) and its dev BLEU is at least
  `MIN_BLEU` (`learned`). A row learned when all its runs did; rows that did not are marked and
  judged no further, and when base did not, nothing is judged (`judge`; the command then fails). After a
  base run that did not learn, the variants are not trained (hours each at a real scale), unless `keep_going`.
- a row's difference from base (the mean over base's seeds) is **above noise** when it exceeds the
  band's half width; its direction is then set beside the paper's (`PAPER_DIRECTIONS`): agrees,
  disagrees, or cannot tell (within noise).

Each run trains through the runtime (`xspec.runtime.train.train`) in its own run directory. A run
with `metrics.json` is finished and is not retrained; one with checkpoints but no `metrics.json`
resumes from its last checkpoint. The report (table3.md, table3.csv and curves.png, the runs'
training curves) is rewritten after every run, so an interrupted sweep leaves a partial but valid table.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import xspec
from xspec.errors import UserError
from xspec.files import read_regular_file, write_atomically, write_bytes_atomically
from xspec.runtime.unigram import token_counts, unigram_perplexity
from xspec.stats.architecture import PAPER_NAMES, architecture

CONFIG_FILE = "sweep.json"
CURVES_FILE = "curves.png"
UNIGRAM_FILE = "unigram.json"           # OUT/unigram.json: each vocabulary's unigram perplexity, computed once
WIDTHS = ("d_model", "d_ff", "d_k", "d_v")
DEFAULT_SEEDS = 3                       # the fewest for which mean ± 2 std is more than a guess at the spread
MIN_BLEU = 5.0                          # below this, sacreBLEU rewards little more than frequent words
BAND_WIDTH = 2.0                        # the noise band: mean ± BAND_WIDTH sample standard deviations
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
Effect = Literal["better", "worse", "same"]
# The paper's direction of effect of each row against base, (on dev PPL, on dev BLEU): §6.2's words where
# it has some, else Table 3's numbers (a BLEU difference of 0.1 or a PPL difference under 0.05: the same).
PAPER_DIRECTIONS: dict[str, tuple[Effect, Effect]] = {
    "A_heads1": ("worse", "worse"),         # §6.2: single-head attention is 0.9 BLEU worse than the best
    "A_heads4": ("worse", "worse"),         # Table 3: 5.00 / 25.5, slightly worse
    "A_heads16": ("same", "same"),          # Table 3: 4.91 / 25.8
    "A_heads32": ("worse", "worse"),        # §6.2: quality also drops off with too many heads
    "B_dk16": ("worse", "worse"),           # §6.2: reducing the attention key size d_k hurts model quality
    "B_dk32": ("worse", "worse"),
    "C_layers2": ("worse", "worse"),        # §6.2: bigger models are better (so smaller ones worse)
    "C_layers4": ("worse", "worse"),
    "C_layers8": ("better", "better"),      # §6.2's claim; Table 3's own BLEU for N 8 is 25.5, below base
    "C_dmodel256": ("worse", "worse"),
    "C_dmodel1024": ("better", "better"),
    "C_dff1024": ("worse", "worse"),
    "C_dff4096": ("better", "better"),
    "D_drop0": ("worse", "worse"),          # §6.2: dropout is very helpful in avoiding over-fitting
    "D_drop02": ("same", "worse"),          # Table 3: 4.95 / 25.5
    "D_ls0": ("better", "worse"),           # §5.4: label smoothing hurts perplexity, improves BLEU
    "D_ls02": ("worse", "same"),            # Table 3: 5.47 / 25.7
    "E_learned_positions": ("same", "same"),  # §6.2: nearly identical results to the base model
    "big": ("better", "better"),            # Table 3: 4.33 / 26.4
}
METRICS = ("ppl", "bleu")
LOWER_IS_BETTER = {"ppl": True, "bleu": False}
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
    seeds: int = DEFAULT_SEEDS          # the base row's seeds: its spread is the noise band
    seeds_all: bool = False             # every row gets `seeds` seeds, not only base
    keep_going: bool = False            # train the variants even after a base run that did not learn

    def fingerprint(self) -> dict[str, Any]:
        """What must match for an existing sweep directory to be continued rather than mixed. The seeds
        are not in it: more seeds add runs and change none, so a sweep can gain them later."""
        return {"steps": self.steps, "overrides": self.overrides, "width_divisor": self.width_divisor,
                "data": self.data, "src_lang": self.src_lang, "tgt_lang": self.tgt_lang,
                "dev_lines": self.dev_lines}

    def seeds_of(self, is_base: bool) -> int:
        return self.seeds if is_base or self.seeds_all else 1


@dataclass
class Run:
    """One training run of a row: the row's first seed trains in OUT/runs/NAME, the k-th in OUT/runs/NAME-seedK."""

    name: str
    seed: int                           # train.seed
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    unigram_ppl: float | None = None    # of the dev targets, in this run's subwords (`learned`)

    @property
    def finished(self) -> bool:
        return bool(self.metrics)

    @property
    def ppl(self) -> float:
        loss = self.metrics.get("valid_loss")
        return math.inf if loss is None else math.exp(loss)

    @property
    def bleu(self) -> float:
        return float(self.metrics.get("bleu", 0.0))

    @property
    def learned(self) -> bool:
        return self.finished and self.unigram_ppl is not None and learned(self.ppl, self.bleu, self.unigram_ppl)


def run_name(row_name: str, k: int) -> str:
    """The run directory of a row's k-th seed (k from 1): the first keeps the row's name, so a sweep
    made before seeds existed (or with one seed) continues as it was."""
    return row_name if k == 1 else f"{row_name}-seed{k}"


def seed_runs(row_name: str, first_seed: int, count: int) -> list[Run]:
    return [Run(run_name(row_name, k), first_seed + k - 1) for k in range(1, count + 1)]


@dataclass(frozen=True)
class Outcome:
    """A row's dev figures over its finished runs."""

    ppls: tuple[float, ...]
    bleus: tuple[float, ...]
    learned: bool                       # every finished run learned

    @property
    def ppl(self) -> float:
        return statistics.fmean(self.ppls)

    @property
    def bleu(self) -> float:
        return statistics.fmean(self.bleus)


@dataclass
class Row:
    name: str
    row: str                            # Table 3's row letter, "base" or the model's name
    columns: dict[str, Any]             # the varied columns, at the spec's own size
    trained_columns: dict[str, Any]     # the same, as trained (after overrides and the width divisor)
    spec_parameters: int
    trained_parameters: int
    runs: list[Run] = field(default_factory=list)   # one per seed, the first seed first

    @property
    def done(self) -> list[Run]:
        return [run for run in self.runs if run.finished]

    @property
    def finished(self) -> bool:
        return bool(self.runs) and all(run.finished for run in self.runs)

    @property
    def error(self) -> str | None:
        return next((f"{run.name}: {run.error}" for run in self.runs if run.error), None)

    def outcome(self) -> Outcome | None:
        done = self.done
        if not done:
            return None
        return Outcome(tuple(r.ppl for r in done), tuple(r.bleu for r in done), all(r.learned for r in done))


# --- did it learn? -------------------------------------------------------------------------------

def learning_threshold(unigram_ppl: float) -> float:
    """The highest dev PPL a model that learned may have: half the unigram model's cross entropy."""
    return math.sqrt(unigram_ppl)


def learned(ppl: float, bleu: float, unigram_ppl: float) -> bool:
    return ppl <= learning_threshold(unigram_ppl) and bleu >= MIN_BLEU


class UnigramFloors:
    """Each vocabulary's unigram perplexity of the dev targets, computed once and kept in OUT/unigram.json
    (encoding a large training corpus takes minutes; every sitting of a sweep would repeat it)."""

    def __init__(self, corpus: Corpus, out_dir: Path) -> None:
        self.corpus, self.path = corpus, out_dir / UNIGRAM_FILE
        self.known: dict[str, float] = _read_json(self.path, "unigram perplexities") if self.path.exists() else {}

    def of(self, run_dir: Path) -> float | None:
        """The floor in `run_dir`'s own subwords; None when the run has no vocabulary yet."""
        from xspec.runtime.vocab import MODEL_FILE, Vocab

        model = run_dir / MODEL_FILE
        if not model.exists():
            return None
        proto = read_regular_file(model)
        key = hashlib.sha256(proto).hexdigest()
        if key not in self.known:
            self.known[key] = self._compute(Vocab.from_bytes(proto, str(model)))
            write_atomically(self.path, json.dumps(self.known, indent=2) + "\n")
        return float(self.known[key])

    def _compute(self, vocab) -> float:
        from xspec.runtime.corpus import read_lines
        from xspec.runtime.vocab import EOS

        def encoded(path: Path) -> list[list[int]]:
            return [ids + [EOS] for ids in vocab.encode([line for line in read_lines(path) if line.strip()])]

        return unigram_perplexity(token_counts(encoded(self.corpus.train_tgt)), encoded(self.corpus.dev_tgt),
                                  len(vocab))


# --- noise band and verdicts ---------------------------------------------------------------------

@dataclass(frozen=True)
class Band:
    """The spread of base over its seeds: mean ± half_width (BAND_WIDTH sample standard deviations)."""

    mean: float
    half_width: float
    values: tuple[float, ...]


def noise_band(values: Sequence[float]) -> Band | None:
    """None for fewer than two seeds: one run says nothing about the spread."""
    if len(values) < 2:
        return None
    return Band(statistics.fmean(values), BAND_WIDTH * statistics.stdev(values), tuple(values))


@dataclass(frozen=True)
class Comparison:
    """One metric of one row against base."""

    metric: str                         # "ppl" or "bleu"
    difference: float                   # the row's value minus base's (the mean over its seeds)
    half_width: float | None            # the noise band's; None: base has one seed
    paper: Effect | None                # the paper's direction; None: not a row of Table 3

    @property
    def above_noise(self) -> bool | None:
        return None if self.half_width is None else abs(self.difference) > self.half_width

    @property
    def ours(self) -> Effect | None:
        """Our direction, when the difference is above noise."""
        if not self.above_noise:
            return None
        return "better" if (self.difference < 0) == LOWER_IS_BETTER[self.metric] else "worse"

    @property
    def verdict(self) -> str:
        return {None: "no noise band", True: "above noise", False: "within noise"}[self.above_noise]

    @property
    def agreement(self) -> str:
        return agreement(self.paper, self.above_noise, self.ours)


def agreement(paper: Effect | None, above_noise: bool | None, ours: Effect | None) -> str:
    """Within noise agrees only with "the same"; above noise agrees when the directions match."""
    if paper is None:
        return "-"
    if above_noise is None:
        return "cannot tell"
    if not above_noise:
        return "agrees" if paper == "same" else "cannot tell"
    return "agrees" if ours == paper else "disagrees"


def compare(metric: str, value: float, base_value: float, band: Band | None, paper: Effect | None) -> Comparison:
    return Comparison(metric, value - base_value, None if band is None else band.half_width, paper)


@dataclass(frozen=True)
class Judgement:
    base: Outcome | None
    bands: dict[str, Band | None]                        # by metric; empty when base did not learn
    comparisons: dict[str, dict[str, Comparison]]        # row name -> metric -> comparison: learned rows only

    @property
    def base_learned(self) -> bool:
        return self.base is not None and self.base.learned


def judge(rows: Sequence[Row]) -> Judgement:
    """The verdicts of every learned row against base (rows[0]); none at all when base did not learn."""
    base = rows[0].outcome()
    if base is None or not base.learned:
        return Judgement(base, {}, {})
    bands = {"ppl": noise_band(base.ppls), "bleu": noise_band(base.bleus)}
    comparisons = {}
    for row in rows[1:]:
        outcome = row.outcome()
        if outcome is None or not outcome.learned:
            continue
        paper = PAPER_DIRECTIONS.get(row.name, (None, None))
        comparisons[row.name] = {
            metric: compare(metric, getattr(outcome, metric), getattr(base, metric), bands[metric], direction)
            for metric, direction in zip(METRICS, paper)}
    return Judgement(base, bands, comparisons)


def base_problem(rows: Sequence[Row]) -> str | None:
    """Why the table cannot be read as a result, or None: base failed, has not trained, or did not learn."""
    base = rows[0]
    outcome = base.outcome()
    if outcome is None:
        return f"the base model failed ({base.error})" if base.error else "the base model has not trained yet"
    if outcome.learned:
        return None
    return f"the base model did not learn ({_learning_text(base)})"


def _learning_text(row: Row) -> str:
    """Which of a row's runs missed the bar, and by what."""
    missed = [run for run in row.done if not run.learned]
    parts = []
    for run in missed:
        if run.unigram_ppl is None:
            parts.append(f"{run.name}: no vocabulary to judge it by")
            continue
        parts.append(f"{run.name}: dev PPL {run.ppl:.2f}, needs <= {learning_threshold(run.unigram_ppl):.2f}; "
                     f"dev BLEU {run.bleu:.2f}, needs >= {MIN_BLEU:g}")
    return "; ".join(parts)


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
    """The row's columns at the spec's own size, its runs (one per seed), and the spec as the sweep trains it."""
    full = xspec.compile(str(path))
    trained = xspec.compile(str(path), overrides=shrink(path, {**config.overrides, "train.max_steps": config.steps},
                                                        config.width_divisor))
    row = Row(name=path.stem, row=row_label(path.stem, is_base),
              columns={c: getattr(architecture(full), c) for c in COLUMNS},
              trained_columns={c: getattr(architecture(trained), c) for c in COLUMNS},
              spec_parameters=full.parameters, trained_parameters=trained.parameters,
              runs=seed_runs(path.stem, trained.train.seed, config.seeds_of(is_base)))
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
    """Trains one run to the budget (or resumes it); returns the runtime's final figures.

    `vocab_file`: a sentencepiece model to reuse (the runtime keeps a run directory's vocabulary),
    so that every run reads the same subwords; None lets the runtime train one.
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
    """Trains every row's runs in order, base's seeds first (its noise band is known early); finished runs
    are read, not retrained. After a base run that did not learn, the variants are not trained."""
    _check_or_record(config)
    if config.threads is not None:
        import torch

        torch.set_num_threads(config.threads)
    corpus = prepare_corpus(config)
    floors = UnigramFloors(corpus, config.out_dir)
    described = [describe(path, config, is_base=i == 0) for i, path in enumerate(config.variants)]
    rows = [row for row, _ in described]
    runs = [(run, spec) for row, spec in described for run in row.runs]
    say(f"sweep: {len(rows)} models, {len(runs)} runs, {config.steps} steps each, on {corpus.description}")
    base_spec, base_dir = described[0][1], config.out_dir / "runs" / rows[0].name
    skipped = 0
    for index, (run, spec) in enumerate(runs, start=1):
        run_dir = config.out_dir / "runs" / run.name
        if not (run_dir / "metrics.json").exists() and _hopeless(rows[0], config):
            skipped += 1
            continue
        vocab = _shared_vocabulary(spec, base_spec, base_dir, run_dir)
        tag = f"[{index}/{len(runs)}] {run.name}"
        seconds = _train_run(run, spec, run_dir, vocab, tag, corpus, config, say)
        if run.finished:
            run.unigram_ppl = floors.of(run_dir)
            say(f"{tag}: {_run_line(run)} ({seconds:.0f} s)")
        write_report(rows, config, corpus)
    if skipped:
        say(f"{rows[0].name} did not learn: {skipped} runs not trained, since nothing could be compared with it "
            "(--keep-going trains them anyway)")
    return rows


def _train_run(run: Run, spec, run_dir: Path, vocab: Path | None, tag: str, corpus: Corpus, config: SweepConfig,
               say) -> float:
    """Fills `run.metrics` (trained, resumed or read back), or `run.error` when the runtime refuses or fails;
    returns the seconds it took."""
    from xspec.runtime.train import Interrupted

    if (run_dir / "metrics.json").exists():
        say(f"{tag}: finished earlier, not retrained")
    else:
        say(f"{tag}: training {config.steps} steps, seed {run.seed} ({spec.parameters:,} parameters)")
    seeded = spec if run.seed == spec.train.seed else spec.with_overrides({"train.seed": run.seed})
    started = time.time()
    try:
        run.metrics = train_variant(seeded, corpus, vocab, run_dir, config)
    except Interrupted:
        raise                           # Ctrl-C: the run wrote a checkpoint; the sweep stops here
    except UserError as error:
        # One run that diverges (or lacks memory) must not cost the others theirs; the report shows it,
        # and re-running the sweep tries it again.
        run.error = str(error)
        say(f"{tag}: failed: {error}")
    return time.time() - started


def _hopeless(base: Row, config: SweepConfig) -> bool:
    """A finished base run that did not learn makes the base row unlearned whatever its other seeds do:
    the rest of the sweep (hours, at a real scale) could not be judged."""
    return not config.keep_going and any(run.finished and not run.learned for run in base.runs)


def _run_line(run: Run) -> str:
    line = f"dev ppl {_fmt_number(run.ppl)}, dev BLEU {run.bleu:.2f}"
    if run.unigram_ppl is None:
        return line
    verdict = "learned" if run.learned else "DID NOT LEARN"
    return (f"{line}; {verdict} (needs ppl <= {learning_threshold(run.unigram_ppl):.2f}, "
            f"the square root of the unigram ppl {run.unigram_ppl:.1f}, and BLEU >= {MIN_BLEU:g})")


def _shared_vocabulary(spec, base_spec, base_dir: Path, run_dir: Path) -> Path | None:
    """§5.1: one shared vocabulary. The base model's first run trains it; every other run of the same
    vocabulary size reuses it, so their perplexities count the same subwords."""
    from xspec.runtime.vocab import MODEL_FILE

    same = (spec.data.vocab_size, spec.data.vocab_model) == (base_spec.data.vocab_size, base_spec.data.vocab_model)
    shared = base_dir / MODEL_FILE
    return shared if same and run_dir != base_dir and shared.exists() else None


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


# --- the report ----------------------------------------------------------------------------------

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


def _fmt_number(value: float, signed: bool = False) -> str:
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
        value = "" if outcome is None else _fmt_number(getattr(outcome, metric))
        cells += [value, _fmt_number(comparison.difference, signed=True) if comparison else "",
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
