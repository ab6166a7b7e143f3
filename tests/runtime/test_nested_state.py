"""runtime/nested_state.py: nested state dicts to (tensors, JSON) and back, and refusing anything else."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from xspec.compiler.sections import TrainSection
from xspec.runtime.nested_state import MAX_DEPTH, StateFormatError, decode, encode, mismatch
from xspec.runtime.schedule import make_optimizer, make_scheduler


def _same(a, b) -> bool:
    """Equal values of equal types all the way down; tensors equal in dtype, shape and values."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _trained_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    optimizer = make_optimizer(model.parameters(), TrainSection(warmup_steps=3))
    scheduler = make_scheduler(optimizer, TrainSection(warmup_steps=3), 4)
    for _ in range(2):
        model(torch.randn(2, 3)).square().sum().backward()
        optimizer.step()
        scheduler.step()
    return model, optimizer, scheduler


def test_a_trained_optimizer_and_scheduler_survive_a_safetensors_file(tmp_path):
    _, optimizer, scheduler = _trained_optimizer()
    state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "progress": {"step": 2, "train_seconds": 0.25}}
    tensors, structure = encode(state)
    assert "optimizer/state/0/exp_avg" in tensors                # flattened keys
    save_file(tensors, str(tmp_path / "state.safetensors"), metadata={"structure": structure})
    restored = decode(load_file(str(tmp_path / "state.safetensors")), structure)
    assert _same(restored, state)
    assert list(restored["optimizer"]["state"]) == [0, 1, 2, 3]   # integer keys stay integers
    assert restored["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.98)   # tuples stay tuples


def test_values_of_every_kind_round_trip():
    state = {"none": None, "flags": [True, False], "int": -3, "big": 2**70, "float": 0.1 + 0.2,
             "inf": float("inf"), "text": "a/b \"q\" é", 7: {"nested": (1, [2.5, None], "x")},
             "scalar": torch.tensor(3.0), "ints": torch.arange(5), "half": torch.ones(2, 2, dtype=torch.bfloat16)}
    tensors, structure = encode(state)
    assert _same(decode(tensors, structure), state)


def test_keys_that_would_collide_get_their_own_tensors():
    state = {"a/b": torch.zeros(1), "a": {"b": torch.ones(1)}, 0: torch.full((1,), 2.0), "0": torch.full((1,), 3.0)}
    tensors, structure = encode(state)
    assert len(tensors) == 4
    assert _same(decode(tensors, structure), state)


def test_tensors_are_copied_to_contiguous_unshared_storage():
    base = torch.arange(6.0).reshape(2, 3)
    tensors, structure = encode({"t": base.t(), "same": base})
    assert all(t.is_contiguous() for t in tensors.values())
    base.zero_()
    assert decode(tensors, structure)["t"].tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]


def test_what_cannot_be_stored_is_refused():
    with pytest.raises(TypeError, match="cannot store a set"):
        encode({"x": {1, 2}})
    with pytest.raises(TypeError, match="dict key 1.5"):
        encode({1.5: 0})


@pytest.mark.parametrize("structure, tensors, message", [
    ("{not json", {}, "not JSON"),
    ('{"set": [1]}', {}, "unknown form 'set'"),
    ('{"dict": [1, 2]}', {}, "not a \\[key, value\\] pair"),
    ('{"dict": [[true, 1]]}', {}, "dict key True is neither"),
    ('{"dict": [[1.5, 1]]}', {}, "dict key 1.5 is neither"),
    ('{"dict": [["a", 1], ["a", 2]]}', {}, "dict key 'a' appears twice"),
    ('{"tuple": 5}', {}, "unknown form 'tuple' \\(or its body is not a list\\)"),
    ('{"a": 1, "b": 2}', {}, "expected a value, a list or one of"),
    ('{"tensor": "missing"}', {}, "refers to a tensor 'missing' that is not stored"),
    ('{"tensor": 3}', {}, "refers to a tensor 3"),
    ('[{"tensor": "t"}, {"tensor": "t"}]', {"t": torch.zeros(1)}, "tensor 't' is referred to twice"),
    ('{"dict": []}', {"extra": torch.zeros(1)}, "tensor 'extra' is stored but not part of the state"),
])
def test_structures_encode_does_not_write_are_refused(structure, tensors, message):
    with pytest.raises(StateFormatError, match=message):
        decode(tensors, structure)


def test_deep_nesting_is_refused():
    with pytest.raises(StateFormatError, match=f"nested more than {MAX_DEPTH} levels"):
        decode({}, "[" * (MAX_DEPTH + 2) + "]" * (MAX_DEPTH + 2))
    with pytest.raises(StateFormatError, match="nested more than"):
        decode({}, "[" * 100_000 + "]" * 100_000)          # deeper than Python's JSON parser goes


def test_mismatch_names_the_first_difference():
    _, optimizer, scheduler = _trained_optimizer()
    groups = optimizer.state_dict()["param_groups"]
    assert mismatch(groups, json.loads(json.dumps(groups))) is None     # tuples as lists, same form
    assert mismatch(scheduler.state_dict(), {**scheduler.state_dict(), "last_epoch": 7}) is None
    assert mismatch({"lr": 0.1}, {"lr": 1}) is None                     # an integer may stand for a float
    assert mismatch({"step": 1}, {"step": 1.5}) == "step: expected an integer, found a float"
    assert mismatch({"lr": 0.1}, {"lr": "0.1"}) == "lr: expected a float, found a string"
    assert mismatch({"a": 1}, {"a": 1, "b": 2}, ("top",)) == "top: unexpected key 'b'"
    assert mismatch({"a": 1, "b": 2}, {"a": 1}) == "the top level: no key 'b'"
    assert mismatch([1, 2], [1]) == "the top level: expected 2 items, found 1 items"
    assert mismatch({"x": None}, {"x": True}) == "x: expected null, found true/false"
