"""Checkpoints and training states are untrusted: safetensors only, never unpickled, every field checked."""

from __future__ import annotations

import base64
import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import xspec
from toy_spec import toy_spec
from xspec.compiler.sections import TrainSection
from xspec.base.errors import SpecError, UserError
from xspec.runtime import checkpoint as ckpt
from xspec.runtime.inference import load
from xspec.runtime.schedule import make_optimizer, make_scheduler

ROOT = Path(__file__).resolve().parents[2]
TINY = {"d_model": 16, "d_ff": 32, "heads": 2, "layers": 1, "vocab": 64, "max_len": 32}


def _toy_weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return toy_spec().build().state_dict()


def _metadata(**changes: str) -> dict[str, str]:
    metadata = {"xspec.spec": "# a spec\n", "xspec.params": json.dumps({"d_model": 32}),
                "xspec.sentencepiece": base64.b64encode(b"vocab").decode(), "xspec.step": "12"}
    metadata.update(changes)
    return {k: v for k, v in metadata.items() if v is not None}


def test_weights_are_safetensors_whatever_the_file_name(tmp_path):
    weights = _toy_weights()
    for name in ("averaged.pt", "model.bin", "step.safetensors"):
        ckpt.save_weights(tmp_path / name, weights, "# spec\n", {"d_model": 32, "pair": (1, 2)}, b"proto", 7)
        header_length = int.from_bytes((tmp_path / name).read_bytes()[:8], "little")
        assert (tmp_path / name).read_bytes()[8:9] == b"{" and header_length > 0
        loaded = ckpt.load_weights(tmp_path / name)
        assert (loaded.spec_source, loaded.params, loaded.vocab_proto, loaded.step) == \
            ("# spec\n", {"d_model": 32, "pair": [1, 2]}, b"proto", 7)
        assert all(torch.equal(loaded.tensors[k], weights[k]) for k in weights)


class _Marker:
    """Unpickling this creates a file: the proof that a loader unpickled."""

    path = ""

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


@pytest.mark.parametrize("writer", ["zip", "legacy", "pickle"])
def test_pickles_are_refused_and_never_unpickled(tmp_path, writer):
    _Marker.path = str(tmp_path / "unpickled")
    payload = {"tensors": {"x": torch.zeros(1)}, "trap": _Marker()}
    path = tmp_path / "model.pt"
    if writer == "zip":
        torch.save(payload, path)
    elif writer == "legacy":
        torch.save(payload, path, _use_new_zipfile_serialization=False)
    else:
        path.write_bytes(pickle.dumps(payload, protocol=4))
    message = r"model\.pt: a torch\.save \(pickle\) file; xspec loads only safetensors and never unpickles"
    with pytest.raises(UserError, match=message) as error:
        ckpt.load_weights(path)
    assert "safetensors.torch.save_file" in str(error.value) and "\n" not in str(error.value)
    state = tmp_path / "step-00000001.state.safetensors"
    path.rename(state)
    with pytest.raises(UserError, match=r"state\.safetensors: a torch\.save \(pickle\) file"):
        ckpt.load_state(state)
    assert not (tmp_path / "unpickled").exists()


def test_an_older_pickled_training_state_is_refused_by_name(tmp_path):
    torch.save({"optimizer": {}}, tmp_path / "step-00000004.state.pt")
    with pytest.raises(UserError, match=r"step-00000004\.state\.pt: a torch\.save \(pickle\) file"):
        ckpt.load_state(tmp_path / "step-00000004.state.safetensors")
    with pytest.raises(UserError, match=r"step-00000009\.state\.safetensors: missing"):
        ckpt.load_state(tmp_path / "step-00000009.state.safetensors")


@pytest.mark.parametrize("changes, message", [
    ({"xspec.spec": None}, "not an xspec checkpoint \\(its metadata has no xspec.spec\\)"),
    ({"xspec.step": None}, "its metadata has no xspec.step"),
    ({"xspec.params": "{not json"}, "metadata xspec.params: not JSON"),
    ({"xspec.params": "[1, 2]"}, "metadata xspec.params: not an object of parameter values"),
    ({"xspec.params": '{"d_model": null}'}, "metadata xspec.params: not an object of parameter values"),
    ({"xspec.params": '{"d_model": {"a": 1}}'}, "metadata xspec.params: not an object of parameter values"),
    ({"xspec.sentencepiece": "not base64!"}, "metadata xspec.sentencepiece: not base64"),
    ({"xspec.step": "12a"}, "metadata xspec.step: '12a' is not a step number"),
    ({"xspec.step": "-1"}, "metadata xspec.step: '-1' is not a step number"),
    ({"xspec.step": "9" * 40}, "is not a step number"),
    ({"xspec.spec": "#" * (1024 * 1024 + 1)}, "metadata xspec.spec: a spec of more than 1024 KiB"),
])
def test_metadata_xspec_does_not_write_is_refused(tmp_path, changes, message):
    path = tmp_path / "bad.safetensors"
    save_file({"x": torch.zeros(1)}, str(path), metadata=_metadata(**changes))
    with pytest.raises(UserError, match=f"bad.safetensors: .*{message}"):
        ckpt.load_weights(path)


