"""Counts of fuzz cases and how they ended, for the summary printed after the tests (tests/conftest.py): specs
(how many compiled and ran), and commands run on mutated input files (how many the command accepted)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .oracle import Outcome

CASES: dict[str, Counter] = {}
INPUTS: dict[str, Counter] = {}      # commands on mutated input files, by group of mutations


def record(kind: str, outcome: Outcome) -> Counter:
    """Count one case of `kind`; return the counts of that kind so far."""
    counts = CASES.setdefault(kind, Counter())
    counts["cases"] += 1
    counts["compiled"] += outcome.compiled
    counts["ran"] += outcome.ran
    return counts


def counts(kind: str) -> Counter:
    return CASES.get(kind, Counter())


def record_command(kind: str, accepted: bool, seconds: float) -> None:
    """Count one command run on a mutated input of group `kind`: whether it succeeded, and its time."""
    counts = INPUTS.setdefault(kind, Counter())
    counts["commands"] += 1
    counts["accepted"] += accepted
    counts["milliseconds"] += round(seconds * 1000)


def tallies() -> dict:
    """The counts as plain data (a pytest-xdist worker hands them to the controller)."""
    return {"cases": {k: dict(v) for k, v in CASES.items()}, "inputs": {k: dict(v) for k, v in INPUTS.items()}}


def merge(tallied: dict | None) -> None:
    """Add a worker's counts (`tallies()`) to these."""
    for name, into in (("cases", CASES), ("inputs", INPUTS)):
        for kind, counted in (tallied or {}).get(name, {}).items():
            into.setdefault(kind, Counter()).update(counted)


def summary() -> list[str]:
    lines = []
    for kind, counts in CASES.items():
        share = counts["compiled"] / counts["cases"] if counts["cases"] else 0.0
        lines.append(f"{kind}: {counts['cases']:,} cases, {share:.0%} compiled, {counts['ran']:,} built and ran")
    total = sum(c["cases"] for c in CASES.values())
    compiled = sum(c["compiled"] for c in CASES.values())
    if total:
        lines.append(f"all: {total:,} cases, {compiled / total:.0%} compiled")
    for kind, counts in INPUTS.items():
        lines.append(f"{kind}: {counts['commands']:,} commands, {counts['accepted'] / counts['commands']:.0%} "
                     f"succeeded, {counts['milliseconds'] / 1000:.1f} s")
    commands = sum(c["commands"] for c in INPUTS.values())
    if commands:
        seconds = sum(c["milliseconds"] for c in INPUTS.values()) / 1000
        lines.append(f"all inputs: {commands:,} commands on mutated files, {seconds:.1f} s")
    return lines
