"""A mixture of experts trained by the runtime on the demo language: the loss falls, and the load-balancing
loss is added to it with train.router_aux_loss_coef and logged apart (metrics.jsonl, train.log); DeepSeek's
routers move their correction bias instead, and its multi-token prediction trains beside the model and
drafts its greedy decoding."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import torch

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


def demo_text(directory: Path, train_lines: int, other_lines: int) -> DataFiles:
    """The demo language's sentences as plain-text train, valid and test files."""
    directory.mkdir()
    splits = {}
    for name, size in (("train", train_lines), ("valid", other_lines), ("test", other_lines)):
        path = directory / f"{name}.txt"
        path.write_text("".join(s + "\n" for s, _ in generate_split(name, size)), encoding="utf-8")
        splits[name] = Split(path)
    return DataFiles(splits["train"], splits["valid"], splits["test"])


def test_a_mixture_of_experts_learns_and_logs_its_load_balancing_loss(tmp_path):
    data = demo_text(tmp_path / "text", 1500, 30)
    spec = xspec.compile(str(ROOT / "specs" / "modern" / "mixtral.xspec"), overrides=SMALL)
    assert spec.train.router_aux_loss_coef == 0.02
    run = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        metrics = train(spec, RunOptions(run, data, device="cpu", progress=False))
    assert metrics["steps"] == 40 and math.isfinite(metrics["test_perplexity"])
    steps = [record for record in read_metrics_log(run) if "loss" in record]
    assert len(steps) == 40 and all("aux_loss" in record for record in steps)
    first, last = sum(r["loss"] for r in steps[:5]) / 5, sum(r["loss"] for r in steps[-5:]) / 5
    assert last < first - 1.0
    # experts * sum_e f_e P_e is top_k for uniform routing and at most top_k * experts; balanced here.
    assert all(1.5 < record["aux_loss"] < 4.0 for record in steps)
    assert "aux loss " in (run / "train.log").read_text()


def test_deepseeks_routers_correct_their_bias_after_each_update_and_the_checkpoint_keeps_it(tmp_path, capsys):
    """DeepSeek-V3's auxiliary-loss-free balancing (§2.1.2): with no auxiliary loss in the training loss,
    every corrected router's bias moves by exactly +-gamma per expert each update, and the run's checkpoint
    holds the moved biases (a resumed run goes on from them)."""
    data = demo_text(tmp_path / "text", 300, 20)
    sizes = {"vocab": 400, "d_model": 32, "layers": 2, "heads": 2, "d_ff": 48, "q_lora_rank": 0, "kv_lora_rank": 16,
             "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": 4, "n_group": 2,
             "moe_intermediate_size": 16, "train.batch_tokens": 512, "train.warmup_steps": 5, "train.max_steps": 6,
             "train.validate_every_steps": 6, "train.checkpoint_every_steps": 6, "data.block_size": 32,
             "decode.max_new_tokens": 2}
    spec = xspec.compile(str(ROOT / "specs" / "modern" / "deepseek_v3.xspec"), overrides=sizes)
    assert spec.train.router_aux_loss_coef == 0.0 and spec.train.expert_bias_update_rate == 0.001
    assert spec.params["mtp_depth"] == 1 and spec.train.mtp_loss_weight == 0.3
    run = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        train(spec, RunOptions(run, data, device="cpu", progress=False))
    trained = xspec.load(run, device="cpu", weights="fp32")
    bias = trained.model.decoder.layers[1].mlp.gate.e_score_correction_bias
    steps = bias / 0.001                      # started at 0: a whole number of +-1 steps, at most one per update
    assert torch.allclose(steps, steps.round(), atol=1e-3) and bias.abs().max() <= 6 * 0.001 + 1e-6
    assert bias.abs().max() > 0 and bias.sum().abs() < bias.abs().sum()   # some experts up, others down
    # Multi-token prediction (§2.2) trained beside it, its loss logged apart; greedy decoding drafts with it.
    steps_logged = [record for record in read_metrics_log(run) if "loss" in record]
    assert all(record["mtp_loss"] > 0 for record in steps_logged) and "mtp loss " in (run / "train.log").read_text()
    prompts = ["the cat", "a dog sees"]
    drafting = trained.generator(sample=False, beam=1, max_new_tokens=8)
    plain = trained.generator(sample=False, beam=1, max_new_tokens=8, speculative=False)
    assert drafting.generate(prompts) == plain.generate(prompts)
    assert drafting.drafts.proposed > 0 and plain.drafts.proposed == 0
    from xspec.cli import main

    assert main(["generate", str(run), "--beam", "1", "--prompt", "the cat", "--max-new-tokens", "6"]) == 0
    assert "speculative decoding: " in capsys.readouterr().err
