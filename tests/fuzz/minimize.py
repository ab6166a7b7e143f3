"""Shrink a spec that breaks the contract to a small one that breaks it the same way.

    cd tests && python -m fuzz.minimize case.xspec        # writes case.min.xspec

Lines are dropped, then tokens (as mutate.py splits them), as long as the oracle still fails with the
same kind of failure (its message up to the first colon). The result goes under regressions/ with a
first comment line saying what it caught.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Optional

from .mutate import tokenize
from .oracle import ContractBroken, check


def failure(text: str, name: str = "fuzz.xspec") -> Optional[str]:
    """The kind of contract failure `text` causes, if any."""
    try:
        check(text, name)
    except ContractBroken as broken:
        return broken.what.split(":")[0]
    return None


def shrink(parts: list[str], still_fails: Callable[[list[str]], bool]) -> list[str]:
    """Drop chunks of `parts`, halving the chunk size down to single parts, while it still fails."""
    size = max(1, len(parts) // 2)
    while True:
        start = 0
        while start < len(parts):
            candidate = parts[:start] + parts[start + size:]
            if candidate and still_fails(candidate):
                parts = candidate
            else:
                start += size
        if size == 1:
            return parts
        size //= 2


def minimize(text: str, name: str = "fuzz.xspec") -> str:
    kind = failure(text, name)
    if kind is None:
        raise ValueError("the spec keeps the contract: nothing to minimise")
    lines = shrink(text.split("\n"), lambda candidate: failure("\n".join(candidate), name) == kind)
    tokens = shrink([token for _, token in tokenize("\n".join(lines))],
                    lambda candidate: failure("".join(candidate), name) == kind)
    return "".join(tokens)


def main(argv: list[str]) -> int:
    path = Path(argv[0])
    smaller = minimize(path.read_bytes().decode("utf-8"), path.name)
    target = path.with_suffix(".min.xspec")
    target.write_bytes(smaller.encode("utf-8"))
    print(f"{path}: {failure(smaller, path.name)}; {len(smaller)} characters in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
