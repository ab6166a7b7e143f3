"""How many cases a run tries, and from which seed: fixed in CI, adjustable locally.

XSPEC_FUZZ_EXAMPLES scales every test's case count (2 runs twice as many cases, 0.1 a tenth);
XSPEC_FUZZ_SEED replaces the fixed derivation of Hypothesis's random choices with another seed, so a
run explores different cases. Without them, every run tries the same cases.
"""

from __future__ import annotations

import os
from typing import Callable

from hypothesis import HealthCheck, Phase, seed, settings


def scale() -> float:
    return float(os.environ.get("XSPEC_FUZZ_EXAMPLES", "1"))


def cases(count: int) -> int:
    """`count` cases in CI, scaled by XSPEC_FUZZ_EXAMPLES (at least one)."""
    return max(1, round(count * scale()))


def fuzz_settings(count: int) -> Callable:
    """Hypothesis settings for a fuzz test of `count` cases: deterministic, no example database,
    no deadline (a case's cost is checked by the oracle), and no health checks about slow or large
    generation (spec texts are large by design)."""
    configured = settings(
        max_examples=cases(count),
        deadline=None,
        derandomize=True,
        database=None,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    chosen_seed = os.environ.get("XSPEC_FUZZ_SEED")
    if chosen_seed is None:
        return configured

    def seeded(test: Callable) -> Callable:
        return seed(int(chosen_seed))(configured(test))

    return seeded
