"""The rule of tests/conftest.py holds: a hostile-input suite's test that reaches the CLI's last resort fails."""

from __future__ import annotations

import textwrap
from pathlib import Path

from hostile_suites import HOSTILE_SUITES, is_hostile_suite

pytest_plugins = ["pytester"]

TESTS = Path(__file__).parent


def test_every_named_suite_exists():
    present = {p.name for p in TESTS.rglob("test_*.py")} | {p.name for p in TESTS.iterdir() if p.is_dir()}
    assert [name for name in HOSTILE_SUITES if name not in present] == []


def test_the_suites_are_recognised_by_path():
    assert is_hostile_suite(TESTS / "test_hf_hostile.py") and is_hostile_suite(TESTS / "fuzz" / "test_cli.py")
    assert not is_hostile_suite(TESTS / "test_compile.py")


def test_a_hostile_case_that_reaches_the_last_resort_fails(pytester):
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(hostile_suites=(TESTS / "hostile_suites.py").read_text())
    # In a suite's folder, under a name no module of this session has (pytest imports test files by name).
    (pytester.path / "fuzz").mkdir()
    (pytester.path / "fuzz" / "test_reaching_the_last_resort.py").write_text(textwrap.dedent('''
        from xspec import cli
        from xspec.commands import compile as compile_command

        def test_reaches_it(monkeypatch):
            def broken(args):
                raise RuntimeError("a bug")
            monkeypatch.setattr(compile_command, "run", broken)
            assert cli.main(["compile", "x.xspec"]) == 70
    '''))
    result = pytester.runpytest("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*a hostile input reached the CLI's last resort: xspec compile: internal error while "
                                 "processing x.xspec: RuntimeError: a bug*"])
