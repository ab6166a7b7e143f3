"""The best validations of a run: which checkpoints to keep as the best, and when to stop early.

The criterion is the validation loss, or BLEU when `train.validate_bleu` is on. The `keep` best
validations have their weights in RUN/checkpoints/best/step-N.safetensors (`xspec average --best N`
averages them); `train.patience` stops training after that many validations in a row without a new
best (fairseq's --patience). The record travels in every checkpoint's training state, so a resumed
run judges as an uninterrupted one would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .checkpoint import CHECKPOINT_DIR, checkpoints_in, step_of, weights_file

BEST_DIR = "best"


@dataclass(frozen=True)
class Criterion:
    metric: str                         # "valid_loss" or "valid_bleu"
    higher_is_better: bool

    @classmethod
    def of(cls, validate_bleu: bool) -> "Criterion":
        return cls("valid_bleu", True) if validate_bleu else cls("valid_loss", False)

    def better(self, a: float, b: float) -> bool:
        return a > b if self.higher_is_better else a < b


@dataclass
class BestRecord:
    """The kept best validations, best first, and how many validations since the best."""

    kept: list[tuple[int, float]] = field(default_factory=list)      # (step, score)
    stale: int = 0

    def observe(self, step: int, score: float, criterion: Criterion, keep: int) -> tuple[bool, list[int]]:
        """Takes a validation in; returns whether it is among the `keep` best (its weights to be kept)
        and the steps that leave the kept set. A score that is not finite is never best."""
        if not math.isfinite(score):
            self.stale += 1
            return False, []
        if not self.kept or criterion.better(score, self.kept[0][1]):
            self.stale = 0
        else:
            self.stale += 1
        # A later validation ranks after an earlier one with the same score.
        position = sum(1 for _, s in self.kept if not criterion.better(score, s))
        if keep == 0 or position >= keep:
            return False, []
        self.kept.insert(position, (step, score))
        dropped = [s for s, _ in self.kept[keep:]]
        del self.kept[keep:]
        return True, dropped

    @property
    def best(self) -> Optional[tuple[int, float]]:
        return self.kept[0] if self.kept else None

    def state(self) -> dict:
        return {"kept": [[s, v] for s, v in self.kept], "stale": self.stale}

    @classmethod
    def from_state(cls, state) -> Optional["BestRecord"]:
        """None when `state` is not a record `state()` writes."""
        if not isinstance(state, dict) or set(state) != {"kept", "stale"} or not _count(state["stale"]) or \
                not isinstance(state["kept"], list):
            return None
        kept = []
        for entry in state["kept"]:
            if not (isinstance(entry, list) and len(entry) == 2 and _count(entry[0]) and
                    isinstance(entry[1], (int, float)) and not isinstance(entry[1], bool)):
                return None
            kept.append((entry[0], float(entry[1])))
        return cls(kept, state["stale"])


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def best_dir(run_dir: Path) -> Path:
    return run_dir / CHECKPOINT_DIR / BEST_DIR


def best_checkpoint(run_dir: Path, step: int) -> Path:
    return weights_file(best_dir(run_dir), step)


def remove_unkept(run_dir: Path, kept: list[int]) -> None:
    """Deletes best checkpoints of steps not in `kept`: a resumed run redoes the steps after its checkpoint,
    and their validations with them."""
    for path in checkpoints_in(best_dir(run_dir)):
        if step_of(path) not in kept:
            path.unlink(missing_ok=True)
