"""Every case the fuzzer has caught, minimised, replayed through the oracle (regressions/*.xspec).

A file's first line is a comment saying what it caught. Optional comment lines after it:
`# expect: compiles` for a case that must compile (then it is built and run too),
`# overrides: {JSON}` for overrides passed as `--set` would pass them, and `# name: NAME` for the
file name the spec is compiled as (by default, the regression file's)."""

import json
from pathlib import Path

import pytest

from .oracle import check

REGRESSIONS = Path(__file__).parent / "regressions"


def _directives(text: str) -> dict[str, str]:
    found = {}
    for line in text.split("\n")[1:]:
        if not line.startswith("# "):
            break
        key, _, value = line[2:].partition(": ")
        found[key] = value
    return found


@pytest.mark.parametrize("case", sorted(REGRESSIONS.glob("*.xspec")), ids=lambda path: path.stem)
def test_regression_keeps_the_contract(case: Path):
    text = case.read_bytes().decode("utf-8")  # as written: no newline translation
    assert text.startswith("# "), f"{case.name}: the first line must say what the case caught"
    directives = _directives(text)
    overrides = json.loads(directives["overrides"]) if "overrides" in directives else None
    outcome = check(text, directives.get("name", case.name), overrides=overrides)
    if directives.get("expect") == "compiles":
        assert outcome.compiled and outcome.ran, f"{case.name} no longer compiles: {outcome.codes}"
