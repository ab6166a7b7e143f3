"""The training loop on the toy spec: exact resume, Ctrl-C, NaN, checkpoints from another spec, averaging."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from toy_spec import toy_spec
from xspec.errors import UserError
from xspec.runtime import checkpoint as ckpt
from xspec.runtime.average import average_run
from xspec.runtime.run_dir import read_metrics_log
from xspec.runtime.train import Interrupted, RunOptions, train


def _train(spec, corpus, out: Path, resume: bool = False, evaluate: bool = False) -> dict:
    return train(spec, RunOptions(out, corpus, device="cpu", resume=resume, progress=False, evaluate=evaluate))


def _losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics_log(run) if "loss" in r}


def test_run_directory_and_final_metrics(small_corpus, tmp_path):
    metrics = _train(toy_spec(), small_corpus, tmp_path / "run", evaluate=True)
    run = tmp_path / "run"
    assert metrics["steps"] == 8
    saved = json.loads((run / "metrics.json").read_text())
    for key in ("bleu", "chrf", "valid_loss", "steps", "train_tokens_per_s", "wall_s"):
        assert key in saved
    assert saved["bleu_signature"].startswith("BLEU|nrefs:1|")
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step-00000004.safetensors", "step-00000008.safetensors"]
    assert (run / "sentencepiece.model").exists() and (run / "spec.xspec").exists()
    assert len((run / "test.hyp").read_text().splitlines()) == 8
    assert sorted(_losses(run)) == list(range(1, 9))


def test_resume_continues_exactly(small_corpus, tmp_path):
    _train(toy_spec(max_steps=8), small_corpus, tmp_path / "straight")
    _train(toy_spec(max_steps=4), small_corpus, tmp_path / "stopped")
    _train(toy_spec(max_steps=8), small_corpus, tmp_path / "stopped", resume=True)
    straight, resumed = _losses(tmp_path / "straight"), _losses(tmp_path / "stopped")
    assert sorted(resumed) == list(range(1, 9))
    assert resumed == straight                    # same losses, to the printed digit
    a = ckpt.load_weights(ckpt.resolve(tmp_path / "straight")).tensors
    b = ckpt.load_weights(ckpt.resolve(tmp_path / "stopped")).tensors
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_ctrl_c_writes_a_checkpoint_and_resume_matches(small_corpus, tmp_path):
    calls = {"n": 0}

    def interrupt_once(module, inputs, output):     # Ctrl-C during the 5th forward pass
        calls["n"] += 1
        if calls["n"] == 5 and module.training:
            os.kill(os.getpid(), signal.SIGINT)

    spec = dataclasses.replace(toy_spec(checkpoint_every_steps=100), forward_hook=interrupt_once)
    with pytest.raises(Interrupted) as error:
        _train(spec, small_corpus, tmp_path / "run")
    step = ckpt.load_weights(ckpt.resolve(tmp_path / "run")).step
    assert 1 <= step < 8 and f"interrupted at step {step}" in str(error.value)
    assert error.value.exit_code == 130
    _train(toy_spec(checkpoint_every_steps=100), small_corpus, tmp_path / "run", resume=True)
    _train(toy_spec(checkpoint_every_steps=100), small_corpus, tmp_path / "straight")
    assert _losses(tmp_path / "run") == _losses(tmp_path / "straight")


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(small_corpus, tmp_path):
    first_checkpoint = tmp_path / "run" / "checkpoints" / "step-00000004.safetensors"

    def poison(module, inputs, output):       # the loss turns NaN once step 4's checkpoint is written
        return output * float("nan") if module.training and first_checkpoint.exists() else output

    spec = dataclasses.replace(toy_spec(), forward_hook=poison)
    with pytest.raises(UserError, match=r"loss became nan at step 5") as error:
        _train(spec, small_corpus, tmp_path / "run")
    assert "step-00000004.safetensors" in str(error.value)
    kept = ckpt.list_checkpoints(tmp_path / "run")
    assert [p.name for p in kept] == ["step-00000004.safetensors"]
    assert all(torch.isfinite(t).all() for t in ckpt.load_weights(kept[0]).tensors.values())


def test_resume_with_a_different_spec_names_the_parameter(small_corpus, tmp_path):
    _train(toy_spec(max_steps=4), small_corpus, tmp_path / "run")
    other = dataclasses.replace(toy_spec(max_steps=8), d_model=48)
    with pytest.raises(UserError, match=r"different spec \(d_model: checkpoint 32, spec 48\)"):
        _train(other, small_corpus, tmp_path / "run", resume=True)


def test_a_second_run_into_the_same_directory_is_refused(small_corpus, tmp_path):
    _train(toy_spec(max_steps=4), small_corpus, tmp_path / "run")
    with pytest.raises(UserError, match="already holds checkpoints"):
        _train(toy_spec(max_steps=4), small_corpus, tmp_path / "run")


def test_corrupt_and_truncated_checkpoints_are_reported(small_corpus, tmp_path):
    _train(toy_spec(max_steps=4), small_corpus, tmp_path / "run")
    path = ckpt.resolve(tmp_path / "run")
    data = path.read_bytes()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[: len(data) // 2])
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"PK\x03\x04 not really a zip")
    for bad in (truncated, garbage):
        with pytest.raises(UserError, match=f"{bad.name}: corrupt or truncated checkpoint"):
            ckpt.load_weights(bad)
    ckpt.state_path(path).write_bytes(b"junk")
    with pytest.raises(UserError, match="corrupt or truncated training state"):
        _train(toy_spec(max_steps=8), small_corpus, tmp_path / "run", resume=True)


def test_average_is_the_mean_of_the_last_checkpoints(small_corpus, tmp_path):
    _train(toy_spec(max_steps=12), small_corpus, tmp_path / "run")
    found = ckpt.list_checkpoints(tmp_path / "run")
    assert len(found) == 3
    chosen = average_run(tmp_path / "run", 2, tmp_path / "avg.pt")
    assert chosen == found[-2:]
    averaged = ckpt.load_weights(tmp_path / "avg.pt")
    a, b = (ckpt.load_weights(p).tensors for p in found[-2:])
    for name, tensor in averaged.tensors.items():
        torch.testing.assert_close(tensor, (a[name] + b[name]) / 2, rtol=0, atol=1e-7)
    assert averaged.step == 12 and averaged.params == ckpt.load_weights(found[-1]).params
    with pytest.raises(UserError, match="kept only 3 checkpoints"):
        average_run(tmp_path / "run", 5, tmp_path / "avg5.pt")
