"""Two processes under torchrun (gloo, CPU) take the same steps as one process with the same total batch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from test_runtime_cli import SHRINK, TINY, _data_args
from xspec.cli import main
from xspec.runtime.run_dir import read_metrics_log

STEPS = ["--set", "dropout=0", "--set", "train.max_steps=20", "--set", "train.batch_tokens=1200",
         "--set", "train.max_batch_tokens=300", "--no-progress", "--no-test", "--device", "cpu"]


def _losses(run) -> list[float]:
    return [r["loss"] for r in read_metrics_log(run) if "loss" in r]


def test_two_processes_match_one(small_corpus, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", TINY, *SHRINK, *STEPS, *_data_args(small_corpus), "--out", str(one)]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "xspec",
         "train", TINY, *SHRINK, *STEPS, *_data_args(small_corpus), "--out", str(two)],
        env=env, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    single, double = _losses(one), _losses(two)
    assert len(single) == len(double) == 20
    assert double == pytest.approx(single, rel=2e-4, abs=2e-4)
    assert single[-1] < single[0]               # it did learn something over the 20 steps
