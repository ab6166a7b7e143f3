"""The shipped specs as self-contained texts to mutate: each flattened (imports inlined, parameters as
values) as shipped, and again with small sizes, so that mutants which still compile are cheap to
build and run."""

from __future__ import annotations

import functools
from pathlib import Path

import xspec

ROOT = Path(__file__).resolve().parents[2]
SMALL_SIZES = {"vocab": 13, "d_model": 8, "d_ff": 16, "heads": 2, "layers": 1, "max_len": 16}


def shipped_paths() -> list[Path]:
    return sorted((ROOT / "specs").glob("*.xspec")) + sorted((ROOT / "specs" / "table3").glob("*.xspec"))


@functools.cache
def flattened() -> tuple[tuple[str, str], ...]:
    """(label, resolved text) for every shipped spec, as shipped and made small; duplicates once."""
    texts: dict[str, str] = {}
    for path in shipped_paths():
        relative = path.relative_to(ROOT)
        spec = xspec.compile(str(path))
        texts.setdefault(spec.resolved_source.split("\n", 1)[1], f"{relative}")
        small = {key: value for key, value in SMALL_SIZES.items() if key in spec.params}
        texts.setdefault(xspec.compile(str(path), overrides=small).resolved_source.split("\n", 1)[1],
                         f"{relative} (small)")
    # The first line names the file it was resolved from; what follows it is what differs.
    return tuple((label, f"# Resolved from {label} for fuzzing.\n{text}") for text, label in texts.items())


def parameter_names(text: str) -> list[str]:
    return [line.split()[1] for line in text.splitlines() if line.strip().startswith("param ")
            and len(line.split()) > 1]
