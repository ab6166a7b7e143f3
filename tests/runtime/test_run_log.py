"""What a run reports (train.log, TensorBoard events, metrics.jsonl) and keeps (the best checkpoints),
and early stopping, on the toy spec."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from toy_spec import toy_spec
from xspec.runtime import checkpoint as ckpt
from xspec.runtime.best import BestRecord, Criterion
from xspec.runtime.loop import Trainer
from xspec.runtime.run_dir import read_metrics_log
from xspec.runtime.train import RunOptions, train


def _train(spec, corpus, out: Path, resume: bool = False, tensorboard: bool = True) -> dict:
    return train(spec, RunOptions(out, corpus, device="cpu", resume=resume, progress=False, evaluate=False,
                                  tensorboard=tensorboard))


def test_slow_updates_are_reported_at_least_every_report_seconds(small_corpus, tmp_path, capsys, monkeypatch):
    """A model that takes minutes an update reports its pace without waiting for report_every_steps."""
    import xspec.runtime.run_log as run_log

    monkeypatch.setattr(run_log, "REPORT_SECONDS", 0.0)
    _train(toy_spec(max_steps=6, report_every_steps=100, validate_every_steps=100), small_corpus, tmp_path / "run",
           tensorboard=False)
    reports = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if re.match(r"step \d+/6: ", line)]
    assert reports == [f"step {n}/6" for n in range(1, 7)]


def test_a_run_writes_its_log_and_tensorboard_events(small_corpus, tmp_path, capsys):
    run = tmp_path / "run"
    _train(toy_spec(max_steps=20, report_every_steps=5, validate_every_steps=10), small_corpus, run)
    out = capsys.readouterr().out
    assert "\r" not in out                              # not a terminal: plain lines, no bar
    reports = [line for line in out.splitlines() if re.match(r"step \d+/20: loss ", line)]
    # The first update at once (the pace is known from it), then every train.report_every_steps.
    assert [line.split(":")[0] for line in reports] == ["step 1/20", "step 5/20", "step 10/20", "step 15/20",
                                                        "step 20/20"]
    assert re.fullmatch(r"step 5/20: loss [\d.]+ ppl [\d.]+ lr [\d.e+-]+ [\d,]+ tok/s \d+ ms/update grad norm "
                        r"[\d.]+ memory [\d,]+ MiB eta \d+:\d\d", reports[1])

    log = (run / "train.log").read_text().splitlines()
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", line) for line in log)
    texts = [line[20:] for line in log]
    assert texts[0].startswith("train (train.src, train.tgt): 356 sentence pairs")
    assert any(re.fullmatch(r"train.max_batch_tokens: update of 600 tokens as about 2 passes of <= 300 tokens; "
                            r"estimated peak \d+ MiB of "
                            r"[\d.]+ GiB free \(CPU RAM\)", t) for t in texts)
    assert reports == [t for t in texts if re.match(r"step \d+/20: loss ", t)]
    assert any(t.startswith("step 10: valid loss ") for t in texts)
    assert texts[-2].startswith("stopped at step 20")

    records = read_metrics_log(run)
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 21))
    assert all(r["grad_norm"] > 0 and r["time"] > 1.7e9 for r in steps)
    valid = {r["step"]: r["valid_loss"] for r in records if "valid_loss" in r}
    assert sorted(valid) == [10, 20]

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "valid/loss",
            "valid/perplexity"} <= set(events.Tags()["scalars"])
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, 21))
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in steps], rel=1e-4)
    assert [e.value for e in events.Scalars("valid/loss")] == pytest.approx([valid[10], valid[20]], rel=1e-5)


def test_tensorboard_can_be_turned_off(small_corpus, tmp_path):
    _train(toy_spec(max_steps=2), small_corpus, tmp_path / "run", tensorboard=False)
    assert not (tmp_path / "run" / "tensorboard").exists() and (tmp_path / "run" / "train.log").exists()


# --- the best checkpoints and early stopping --------------------------------------------------------

def test_the_best_record_keeps_the_best_and_counts_validations_since():
    record, loss = BestRecord(), Criterion.of(validate_bleu=False)
    assert record.observe(10, 3.0, loss, keep=2) == (True, [])
    assert record.observe(20, 2.0, loss, keep=2) == (True, [])
    assert record.observe(30, 2.5, loss, keep=2) == (True, [10])      # better than 3.0: 10 leaves
    assert record.observe(40, 2.5, loss, keep=2) == (False, [])       # a tie ranks after the earlier one
    assert record.kept == [(20, 2.0), (30, 2.5)] and record.stale == 2
    assert record.observe(50, float("nan"), loss, keep=2) == (False, []) and record.stale == 3
    assert record.observe(60, 1.0, loss, keep=2) == (True, [30]) and record.stale == 0
    assert BestRecord.from_state(json.loads(json.dumps(record.state()))) == record
    bleu = Criterion.of(validate_bleu=True)
    record = BestRecord()
    record.observe(1, 20.0, bleu, keep=1)
    assert record.observe(2, 25.0, bleu, keep=1) == (True, [1])
    assert BestRecord.from_state({"kept": [[1, "x"]], "stale": 0}) is None


@pytest.fixture
def scripted_validation(monkeypatch):
    """Validation losses from a list instead of the model: a constructed validation curve."""
    curve: list[float] = []

    def validate(self) -> float:
        return curve[self.progress.step // self.spec.train.validate_every_steps - 1]

    monkeypatch.setattr(Trainer, "validate", validate)
    return curve


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return ckpt.load_weights(path).tensors


def test_patience_stops_at_the_expected_step_and_the_best_checkpoint_is_the_lowest_loss(
        small_corpus, tmp_path, scripted_validation):
    scripted_validation += [5.0, 4.0, 3.0, 3.5, 3.2, 3.1, 2.0, 1.0]   # the best at step 6, then 3 without
    run = tmp_path / "run"
    spec = toy_spec(max_steps=16, validate_every_steps=2, checkpoint_every_steps=2, keep_checkpoints=10,
                    keep_best=2, patience=3)
    metrics = _train(spec, small_corpus, run)
    assert metrics["stopped"]["reason"] == "patience" and metrics["steps"] == 12
    assert metrics["best"] == {"step": 6, "valid_loss": 3.0, "checkpoint": "checkpoints/best/step-00000006.safetensors"}
    best = sorted(p.name for p in (run / "checkpoints" / "best").iterdir())
    assert best == ["step-00000006.safetensors", "step-00000012.safetensors"]     # losses 3.0 and 3.1
    for step in (6, 12):    # the weights of that step: as the regular checkpoint of the same step
        kept, regular = _weights(run / "checkpoints" / "best" / f"step-{step:08d}.safetensors"), \
            _weights(run / "checkpoints" / f"step-{step:08d}.safetensors")
        assert all(torch.equal(kept[k], regular[k]) for k in regular)
        # written once: the regular checkpoint names the best one's file
        assert (run / "checkpoints" / "best" / f"step-{step:08d}.safetensors").samefile(
            run / "checkpoints" / f"step-{step:08d}.safetensors")
    assert (run / "checkpoints" / "step-00000008.safetensors").stat().st_nlink == 1
    assert "no better validation loss in 3 validations (train.patience = 3)" in (run / "train.log").read_text()
    assert json.loads((run / "run.json").read_text())["stopped"]["reason"] == "patience"


def test_a_resumed_run_judges_as_an_uninterrupted_one(small_corpus, tmp_path, scripted_validation):
    scripted_validation += [5.0, 4.0, 3.0, 3.5, 3.2, 3.1, 2.0, 1.0]
    settings = dict(validate_every_steps=2, checkpoint_every_steps=2, keep_checkpoints=10, keep_best=1, patience=3)
    _train(toy_spec(max_steps=16, **settings), small_corpus, tmp_path / "straight")
    _train(toy_spec(max_steps=8, **settings), small_corpus, tmp_path / "resumed")
    # a best checkpoint written after the last regular one must not outlive the resume
    (tmp_path / "resumed" / "checkpoints" / "best" / "step-00000010.safetensors").write_bytes(b"stale")
    metrics = _train(toy_spec(max_steps=16, **settings), small_corpus, tmp_path / "resumed", resume=True)
    assert metrics["steps"] == 12 and metrics["best"]["step"] == 6
    assert sorted(p.name for p in (tmp_path / "resumed" / "checkpoints" / "best").iterdir()) == \
        ["step-00000006.safetensors"]


def test_validation_bleu_is_logged_and_judges_the_best(small_corpus, tmp_path):
    run = tmp_path / "run"
    metrics = _train(toy_spec(max_steps=4, validate_every_steps=2, validate_bleu=True), small_corpus, run)
    valid = [r for r in read_metrics_log(run) if "valid_loss" in r]
    assert [r["step"] for r in valid] == [2, 4] and all(0 <= r["valid_bleu"] <= 100 for r in valid)
    best = max(valid, key=lambda r: (r["valid_bleu"], -r["step"]))
    assert metrics["best"] == {"step": best["step"], "valid_bleu": best["valid_bleu"],
                               "checkpoint": f"checkpoints/best/step-{best['step']:08d}.safetensors"}
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [e.value for e in events.Scalars("valid/bleu")] == pytest.approx([r["valid_bleu"] for r in valid])


def test_a_language_model_has_no_validation_bleu(tmp_path):
    import xspec
    from xspec.base.errors import UserError

    spec = xspec.compile(Path(__file__).parents[2] / "specs" / "lm.xspec", overrides={"train.validate_bleu": True})
    with pytest.raises(UserError, match="train.validate_bleu: transformer_lm is a language model, which has no BLEU"):
        train(spec, RunOptions(tmp_path / "run", None, device="cpu"))
    assert not (tmp_path / "run").exists()


def test_average_best_takes_the_best_validated_checkpoints(small_corpus, tmp_path, scripted_validation, capsys):
    from xspec.cli import main

    scripted_validation += [5.0, 4.0, 3.0, 3.5, 3.2, 3.1, 2.0, 1.0]
    run = tmp_path / "run"
    _train(toy_spec(max_steps=12, validate_every_steps=2, checkpoint_every_steps=2, keep_checkpoints=10,
                    keep_best=3), small_corpus, run)
    capsys.readouterr()
    assert main(["average", str(run), "--best", "2", "-o", str(tmp_path / "best2.safetensors")]) == 0
    assert "step-00000006.safetensors ... step-00000012.safetensors" in capsys.readouterr().out   # 3.0 and 3.1
    averaged = _weights(tmp_path / "best2.safetensors")
    kept = [_weights(run / "checkpoints" / f"step-{s:08d}.safetensors") for s in (6, 12)]
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, (kept[0][name] + kept[1][name]) / 2, rtol=1e-6, atol=1e-7)
    assert main(["average", str(run), "--best", "4", "-o", str(tmp_path / "best4.safetensors")]) == 1
    assert "--best 4, but the run kept the best 3 (train.keep_best)" in capsys.readouterr().err
