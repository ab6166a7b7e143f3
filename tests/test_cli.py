"""The command line itself: a light start (no torch for `--help`), argument errors from argparse naming
the option, and one line instead of a traceback when xspec has a bug."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import xspec
from xspec import cli
from xspec.commands import compile as compile_command
from xspec.base.errors import UserError, processing

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "specs" / "tiny.xspec")

# Run in a fresh interpreter (this one has imported torch long ago): record, for each heavy package,
# the line that first imported it, then print them as JSON.
IMPORT_SPY = """
import json, sys, traceback

HEAVY = {"torch", "sacrebleu", "sentencepiece", "graphviz", "matplotlib"}
first_import = {}


class Spy:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in HEAVY and top not in first_import:
            frames = [f for f in traceback.extract_stack() if not f.filename.startswith("<frozen")]
            first_import[top] = f"{frames[-2].filename}:{frames[-2].lineno}"
        return None


sys.meta_path.insert(0, Spy())
"""


def first_heavy_imports(code: str) -> dict[str, str]:
    result = subprocess.run([sys.executable, "-c", IMPORT_SPY + code + "\nprint(json.dumps(first_import))"],
                            cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_help_imports_no_heavy_package():
    code = """
from xspec.cli import COMMANDS, build_parser
parser = build_parser()
for argv in [["--help"]] + [[command.NAME, "--help"] for command in COMMANDS]:
    try:
        parser.parse_args(argv)
    except SystemExit:
        pass
"""
    imported = first_heavy_imports(code)
    assert imported == {}, f"`xspec --help` imported (package: first importing line): {imported}"


def test_import_xspec_imports_neither_the_compiler_nor_torch():
    code = "import xspec\nassert 'networkx' not in sys.modules and 'lark' not in sys.modules"
    assert first_heavy_imports(code) == {}


def test_compiling_a_spec_imports_neither_torch_nor_networkx():
    """CompiledSpec lives in the compiler (compiler/spec.py): compiling and summarizing need nothing heavier."""
    code = f"import xspec\nxspec.compile({TINY!r}).summary()\nassert 'networkx' not in sys.modules"
    assert first_heavy_imports(code) == {}


def test_public_api_is_unchanged():
    from xspec.compiler.spec import CompiledSpec

    assert xspec.CompiledSpec is CompiledSpec
    assert set(xspec.__all__) <= set(dir(xspec))
    assert isinstance(xspec.compile(TINY), xspec.CompiledSpec)
    with pytest.raises(AttributeError, match="no attribute 'Compiled'"):
        xspec.Compiled  # noqa: B018 - the attribute access is the test


def test_sizes_are_read_in_decimal_units_as_transformers_writes_them():
    from xspec.commands.arguments import byte_size

    parse = byte_size(1000, 10**13)
    assert [parse(t) for t in ("5GB", "1.5 gb", "500MB", "20KB", "1000000", "2000B")] == [
        5 * 10**9, 15 * 10**8, 5 * 10**8, 20_000, 10**6, 2000]


def test_python_dash_m_xspec_runs_the_cli():
    result = subprocess.run([sys.executable, "-m", "xspec", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0
    assert "compile" in result.stdout and "train" in result.stdout


@pytest.mark.parametrize("argv, message", [
    (["stats", TINY, "--kernel", "1"], "argument -k/--kernel: must be at least 2, got 1"),
    (["stats", TINY, "--length", "0"], "argument -n/--length: must be at least 1, got 0"),
    (["stats", TINY, "-b", "-3"], "argument -b/--batch: must be at least 1, got -3"),
    (["stats", TINY, "--neighbourhood", "0"], "argument -r/--neighbourhood: must be at least 1, got 0"),
    (["stats", TINY, "--length", "ten"], "argument -n/--length: expected a whole number, got 'ten'"),
    (["viz", TINY, "-o", "x.svg", "--layer", "0"], "argument --layer: must be at least 1, got 0"),
    (["viz", "--attention", "runs/x", "--sentence", "a", "-o", "x.png", "--head", "0"],
     "argument --head: must be at least 1, got 0"),
    (["export", "runs/x", "-o", "out", "--max-shard-size", "5K"],
     "argument --max-shard-size: expected a size such as 5GB, 500MB or 1000000, got '5K'"),
    (["export", "runs/x", "-o", "out", "--max-shard-size", "0.5KB"],
     "argument --max-shard-size: must be between 1,000 and 10,000,000,000,000 bytes, got 500"),
])
def test_bad_argument_is_refused_by_argparse_naming_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(argv)
    assert exit.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"xspec {argv[0]}: error: {message}"


def fail_with_a_bug(args):
    raise RuntimeError("no such\nnode")


def test_a_bug_is_one_line_and_exit_status_70(monkeypatch, capsys):
    monkeypatch.setattr(compile_command, "run", fail_with_a_bug)
    assert cli.main(["compile", TINY]) == cli.INTERNAL_ERROR == 70
    assert capsys.readouterr().err == (f"xspec compile: internal error while processing {TINY}: RuntimeError: no "
                                       "such node (run with --debug for the traceback; please report it)\n")


class PanicException(BaseException):
    """As pyo3 raises for a panic in native code (a tokenizer's regex engine): not an Exception."""


def fail_with_a_panic(args):
    with processing("prompts.txt:3"):
        raise PanicException("retry limit \x1b[31mexceeded")


def test_a_native_panic_is_one_line_naming_the_input_being_processed(monkeypatch, capsys):
    monkeypatch.setattr(compile_command, "run", fail_with_a_panic)
    assert cli.main(["compile", TINY]) == cli.INTERNAL_ERROR
    assert capsys.readouterr().err == ("xspec compile: internal error while processing prompts.txt:3: PanicException: "
                                       "retry limit \\x1b[31mexceeded (run with --debug for the traceback; please "
                                       "report it)\n")


def test_a_user_error_reaches_the_terminal_escaped(monkeypatch, capsys):
    def refuse(args):
        raise UserError("bad\x1b]0;title\x07 name\nsecond line")

    monkeypatch.setattr(compile_command, "run", refuse)
    assert cli.main(["compile", TINY]) == 1
    assert capsys.readouterr().err == "xspec: error: bad\\x1b]0;title\\x07 name\\nsecond line\n"


def test_a_bug_with_debug_shows_the_traceback(monkeypatch, capsys):
    monkeypatch.setattr(compile_command, "run", fail_with_a_bug)
    assert cli.main(["compile", TINY, "--debug"]) == 70
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "in fail_with_a_bug" in err and "internal error" not in err


def test_user_error_is_still_one_message_with_exit_status_1(capsys, tmp_path):
    assert cli.main(["compile", str(tmp_path / "missing.xspec")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("xspec: error: ") and "missing.xspec" in err and "Traceback" not in err


def test_a_failure_while_answering_lines_is_marked_with_the_lines(tmp_path):
    from xspec.base.errors import input_of
    from xspec.commands.translate import answer_lines

    (tmp_path / "in.txt").write_text("a\nb\nc\nd\n")

    def answer(lines, first, name):
        if first > 1:
            raise RuntimeError("a bug")
        yield from lines

    with pytest.raises(RuntimeError) as error:
        answer_lines(str(tmp_path / "in.txt"), str(tmp_path / "out.txt"), 3, answer)
    assert input_of(error.value) == f"{tmp_path / 'in.txt'}:4"
