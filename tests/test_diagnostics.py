"""Golden tests: each file under tests/diagnostics/ carries the diagnostics it must produce.

An expectation is a comment `#! SEVERITY COL: MESSAGE [CODE]` on the line it is about, or
`#! SEVERITY PATH:LINE:COL: MESSAGE [CODE]` for a line in another file (PATH relative to the
test file); ` | hint: HINT` adds the expected hint, and `...` in a message matches anything.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import xspec

CASES = Path(__file__).parent / "diagnostics"
EXPECTATION = re.compile(r"#! (error|warning) (?:(\S+):(\d+):)?(\d+): (.*) \[([a-z-]+)\](?: \| hint: (.*))?$")


def _expected(path: Path) -> set[tuple]:
    found = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = EXPECTATION.search(line)
        if match:
            severity, other, other_line, col, message, code, hint = match.groups()
            file = os.path.normpath(path.parent / other) if other else os.path.normpath(path)
            found.add((file, int(other_line or number), int(col), severity, message, code, hint))
    return found


def _actual(path: Path) -> set[tuple]:
    try:
        spec = xspec.compile(str(path))
        records = []
        warnings = spec.warnings  # a spec with only warnings compiles
        assert not warnings, warnings
    except xspec.SpecError as error:
        records = error.diagnostics
    return {(os.path.normpath(d.span.file), d.span.line, d.span.col, d.severity, d.message, d.code, d.hint)
            for d in records}


def _matches(expected: tuple, actual: tuple) -> bool:
    *head, message, code, hint = expected
    *actual_head, actual_message, actual_code, actual_hint = actual
    pattern = ".*".join(re.escape(part) for part in message.split("..."))
    return (head == actual_head and code == actual_code and hint == actual_hint
            and re.fullmatch(pattern, actual_message) is not None)


@pytest.mark.parametrize("case", sorted(CASES.glob("*.xspec")), ids=lambda p: p.stem)
def test_diagnostics_match_expectations(case: Path):
    expected, actual = _expected(case), _actual(case)
    assert expected, f"{case} states no expected diagnostics"
    unmatched = [e for e in expected if not any(_matches(e, a) for a in actual)]
    unexpected = [a for a in actual if not any(_matches(e, a) for e in expected)]
    assert not unmatched and not unexpected, f"missing: {unmatched}\nunexpected: {unexpected}"


def test_cli_renders_source_line_and_caret_and_exits_2():
    result = subprocess.run([sys.executable, "-m", "xspec", "compile", str(CASES / "unknown_names.xspec"),
                             "-o", os.devnull], capture_output=True, text=True)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    header = f"{CASES / 'unknown_names.xspec'}:6:26: error: unknown op or block 'atention' [unknown-name]"
    at = lines.index(header)
    assert lines[at + 1].startswith("        x = sublayer(x, h => atention(h, h, h, mask, heads, d_k, d_v)")
    assert lines[at + 2] == "                             ^~~~~~~~"
    assert lines[at + 3] == "  hint: did you mean 'attention'?"


def test_debug_flag_shows_the_traceback():
    result = subprocess.run([sys.executable, "-m", "xspec", "--debug", "compile", str(CASES / "cycles.xspec"),
                             "-o", os.devnull], capture_output=True, text=True)
    assert result.returncode == 2
    assert "Traceback" in result.stderr and "[cycle]" in result.stderr


def test_two_file_import_cycle(tmp_path: Path):
    (tmp_path / "a.xspec").write_text('import "b.xspec"\nmodel a extends b {}\n')
    (tmp_path / "b.xspec").write_text('import "a.xspec"\nmodel b {}\n')
    with pytest.raises(xspec.SpecError) as error:
        xspec.compile(str(tmp_path / "a.xspec"))
    (record,) = error.value.diagnostics
    assert (record.code, record.span.file, record.span.line) == ("import-cycle", str(tmp_path / "b.xspec"), 1)
    assert record.message == "import cycle: a.xspec -> b.xspec -> a.xspec"


def test_command_line_override_of_unknown_parameter():
    with pytest.raises(xspec.SpecError) as error:
        xspec.compile("specs/base.xspec", overrides={"haeds": 16, "train.warmup": 10})
    assert str(error.value) == (
        "<command line>: error: --set haeds: no parameter 'haeds' to override [unknown-name]\n"
        "  hint: did you mean 'heads'?\n"
        "<command line>: error: --set train.warmup: section 'train' has no key 'warmup' [unknown-name]\n"
        "  hint: did you mean 'warmup_steps'?")


def test_a_set_value_the_spec_refuses_names_the_set():
    """Of several --set values, the one at fault is named: a list in a list, a kind no layer names."""
    with pytest.raises(xspec.SpecError) as error:
        xspec.compile("specs/modern/gemma3.xspec", overrides={"layers": "2", "layer_types": '[["sliding_attention"]]'})
    assert str(error.value) == ("<command line>: error: --set layer_types: a list may hold numbers, booleans and "
                                "strings, not lists [type]")
    with pytest.raises(xspec.SpecError) as error:
        xspec.compile("specs/modern/qwen3_next.xspec",
                      overrides={"layers": "2", "layer_types": '["linear_attention", "moe"]'})
    (record,) = error.value.diagnostics
    assert record.message == ("--set layer_types: layer_types[1] is 'moe', a kind no layer of the spec names (it "
                              "names 'full_attention', 'linear_attention')")
    # The kinds the list's declaration names count: qwen3_next's layers compare with "full_attention" only.
    spec = xspec.compile("specs/modern/qwen3_next.xspec",
                         overrides={"layers": "2", "layer_types": '["linear_attention", "full_attention"]'})
    assert spec.params["layer_types"] == ("linear_attention", "full_attention")


def test_missing_spec_file_is_one_clean_message():
    result = subprocess.run([sys.executable, "-m", "xspec", "compile", "no/such.xspec"],
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr == "xspec: error: no/such.xspec: no such file\n"
