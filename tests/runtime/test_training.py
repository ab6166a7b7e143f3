"""The training loop on the toy spec: exact resume, stop reasons (limits, Ctrl-C, NaN), checkpoints from
another spec, what a failed command leaves behind, averaging."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from toy_spec import toy_spec
from xspec.base.errors import UserError
from xspec.runtime import checkpoint as ckpt
from xspec.runtime.average import average_run
from xspec.runtime.run_dir import DataFiles, Split, read_metrics_log
from xspec.runtime.loop import torch_seed
from xspec.runtime.train import Interrupted, RunOptions, train


def _train(spec, corpus, out: Path, resume: bool = False, evaluate: bool = False, truncate: bool | None = None) -> dict:
    return train(spec, RunOptions(out, corpus, device="cpu", resume=resume, progress=False, evaluate=evaluate,
                                  truncate=truncate))


def _run_json(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


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
    assert saved["stopped"] == {"reason": "max_steps", "step": 8, "train_seconds": saved["train_seconds"]}
    record = _run_json(run)
    assert record["stopped"]["reason"] == "max_steps" and record["truncate"] is False
    assert record["data"]["train"] == {"src": str(small_corpus.train.src.resolve()),
                                       "tgt": str(small_corpus.train.tgt.resolve())}
    assert record["data"]["test"]["src"] == str(small_corpus.test.src.resolve())


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_a_run_started_where_gradients_are_off_still_learns(small_corpus, tmp_path, context):
    """Code that calls train() under no_grad or inference_mode (a notebook's evaluation cell) gets the same
    losses as a plain call, not a failure of autograd."""
    plain = _train(toy_spec(max_steps=2), small_corpus, tmp_path / "plain")
    with context():
        within = _train(toy_spec(max_steps=2), small_corpus, tmp_path / "within")
    assert within["steps"] == plain["steps"] == 2
    assert _losses(tmp_path / "within") == pytest.approx(_losses(tmp_path / "plain"), rel=1e-5)


def test_the_training_state_is_safetensors(small_corpus, tmp_path):
    _train(toy_spec(max_steps=4), small_corpus, tmp_path / "run")
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.is_file())
    assert names == ["step-00000004.safetensors", "step-00000004.state.safetensors"]
    state = tmp_path / "run" / "checkpoints" / names[1]
    with safe_open(str(state), "pt") as f:
        assert "xspec.state" in f.metadata() and "optimizer/state/0/exp_avg" in f.keys()
    assert ckpt.load_state(state)["progress"]["step"] == 4


def test_files_get_the_umask_permissions(small_corpus, tmp_path):
    previous = os.umask(0o027)
    try:
        _train(toy_spec(max_steps=4), small_corpus, tmp_path / "run", evaluate=True)
    finally:
        os.umask(previous)
    run = tmp_path / "run"
    written = [run / "spec.xspec", run / "run.json", run / "sentencepiece.model", run / "metrics.json",
               run / "metrics.jsonl", run / "train.log", run / "test.hyp", *(run / "checkpoints").glob("**/*.*"),
               *(run / "tensorboard").iterdir()]
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in written} == {p.name: "0o640" for p in written}


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
    assert str(error.value).endswith(f"written; continue with: xspec train --resume {tmp_path / 'run'}")
    assert error.value.exit_code == 130
    stopped = _run_json(tmp_path / "run")["stopped"]
    assert (stopped["reason"], stopped["step"]) == ("interrupted", step)
    assert not (tmp_path / "run" / "metrics.json").exists()      # written only by a run that finishes
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
    stopped = _run_json(tmp_path / "run")["stopped"]
    # Step 5's update was skipped by the optimizer; the run stopped there, the model as step 4 left it.
    assert (stopped["reason"], stopped["step"], stopped["at_step"], stopped["loss"]) == ("diverged", 5, 5, "nan")
    assert all(torch.isfinite(t).all() for t in ckpt.load_weights(kept[0]).tensors.values())


def _run_files(run: Path) -> dict[str, bytes]:
    return {name: (run / name).read_bytes() for name in ("spec.xspec", "run.json", "metrics.jsonl")}


def test_resume_with_a_different_spec_names_the_parameter_and_changes_nothing(small_corpus, tmp_path):
    _train(toy_spec(max_steps=4), small_corpus, tmp_path / "run")
    before = _run_files(tmp_path / "run")
    other = dataclasses.replace(toy_spec(max_steps=8), d_model=48)
    with pytest.raises(UserError, match=r"different spec \(d_model: checkpoint 32, spec 48\)"):
        _train(other, small_corpus, tmp_path / "run", resume=True)
    assert _run_files(tmp_path / "run") == before
    assert _train(toy_spec(max_steps=8), small_corpus, tmp_path / "run", resume=True)["steps"] == 8


def test_resume_keeps_the_recorded_data_and_truncation(small_corpus, tmp_path):
    run = tmp_path / "run"
    _train(toy_spec(max_steps=4), small_corpus, run)
    before = _run_files(run)
    other = DataFiles(Split(small_corpus.valid.src, small_corpus.valid.tgt))
    with pytest.raises(UserError, match=rf"^--resume {run}: this run was started with train files "
                                        rf".*train\.src, .*train\.tgt; resuming with .*valid\.src, .*valid\.tgt "
                                        r"would change the training data$"):
        _train(toy_spec(max_steps=8), other, run, resume=True)
    with pytest.raises(UserError, match=rf"^--resume {run}: this run was started without --truncate; "
                                        "resuming with it would change the training data$"):
        _train(toy_spec(max_steps=8), small_corpus, run, resume=True, truncate=True)
    assert _run_files(run) == before
    # Nothing given: the recorded files (valid and test included) and truncation.
    metrics = _train(toy_spec(max_steps=8), DataFiles(), run, resume=True, evaluate=True)
    assert metrics["steps"] == 8 and "bleu" in metrics and metrics["valid_loss"] is not None
    assert _run_json(run)["data"] == json.loads(before["run.json"])["data"]


def test_max_minutes_stops_and_counts_over_resumptions(small_corpus, tmp_path, capsys):
    spec = toy_spec(max_steps=1000, max_minutes=1e-6, checkpoint_every_steps=None)
    metrics = _train(spec, small_corpus, tmp_path / "run")
    assert metrics["steps"] == 1 and metrics["stopped"]["reason"] == "max_minutes"
    out = capsys.readouterr().out
    assert "stopped at step 1 of 1000: reached train.max_minutes = 1e-06 (" in out
    assert "s of training, counted over resumptions): too few validations to tell whether the model had " \
           "finished learning; raise train.max_minutes, or run on a quieter machine" in out
    assert out.rstrip().splitlines()[-1].startswith("note: these figures are of a model stopped by "
                                                    "train.max_minutes at step 1 of 1000: too few validations")
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "run")] == ["step-00000001.safetensors"]
    # Resumed with the same budget, already spent: no further step.
    assert _train(spec, small_corpus, tmp_path / "run", resume=True)["steps"] == 1
    assert _run_json(tmp_path / "run")["stopped"]["reason"] == "max_minutes"


def test_a_run_stopped_by_time_says_whether_its_validation_loss_had_settled(tmp_path):
    from xspec.runtime.loop import Progress
    from xspec.runtime.run_dir import rewrite_metrics_log
    from xspec.runtime.train import _unfinished

    cfg, progress = toy_spec(max_steps=900).train, Progress(step=174)

    def said(*losses: float, reason: str = "max_minutes") -> str | None:
        rewrite_metrics_log(tmp_path, [{"step": 10 * (i + 1), "valid_loss": v} for i, v in enumerate(losses)])
        return _unfinished(reason, progress, cfg, tmp_path)

    assert said(4.0, 3.2, 2.871) == ("the model has not finished learning (validation loss 3.200 -> 2.871 at the "
                                     "last two validations); raise train.max_minutes, or run on a quieter machine")
    assert said(3.2, 2.50, 2.49) is None                       # settled: within 1% of the one before
    assert said(2.5).startswith("too few validations to tell")
    assert said(4.0, 3.0, reason="max_steps") is None


@pytest.mark.parametrize("seed", [-5, 2**70])
def test_any_integer_seed_trains(small_corpus, tmp_path, seed):
    assert _train(toy_spec(max_steps=2, seed=seed), small_corpus, tmp_path / "run")["steps"] == 2


def test_torch_seed_keeps_small_seeds_and_reduces_the_rest():
    assert [torch_seed(s) for s in (0, 1, 12345, 2**63 - 1)] == [0, 1, 12345, 2**63 - 1]
    assert torch_seed(-5) == 2**63 - 5 and torch_seed(2**63) == 0
    for seed in (-(2**80), 2**200):
        torch.manual_seed(torch_seed((seed * 1_000_003 + 7) * 1_009 + 1))


def test_a_corrupt_vocabulary_in_the_run_is_named(small_corpus, tmp_path):
    _train(toy_spec(max_steps=4), small_corpus, tmp_path / "run")
    (tmp_path / "run" / "sentencepiece.model").write_bytes(b"\x0a\x03not a model")
    with pytest.raises(UserError, match=r"run/sentencepiece\.model: not a sentencepiece model"):
        _train(toy_spec(max_steps=8), small_corpus, tmp_path / "run", resume=True)


def test_a_state_that_does_not_belong_to_its_weights_is_refused(small_corpus, tmp_path):
    _train(toy_spec(max_steps=4), small_corpus, tmp_path / "run")
    path = ckpt.state_path(ckpt.resolve(tmp_path / "run"))
    state = ckpt.load_state(path)
    state["progress"]["step"] = 3
    ckpt.save_state(path, state)
    with pytest.raises(UserError, match=r"the training state of step 3, beside the weights of step 4"):
        _train(toy_spec(max_steps=8), small_corpus, tmp_path / "run", resume=True)
    state["progress"]["step"] = "4"
    ckpt.save_state(path, state)
    with pytest.raises(UserError, match=r"unusable training state \(progress: expected step"):
        _train(toy_spec(max_steps=8), small_corpus, tmp_path / "run", resume=True)


def test_a_torn_metrics_line_is_dropped_on_resume(small_corpus, tmp_path):
    run = tmp_path / "run"
    _train(toy_spec(max_steps=4), small_corpus, run)
    with open(run / "metrics.jsonl", "a") as log:
        log.write('{"step": 5, "lo')                          # the process died mid-line
    _train(toy_spec(max_steps=6), small_corpus, run, resume=True)
    assert sorted(_losses(run)) == list(range(1, 7))
    (run / "metrics.jsonl").write_text('{"step": 1}\nnot json\n')
    with pytest.raises(UserError, match=r"metrics\.jsonl:2: not a metrics record xspec wrote"):
        _train(toy_spec(max_steps=8), small_corpus, run, resume=True)


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
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
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
    chosen = average_run(tmp_path / "run", tmp_path / "averaged.safetensors", last=2)
    assert chosen == found[-2:]
    averaged = ckpt.load_weights(tmp_path / "averaged.safetensors")
    a, b = (ckpt.load_weights(p).tensors for p in found[-2:])
    for name, tensor in averaged.tensors.items():
        # The mean is taken in float64 and stored as float32: exactly this.
        assert torch.equal(tensor, ((a[name].double() + b[name].double()) / 2).float())
    assert averaged.step == 12 and averaged.params == ckpt.load_weights(found[-1]).params
    with pytest.raises(UserError, match="kept only 3 checkpoints"):
        average_run(tmp_path / "run", tmp_path / "avg5.safetensors", last=5)
    with pytest.raises(UserError, match="is one of the run's checkpoints"):
        average_run(tmp_path / "run", found[-1], last=2)


def test_an_average_named_pt_is_still_safetensors(small_corpus, tmp_path):
    _train(toy_spec(max_steps=8), small_corpus, tmp_path / "run")
    average_run(tmp_path / "run", tmp_path / "averaged.pt", last=2)
    with safe_open(str(tmp_path / "averaged.pt"), "pt") as f:
        assert f.metadata()["xspec.step"] == "8"
    assert ckpt.load_weights(tmp_path / "averaged.pt").step == 8


def test_a_run_of_mixed_prepared_data_resumes_only_with_the_same_weights(tmp_path):
    from xspec.runtime.run_dir import DataFiles, PreparedSplit, RunRecord, write_run_record
    from xspec.runtime.train import RunOptions, _resumed_record

    dirs = (tmp_path / "a", tmp_path / "b")
    for folder in dirs:
        folder.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    write_run_record(run, RunRecord(DataFiles(train=PreparedSplit(dirs, (0.5, 0.5))), truncate=False))
    same = RunOptions(run, DataFiles(train=PreparedSplit(dirs, (0.5, 0.5))), resume=True)
    assert _resumed_record(run, same).data.train == PreparedSplit(dirs, (0.5, 0.5))
    reweighted = RunOptions(run, DataFiles(train=PreparedSplit(dirs, (0.9, 0.1))), resume=True)
    with pytest.raises(UserError, match="would change the training data"):
        _resumed_record(run, reweighted)
