"""One command line: every command's options walked for the same spelling of the same thing, `--set`
read the same way everywhere, and the tcmalloc re-execution of commands that compute."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pytest

import xspec
from xspec import cli
from xspec.base import process

ROOT = Path(__file__).resolve().parents[1]
BASE = str(ROOT / "specs" / "base.xspec")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


# Long options that mean one thing wherever they appear, and the short option that goes with them.
SHORT = {"--output": "-o", "--input": "-i"}


def test_every_command_spells_the_same_thing_the_same_way():
    commands = _subparsers()
    assert set(commands) == {c.NAME for c in cli.COMMANDS}
    shorts: dict[str, str] = {}
    for name, parser in commands.items():
        for action in _options(parser):
            longs = [o for o in action.option_strings if o.startswith("--")]
            assert longs, f"{name}: {action.option_strings} has no long spelling"
            for option in longs:
                assert re.fullmatch(r"--[a-z][a-z0-9]*(-[a-z0-9]+)*", option), f"{name} {option}"
            canonical = longs[0]
            for short in (o for o in action.option_strings if not o.startswith("--")):
                # a short option means the same long option in every command
                assert shorts.setdefault(short, canonical) == canonical, f"{name}: {short} is {canonical} here"
            if canonical in SHORT:
                assert SHORT[canonical] in action.option_strings, f"{name} {canonical} without {SHORT[canonical]}"
            assert "--out" not in longs or "--output" in longs, f"{name}: --out is spelled -o/--output"
            if "progress" in canonical or "tensorboard" in canonical or "tcmalloc" in canonical:
                assert isinstance(action, argparse.BooleanOptionalAction), f"{name} {canonical}: --X/--no-X"
            if canonical == "--set":
                assert action.dest == "overrides" and action.metavar == "KEY=VALUE", name
        dests = {a.dest: a for a in _options(parser)}
        if getattr(next(c for c in cli.COMMANDS if c.NAME == name), "COMPUTES", False):
            assert {"threads", "tcmalloc", "device"} <= set(dests), f"{name} computes: --threads, --tcmalloc, --device"
        if "device" in dests:
            assert dests["device"].default is None and "CUDA when available" in dests["device"].help, name


@pytest.mark.parametrize("value, check", [
    ("norm_first=True", lambda p: p["norm_first"] is True),
    ("norm_first=false", lambda p: p["norm_first"] is False),
    ("d_v=d_k", lambda p: p["d_v"] == p["d_k"] == 64),
    ("d_ff=2 * d_model", lambda p: p["d_ff"] == 1024),
    ("positions=learned", lambda p: p["positions"] == "learned"),
])
def test_set_reads_values_as_spec_expressions(value, check, tmp_path, capsys):
    import xspec
    from xspec.commands.arguments import parse_overrides

    assert check(xspec.compile(BASE, overrides=parse_overrides([value])).params)
    # every command reads --set through that one parser: compile, viz and stats accept it alike
    assert cli.main(["compile", BASE, "--set", value, "--json", "-o", str(tmp_path / "out")]) == 0
    assert cli.main(["stats", BASE, "--set", value, "--json"]) == 0
    capsys.readouterr()


def test_set_that_names_itself_is_a_cycle_not_a_string(capsys):
    assert cli.main(["stats", BASE, "--set", "d_k=d_k"]) == xspec.SpecError.exit_code
    assert "parameters depend on each other: d_k -> d_k" in capsys.readouterr().err


# --- tcmalloc ---------------------------------------------------------------------------------------

@pytest.fixture
def execs(monkeypatch):
    calls = []
    monkeypatch.setattr(process.os, "execve", lambda path, argv, env: calls.append((path, argv, env)))
    monkeypatch.setattr(process, "find_tcmalloc", lambda: "/usr/lib/libtcmalloc_minimal.so.4")
    monkeypatch.setattr(process, "_probably_cpu", lambda device: device in (None, "cpu"))
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv(process._REEXECUTED, raising=False)
    return calls


def test_a_command_that_computes_reexecutes_itself_with_tcmalloc(execs):
    args = cli.build_parser().parse_args(["translate", "runs/x"])
    process.reexec_with_tcmalloc(args)
    [(path, argv, env)] = execs
    assert path == sys.executable and argv == sys.orig_argv
    assert env["LD_PRELOAD"] == "/usr/lib/libtcmalloc_minimal.so.4" and env[process._REEXECUTED] == "1"


@pytest.mark.parametrize("argv", [
    ["translate", "runs/x", "--no-tcmalloc"],        # asked not to
    ["translate", "runs/x", "--device", "cuda"],     # not a CPU
    ["compile", BASE],                               # computes nothing
])
def test_tcmalloc_is_left_alone_where_it_does_not_apply(execs, argv):
    process.reexec_with_tcmalloc(cli.build_parser().parse_args(argv))
    assert execs == []


def test_a_process_reexecutes_once(execs, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libtcmalloc_minimal.so.4")
    process.reexec_with_tcmalloc(cli.build_parser().parse_args(["translate", "runs/x"]))
    monkeypatch.setenv("LD_PRELOAD", "")
    monkeypatch.setenv(process._REEXECUTED, "1")
    process.reexec_with_tcmalloc(cli.build_parser().parse_args(["translate", "runs/x"]))
    assert execs == []


def test_main_called_from_python_never_reexecutes(execs, capsys):
    assert cli.main(["translate", "/no/such/run"]) == 1
    assert execs == [] and "no such run directory or checkpoint" in capsys.readouterr().err


def test_threads_sets_torch_threads(monkeypatch, tmp_path, capsys):
    import torch

    before = torch.get_num_threads()
    try:
        cli.main(["translate", str(tmp_path / "none"), "--threads", "1"])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    capsys.readouterr()


# --- the section keys --------------------------------------------------------------------------------

def test_every_section_key_is_listed_with_its_meaning_and_the_docs_hold_the_listing(capsys):
    from xspec.compiler.sections import SECTIONS

    assert cli.main(["keys", "--markdown"]) == 0
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) == sum(len(schema.model_fields) for schema in SECTIONS.values())
    assert "| `train.warmup_steps` | int >= 1 | `4000` |  | eq. 3's warmup (§5.3); the cosine schedule's |" in rows
    assert "| `train.lr` | float > 0 | `0.0001` | `5e-05` | the learning rate of the constant and cosine schedules " \
           "(train --init: 5e-5, or 2e-4 with LoRA) |" in rows       # the fine-tuning recipe's value beside the default
    assert '| `train.lora_targets` | [str, ...] | `["attention", "latent_attention", "linear"]` |  |' in table
    assert '| `data.examples` | "blocks" &#124; "lines" | `"blocks"` |' in table
    assert table in (ROOT / "docs" / "keys.md").read_text(), "docs/keys.md: regenerate with xspec keys --markdown"
    assert cli.main(["keys", "decode"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("decode.beam") and "train." not in text
