"""Base's noise band over its seeds and each learned row's verdicts against it, beside the paper's."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from xspec.sweep.paper import LOWER_IS_BETTER, METRICS, PAPER_DIRECTIONS, Effect
from xspec.sweep.rows import MIN_BLEU, Outcome, Row, learning_threshold

BAND_WIDTH = 2.0                        # the noise band: mean ± BAND_WIDTH sample standard deviations


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
