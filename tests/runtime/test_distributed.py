"""Two processes under torchrun (gloo, CPU) take the same steps as one process with the same plan of
updates (train.update_parts = 2 in both), whether they replicate the model (DDP) or shard it (FSDP)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from test_runtime_cli import ROOT, SHRINK, TINY, _data_args
from xspec.base.errors import UserError
from xspec.cli import main
from xspec.runtime.demo_data import generate_split
from xspec.runtime.distributed import setup
from xspec.runtime.run_dir import read_metrics_log

# float32: the order of the sums is what two processes change, and bf16's rounding (which "auto" takes on
# some CPUs) would blur it.
STEPS = ["--set", "dropout=0", "--set", "train.max_steps=20", "--set", "train.batch_tokens=1200",
         "--set", "train.max_batch_tokens=300", "--set", "train.update_parts=2", "--set", "train.precision=fp32",
         "--no-progress", "--no-test", "--device", "cpu"]


def _losses(run) -> list[float]:
    return [r["loss"] for r in read_metrics_log(run) if "loss" in r]


@pytest.fixture(scope="module")
def one_process(small_corpus, tmp_path_factory) -> list[float]:
    run = tmp_path_factory.mktemp("one") / "run"
    assert main(["train", TINY, *SHRINK, *STEPS, *_data_args(small_corpus), "--out", str(run)]) == 0
    return _losses(run)


def _torchrun(*argv: str) -> subprocess.CompletedProcess:
    """`xspec ARGV` as two processes under torchrun (gloo)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "--tee=3", "-m", "xspec", *argv], env=env, capture_output=True, text=True, timeout=280)


def _succeeded(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-2000:] + "\n" + result.stderr[-3000:]


def _two_processes(small_corpus, run, *extra: str) -> list[float]:
    _succeeded(_torchrun("train", TINY, *SHRINK, *STEPS, *extra, *_data_args(small_corpus), "--out", str(run)))
    return _losses(run)


@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_two_processes_match_one(small_corpus, tmp_path, one_process, sharding):
    double = _two_processes(small_corpus, tmp_path / "two", "--set", f"train.sharding={sharding}")
    assert len(one_process) == len(double) == 20
    assert double == pytest.approx(one_process, rel=2e-4, abs=2e-4)
    assert one_process[-1] < one_process[0]               # it did learn something over the 20 steps


def test_each_rank_ends_with_the_command_s_exit_status(small_corpus, tmp_path):
    """A refusal after the group has formed reaches the user as on one process (message, status 1): the
    ranks end without the interpreter's finalization (runtime/distributed.py, end_rank_process), with the
    command's own exit status."""
    taken = tmp_path / "taken"
    (taken / "checkpoints").mkdir(parents=True)
    (taken / "checkpoints" / "step-4.safetensors").write_bytes(b"")  # a run that is not resumed
    result = _torchrun("train", TINY, *SHRINK, *STEPS, *_data_args(small_corpus), "--out", str(taken))
    assert result.returncode != 0
    assert "already holds checkpoints" in result.stdout + result.stderr
    assert "exitcode  : 1 " in result.stderr and "Traceback (most recent call last)" not in result.stdout


def test_fsdp_units_are_inner_layers_first_and_never_split_shared_weights():
    """fully_shard must reach a nested stack's inner layers before the outer layers that contain them,
    and a layer whose weights other layers share (a tied stack) cannot be a unit of its own."""
    import xspec
    from xspec.runtime.step import _stack_layers

    sizes = {"vocab": 50, "d_model": 8, "d_ff": 16, "heads": 2, "layers": 3}
    nested = xspec.compile_source(NESTED, name="nested.xspec", overrides=sizes).build(device="cpu")
    units = _stack_layers(nested)
    outer, inner = nested.decoder.outer[0], nested.decoder.outer[0].layers[0]
    assert outer in units and inner in units and units.index(inner) < units.index(outer)
    albert = xspec.compile("specs/modern/albert.xspec", overrides=sizes).build(device="cpu")
    assert _stack_layers(albert) == []
    base = xspec.compile("specs/base.xspec", overrides=sizes).build(device="cpu")
    assert len(_stack_layers(base)) == 6


NESTED = """
import "specs/lm.xspec"
model nested extends transformer_lm {
  block decoder(tokens) {
    x = embed(tokens) as embedding
    repeat 2 as outer {
      repeat layers { x = lm_layer(x) }
      x = linear(x, d_model) as mix
    }
    return linear(x, vocab, bias = false) as generator
  }
}
"""


def test_a_language_model_takes_the_same_steps_on_two_processes(tmp_path):
    """The loop is the task's: a decoder-only model on its demo text, DDP against one process."""
    lm = [str(ROOT / "specs" / "lm.xspec"), "--set", "d_model=16", "--set", "d_ff=32", "--set", "heads=2",
          "--set", "layers=1", "--set", "vocab=300", "--set", "data.block_size=32", "--set", "dropout=0",
          "--set", "train.max_steps=6", "--set", "train.batch_tokens=512", "--set", "train.update_parts=2",
          "--no-progress", "--no-test", "--device", "cpu"]
    text = tmp_path / "train.txt"
    text.write_text("".join(s + "\n" for s, _ in generate_split("train", 400)))
    assert main(["train", *lm, "--train", str(text), "--out", str(tmp_path / "one")]) == 0
    _succeeded(_torchrun("train", *lm, "--train", str(text), "--out", str(tmp_path / "two")))
    one, two = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert len(one) == 6 and two == pytest.approx(one, rel=2e-4, abs=2e-4)


@pytest.mark.parametrize("world_size, local_rank", [("abc", "0"), ("0", "0"), ("2", None), ("2", "-1")])
def test_torchruns_variables_that_are_not_counts_are_named(monkeypatch, world_size, local_rank):
    monkeypatch.setenv("WORLD_SIZE", world_size)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    named = "WORLD_SIZE" if world_size in ("abc", "0") else "LOCAL_RANK"
    with pytest.raises(UserError, match=f"{named}=.*torchrun sets it to a whole number"):
        setup("cpu")
