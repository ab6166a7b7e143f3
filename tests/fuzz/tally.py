"""Counts of fuzz cases and how they ended, for the summary printed after the tests (conftest.py)."""

from __future__ import annotations

from collections import Counter

from .oracle import Outcome

CASES: dict[str, Counter] = {}


def record(kind: str, outcome: Outcome) -> Counter:
    """Count one case of `kind`; return the counts of that kind so far."""
    counts = CASES.setdefault(kind, Counter())
    counts["cases"] += 1
    counts["compiled"] += outcome.compiled
    counts["ran"] += outcome.ran
    return counts


def counts(kind: str) -> Counter:
    return CASES.get(kind, Counter())


def summary() -> list[str]:
    lines = []
    for kind, counts in CASES.items():
        share = counts["compiled"] / counts["cases"] if counts["cases"] else 0.0
        lines.append(f"{kind}: {counts['cases']:,} cases, {share:.0%} compiled, {counts['ran']:,} built and ran")
    total = sum(c["cases"] for c in CASES.values())
    compiled = sum(c["compiled"] for c in CASES.values())
    if total:
        lines.append(f"all: {total:,} cases, {compiled / total:.0%} compiled")
    return lines
