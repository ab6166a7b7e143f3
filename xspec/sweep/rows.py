"""What a sweep is made of: its settings, its corpus, its rows (one per variant spec) and their runs (one
per seed), and the bar a run must clear to count as having learned."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WIDTHS = ("d_model", "d_ff", "d_k", "d_v")
DEFAULT_SEEDS = 3                       # the fewest for which mean ± 2 std is more than a guess at the spread
MIN_BLEU = 5.0                          # below this, sacreBLEU rewards little more than frequent words


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
