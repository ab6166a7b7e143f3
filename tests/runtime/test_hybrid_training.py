"""A hybrid of Mamba-2 and attention (specs/modern/bamba.xspec) trained by the runtime on the demo
language: the loss falls, and the run decodes through its cache (a state of fixed size for the Mamba-2
layers) greedily and with beam search, whose reordering moves those states with the keys and values."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import torch

import xspec
from xspec.runtime.cache import DecoderCache
from xspec.runtime.run_dir import read_metrics_log
from xspec.runtime.train import RunOptions, train

from test_experts_training import demo_text

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"vocab": 400, "d_model": 48, "layers": 4, "heads": 4, "kv_heads": 2, "d_ff": 64, "mamba_n_heads": 4,
         "mamba_d_state": 8, "mamba_chunk_size": 16, "train.batch_tokens": 1024, "train.warmup_steps": 10,
         "train.max_steps": 30, "train.validate_every_steps": 30, "train.checkpoint_every_steps": 30,
         "train.lr_scale": 1.0, "data.block_size": 64, "decode.max_new_tokens": 6}


def test_a_mamba_hybrid_learns_and_decodes_through_its_states(tmp_path):
    data = demo_text(tmp_path / "text", 1200, 30)
    spec = xspec.compile(str(ROOT / "specs" / "modern" / "bamba.xspec"), overrides=SMALL)
    run = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        metrics = train(spec, RunOptions(run, data, device="cpu", progress=False))
    assert metrics["steps"] == 30 and math.isfinite(metrics["test_perplexity"])
    steps = [record for record in read_metrics_log(run) if "loss" in record]
    assert sum(r["loss"] for r in steps[-5:]) / 5 < sum(r["loss"] for r in steps[:5]) / 5 - 1.0
    trained = xspec.load(run, device="cpu")
    prompts = ["the cat", "a dog sees the"]
    greedy = trained.generator(sample=False, beam=1).generate(prompts)
    beam = trained.generator(sample=False, beam=3).generate(prompts)
    assert len(greedy) == len(beam) == 2 and all(isinstance(text, str) for text in greedy + beam)
    model = trained.model  # the states' rows follow a reordering as the keys' and values' do
    with torch.no_grad():
        tokens = torch.randint(4, 400, (3, 12))
        cache = DecoderCache()
        model.decode(tokens[:, :8], cache=cache)
        cache.reorder(torch.tensor([2, 0]))
        stepped = model.decode(tokens[[2, 0], 8:], cache=cache)
        torch.testing.assert_close(stepped, model(tokens[[2, 0]])[:, 8:], rtol=1e-4, atol=1e-4)


def test_documents_kept_apart_train(tmp_path):
    """data.document_boundaries = "separate" trains through the same loop."""
    data = demo_text(tmp_path / "text", 300, 20)
    spec = xspec.compile(str(ROOT / "specs" / "modern" / "bamba.xspec"),
                         overrides={**SMALL, "train.max_steps": 4, "train.validate_every_steps": 4,
                                    "train.checkpoint_every_steps": 4, "data.document_boundaries": "separate"})
    with contextlib.redirect_stdout(io.StringIO()):
        metrics = train(spec, RunOptions(tmp_path / "run", data, device="cpu", progress=False))
    assert metrics["steps"] == 4 and math.isfinite(metrics["test_perplexity"])


def test_the_readmes_commands_train_a_hybrid_on_the_demo_language_and_continue_a_prompt(tmp_path, capsys):
    """`xspec train specs/modern/bamba.xspec -o RUN` (the demo language's sentences, no data given), then
    `xspec generate RUN --prompt ...` greedily: the language model commands of the README, on a hybrid."""
    from xspec.cli import main

    run = tmp_path / "run"
    sizes = [f"{key}={value}" for key, value in SMALL.items() if key not in ("vocab", "train.batch_tokens")]
    settings = [item for pair in zip(["--set"] * len(sizes), sizes) for item in pair]
    assert main(["train", str(ROOT / "specs" / "modern" / "bamba.xspec"), *settings, "--set", "train.max_steps=6",
                 "--set", "train.validate_every_steps=6", "--set", "train.checkpoint_every_steps=6",
                 "--set", "train.batch_tokens=512", "-o", str(run)]) == 0
    printed = capsys.readouterr().out
    assert "perplexity" in printed and (run / "metrics.jsonl").exists()
    assert main(["generate", str(run), "--prompt", "the cat", "--beam", "1", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.strip()