def test_tensors_must_match_the_model_in_kind(tmp_path):
    model = toy_spec().build()
    weights = _toy_weights()
    ckpt.save_weights(tmp_path / "half.safetensors", {k: v.bfloat16() for k, v in weights.items()}, "", {}, b"", 1)
    ckpt.load_into(model, ckpt.load_weights(tmp_path / "half.safetensors"))     # a lower precision is fine
    weights["out.weight"] = weights["out.weight"].long()
    ckpt.save_weights(tmp_path / "ints.safetensors", weights, "", {}, b"", 1)
    with pytest.raises(UserError, match=r"ints\.safetensors: tensor out\.weight holds torch\.int64, "
                                        r"the model expects torch\.float32"):
        ckpt.load_into(model, ckpt.load_weights(tmp_path / "ints.safetensors"))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_weight_that_is_not_a_finite_number_is_refused_by_name_and_place(tmp_path, value):
    """A model computes nothing with it (a generation of one repeated token, a perplexity of nan)."""
    model = toy_spec().build()
    weights = _toy_weights()
    weights["out.weight"][1, 2] = value
    ckpt.save_weights(tmp_path / "broken.safetensors", weights, "", {}, b"", 1)
    with pytest.raises(UserError, match=rf"broken\.safetensors: tensor out\.weight holds {value} at \[1, 2\]: "
                                        "weights must be finite numbers"):
        ckpt.load_into(model, ckpt.load_weights(tmp_path / "broken.safetensors"))


def _tiny_checkpoint(path: Path, vocab: bytes, spec_source: str | None = None) -> Path:
    spec = xspec.compile(str(ROOT / "specs" / "tiny.xspec"), overrides=TINY)
    model = spec.build(device="cpu")
    ckpt.save_weights(path, model.state_dict(), spec_source or spec.resolved_source, spec.params, vocab, 1)
    return path


@pytest.mark.parametrize("vocab, problem", [(b"", "empty"), (b"\x0a\x05garbage", "INTERNAL")])
def test_a_corrupt_vocabulary_in_a_checkpoint_is_named(tmp_path, vocab, problem):
    path = _tiny_checkpoint(tmp_path / "model.safetensors", vocab)
    with pytest.raises(UserError, match=rf"model\.safetensors: its sentencepiece model: not a sentencepiece "
                                        rf"model \({problem}") as error:
        load(path, device="cpu")
    assert "\n" not in str(error.value)


def test_a_checkpoint_spec_may_not_import(tmp_path):
    (tmp_path / "base.xspec").write_text((ROOT / "specs" / "tiny.xspec").read_text())
    source = 'import "base.xspec"\nmodel copy extends transformer_tiny {}\n'
    path = _tiny_checkpoint(tmp_path / "model.safetensors", b"unused", spec_source=source)
    with pytest.raises(SpecError, match="import-refused"):
        load(path, device="cpu")


# --- the training state ---------------------------------------------------------------------------

def _optimizer_and_scheduler():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = make_optimizer(model.parameters(), TrainSection(warmup_steps=3))
    scheduler = make_scheduler(optimizer, TrainSection(warmup_steps=3), 4)
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    return optimizer, scheduler


def _saved_state(tmp_path: Path) -> tuple[Path, dict]:
    optimizer, scheduler = _optimizer_and_scheduler()
    path = tmp_path / "step-00000001.state.safetensors"
    ckpt.save_state(path, {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                           "progress": {"step": 1}})
    return path, ckpt.load_state(path)


def test_a_training_state_restores_into_a_fresh_optimizer(tmp_path):
    path, state = _saved_state(tmp_path)
    optimizer, scheduler = _optimizer_and_scheduler()
    fresh_optimizer = make_optimizer(torch.nn.Linear(3, 2).parameters(), TrainSection(warmup_steps=3))
    fresh_scheduler = make_scheduler(fresh_optimizer, TrainSection(warmup_steps=3), 4)
    assert ckpt.restore_training_state(path, state, fresh_optimizer, fresh_scheduler) == {"step": 1}
    assert fresh_scheduler.state_dict() == scheduler.state_dict()
    for mine, theirs in zip(fresh_optimizer.state_dict()["state"].values(), optimizer.state_dict()["state"].values()):
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def _break_scheduler(state):
    state["scheduler"]["optimizer"] = "not mine"


