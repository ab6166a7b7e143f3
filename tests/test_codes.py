"""The registries: every diagnostic code the compiler can report is in compiler/codes.py with its meaning,
and docs/diagnostics.md shows a spec that reports each; every op's family is one of the enum's."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import xspec
from xspec.compiler.codes import CODES
from xspec.compiler.opdef import Family
from xspec.compiler.ops import OPS
from xspec.base.errors import SpecError

# How the sources report a code: diagnostics.error("code", ...), self._error(...), ConstantError("code", ...),
# LimitExceeded(..., code="code").
EMITTED = re.compile(r'(?:\b(?:error|warning|_error|ConstantError)\(\s*|\bcode=)"([a-z][a-z0-9-]*)"')
SECTION = re.compile(r"^### `([a-z0-9-]+)`\n(.*?)(?=^### |\Z)", re.M | re.S)
EXAMPLE = re.compile(r"^```xspec( self-contained)?\n(.*?)^```", re.M | re.S)


def _emitted_codes() -> set[str]:
    found = set()
    for folder in ("compiler", "xspec", "runtime"):
        for path in Path(folder).rglob("*.py"):
            found |= set(EMITTED.findall(path.read_text(encoding="utf-8")))
    return found


def test_every_code_the_sources_report_is_registered_and_every_registered_code_is_reported():
    emitted = _emitted_codes()
    assert emitted - set(CODES) == set(), "add these to compiler/codes.py"
    assert set(CODES) - emitted == set(), "no source reports these"
    assert all(description and "\n" not in description for description in CODES.values())


def test_an_unregistered_code_is_refused():
    from xspec.compiler.diagnostics import COMMAND_LINE, Diagnostics

    with pytest.raises(AssertionError, match="not in compiler/codes.py"):
        Diagnostics().error("made-up", COMMAND_LINE, "a message")


def _examples() -> dict[str, tuple[str, bool]]:
    text = Path("docs/diagnostics.md").read_text(encoding="utf-8")
    examples = {}
    for code, body in SECTION.findall(text):
        match = EXAMPLE.search(body)
        assert match is not None, f"docs/diagnostics.md: no example for {code}"
        examples[code] = (match.group(2), bool(match.group(1)))
    return examples


def test_the_documentation_lists_every_code():
    assert list(_examples()) == list(CODES)


@pytest.mark.parametrize("code", list(CODES))
def test_each_documented_example_reports_its_code(code: str, tmp_path: Path):
    text, self_contained = _examples()[code]
    shutil.copy("specs/base.xspec", tmp_path / "base.xspec")
    path = tmp_path / "example.xspec"
    path.write_text(text)
    try:
        if self_contained:
            spec = xspec.compile_source(text, name=str(path), allow_imports=False)
        else:
            spec = xspec.compile(str(path))
        reported = {match for match in re.findall(r"\[([a-z0-9-]+)\]", spec.warnings)}
    except SpecError as error:
        reported = {d.code for d in error.diagnostics}
    assert code in reported, reported


def test_op_families_are_the_enums():
    assert all(isinstance(op.family, Family) for op in OPS.values())
    assert {op.family for op in OPS.values()} <= set(Family)
