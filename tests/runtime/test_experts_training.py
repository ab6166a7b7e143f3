"""A mixture of experts trained by the runtime on the demo language: the loss falls, and the load-balancing
loss is added to it with train.router_aux_loss_coef and logged apart (metrics.jsonl, train.log)."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import xspec
from xspec.runtime.demo_data import generate_split
from xspec.runtime.run_dir import DataFiles, Split, read_metrics_log
from xspec.runtime.train import RunOptions, train

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"vocab": 400, "d_model": 48, "layers": 2, "heads": 4, "kv_heads": 2, "d_ff": 64, "num_local_experts": 4,
         "num_experts_per_tok": 2, "train.batch_tokens": 1024, "train.warmup_steps": 10, "train.max_steps": 40,
         "train.validate_every_steps": 40, "train.checkpoint_every_steps": 40, "train.lr_scale": 1.0,
         "train.report_every_steps": 20,
         "data.block_size": 64, "decode.max_new_tokens": 4}


def test_a_mixture_of_experts_learns_and_logs_its_load_balancing_loss(tmp_path):
    directory = tmp_path / "text"
    directory.mkdir()
    splits = {}
    for name, size in (("train", 1500), ("valid", 30), ("test", 30)):
        path = directory / f"{name}.txt"
        path.write_text("".join(s + "\n" for s, _ in generate_split(name, size)), encoding="utf-8")
        splits[name] = Split(path)
    spec = xspec.compile(str(ROOT / "specs" / "modern" / "mixtral.xspec"), overrides=SMALL)
    assert spec.train.router_aux_loss_coef == 0.02
    run = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        metrics = train(spec, RunOptions(run, DataFiles(splits["train"], splits["valid"], splits["test"]),
                                         device="cpu", progress=False))
    assert metrics["steps"] == 40 and math.isfinite(metrics["test_perplexity"])
    steps = [record for record in read_metrics_log(run) if "loss" in record]
    assert len(steps) == 40 and all("aux_loss" in record for record in steps)
    first, last = sum(r["loss"] for r in steps[:5]) / 5, sum(r["loss"] for r in steps[-5:]) / 5
    assert last < first - 1.0
    # experts * sum_e f_e P_e is top_k for uniform routing and at most top_k * experts; balanced here.
    assert all(1.5 < record["aux_loss"] < 4.0 for record in steps)
    assert "aux loss " in (run / "train.log").read_text()
