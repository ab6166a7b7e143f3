"""`xspec compile` on fuzzed spec files: exit status 0, or 2 with rendered diagnostics; never a
traceback or an internal error. In process for volume, and in a real subprocess for a handful."""

from __future__ import annotations

import io
import itertools
import os
import random
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from xspec.cli import main

from . import grammar
from .atoms import FILE_NAMES
from .config import cases, fuzz_settings
from .corpus import flattened
from .mutate import MUTATIONS, mutants, mutate
from .oracle import Outcome, check
from .overrides import TEXT_VALUES
from .tally import counts, record

IN_PROCESS = 250
SUBPROCESS = 10
# A file's name on disk: every FILE_NAMES entry that is a legal path here ("a/b" makes a folder).
DISK_NAMES = tuple(name for name in FILE_NAMES if "\x00" not in name and not name.startswith("/"))
SET_KEYS = ("heads", "d_model", "layers", "positions", "vocab", "train.seed", "decode.nbest", "haeds")


def set_arguments():
    """`--set KEY=VALUE` pairs as a user types them (KEY and VALUE not blank, as the CLI requires)."""
    values = [v for v in TEXT_VALUES if v.strip() and "\x00" not in v]
    pair = st.tuples(st.sampled_from(SET_KEYS), st.sampled_from(values))
    return st.lists(pair, max_size=2, unique_by=lambda kv: kv[0])


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        try:
            status = main(argv)
        except SystemExit as exit_:  # argparse
            status = exit_.code
    return status, stdout.getvalue(), stderr.getvalue()


def check_cli_result(outcome: Outcome, status: int, stdout: str, stderr: str, out: Path) -> None:
    """The command's result agrees with the in-process compile of the same file."""
    shown = f"\n--- exit status {status} ---\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
    assert "Traceback" not in stderr + stdout and "internal error" not in stderr, shown
    if outcome.compiled:
        assert status == 0, "the spec compiles, but the command failed" + shown
        assert ": valid" in stdout, shown
        assert all((out / name).is_file() for name in ("model.py", "graph.json", "spec.xspec")), shown
    else:
        assert status == 2, "the spec has errors, but the command's exit status is not 2" + shown
        assert ": error: " in stderr and "[" in stderr, shown


def write_spec(folder: Path, file_name: str, text: str) -> Path:
    path = folder / file_name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    return path


def test_cli_compile_in_process(tmp_path: Path):
    numbers = itertools.count()
    texts = st.one_of(grammar.specs(), mutants()).map(lambda case: case[1])

    @fuzz_settings(IN_PROCESS)
    @given(texts, st.sampled_from(DISK_NAMES), set_arguments())
    def case(text: str, file_name: str, sets: list[tuple[str, str]]) -> None:
        folder = tmp_path / str(next(numbers))
        path, out = write_spec(folder, file_name, text), folder / "out"
        overrides = {key: value.strip() for key, value in sets}
        outcome = check(text, str(path), overrides=overrides, allow_imports=True)
        record("command line, in process", outcome)
        arguments = [item for key, value in sets for item in ("--set", f"{key}={value}")]
        check_cli_result(outcome, *run_cli(["compile", str(path), "-o", str(out), *arguments]), out)

    case()
    assert counts("command line, in process")["cases"] >= cases(IN_PROCESS)


def test_cli_compile_in_a_subprocess(tmp_path: Path):
    rng = random.Random(int(os.environ.get("XSPEC_FUZZ_SEED", "0")))
    corpus = flattened()
    for number in range(cases(SUBPROCESS)):
        _, text = rng.choice(corpus)
        if number % 3:  # a third as shipped, the rest mutated
            text = mutate(text, rng.sample(MUTATIONS, rng.randrange(1, 3)), rng.randrange(2**32))
        folder = tmp_path / str(number)
        path, out = write_spec(folder, DISK_NAMES[number % len(DISK_NAMES)], text), folder / "out"
        sets = [("heads", rng.choice(TEXT_VALUES))] if number % 4 == 3 else []
        sets = [(key, value) for key, value in sets if value.strip() and "\x00" not in value]
        outcome = check(text, str(path), overrides={k: v.strip() for k, v in sets}, allow_imports=True)
        record("command line, subprocess", outcome)
        arguments = [item for key, value in sets for item in ("--set", f"{key}={value}")]
        result = subprocess.run([sys.executable, "-m", "xspec", "compile", str(path), "-o", str(out), *arguments],
                                capture_output=True, encoding="utf-8", errors="replace", timeout=300)
        check_cli_result(outcome, result.returncode, result.stdout, result.stderr, out)