def _break_group(state):
    state["optimizer"]["param_groups"][0]["lr"] = "fast"


def _break_shape(state):
    state["optimizer"]["state"][0]["exp_avg"] = torch.zeros(5, 5)


def _break_index(state):
    state["optimizer"]["state"][7] = state["optimizer"]["state"][0]


def _break_kind(state):
    state["optimizer"]["state"][0]["exp_avg"] = [1, 2]


def _break_top(state):
    del state["progress"]


def _break_scaler_kind(state):
    state["scaler"] = {**torch.amp.GradScaler("cpu").state_dict(), "scale": "huge"}


def _break_scaler_value(state):
    state["scaler"] = {**torch.amp.GradScaler("cpu").state_dict(), "scale": float("inf")}


@pytest.mark.parametrize("damage, message", [
    (_break_scheduler, "scheduler: unexpected key 'optimizer'"),
    (_break_group, "optimizer/param_groups/0/lr: expected a float, found a string"),
    (_break_shape, r"optimizer/state/0/exp_avg: shape \(5, 5\), the parameter's is \(2, 3\)"),
    (_break_index, "optimizer/state/7: not the state of one of the optimizer's parameters"),
    (_break_kind, "optimizer/state/0/exp_avg: expected a floating-point tensor"),
    (_break_top, r"expected the optimizer's, the scheduler's and the progress record \(and the loss scaler's\)"),
    (_break_scaler_kind, "scaler/scale: expected a float, found a string"),
    (_break_scaler_value, "scaler: expected a positive, finite scale and finite, non-negative settings"),
])
def test_a_training_state_of_another_form_is_refused_before_loading(tmp_path, damage, message):
    path, state = _saved_state(tmp_path)
    damage(state)
    optimizer, scheduler = _optimizer_and_scheduler()
    before = optimizer.state_dict()["param_groups"][0]["lr"]
    with pytest.raises(UserError, match=rf"state\.safetensors: unusable training state \({message}\)"):
        ckpt.restore_training_state(path, state, optimizer, scheduler, scaler=torch.amp.GradScaler("cpu"))
    assert optimizer.state_dict()["param_groups"][0]["lr"] == before


def test_the_fp16_loss_scale_travels_with_the_training_state(tmp_path):
    """fp16 training's GradScaler has found its scale by halving on overflows and doubling after quiet
    stretches; a resumed run goes on from there, not from the initial 65536."""
    optimizer, scheduler = _optimizer_and_scheduler()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, growth_interval=100)
    scaler.load_state_dict({**scaler.state_dict(), "scale": 512.0, "_growth_tracker": 37})
    path = tmp_path / "step-00000001.state.safetensors"
    ckpt.save_state(path, {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                           "progress": {"step": 1}, "scaler": scaler.state_dict()})
    state = ckpt.load_state(path)
    fresh = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, growth_interval=100)
    optimizer, scheduler = _optimizer_and_scheduler()
    assert ckpt.restore_training_state(path, state, optimizer, scheduler, scaler=fresh) == {"step": 1}
    assert fresh.state_dict() == scaler.state_dict() and fresh.get_scale() == 512.0
    # another precision (no scaler) ignores it; a state without one leaves the scaler as it starts
    assert ckpt.restore_training_state(path, state, optimizer, scheduler) == {"step": 1}
    del state["scaler"]
    untouched = torch.amp.GradScaler("cpu")
    ckpt.restore_training_state(path, state, optimizer, scheduler, scaler=untouched)
    assert untouched.get_scale() == 2.0 ** 16


def test_a_checkpoint_whose_header_length_starts_like_a_pickle_loads(tmp_path):
    """A safetensors file begins with its header's length (8 bytes, little-endian): one in 256 begins with
    0x80, a pickle's first byte, and is still a checkpoint."""
    path = tmp_path / "model.safetensors"
    for padding in range(256):
        ckpt.save_weights(path, {"w": torch.ones(2)}, "x" * padding, {}, b"", 1)
        if path.read_bytes()[0] == 0x80:
            break
    assert path.read_bytes()[0] == 0x80
    saved = ckpt.load_weights(path)
    assert saved.spec_source == "x" * padding and torch.equal(saved.tensors["w"], torch.ones(2))
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    with pytest.raises(UserError, match=r"truncated\.safetensors: corrupt or truncated checkpoint"):
        ckpt.load_weights(truncated)
