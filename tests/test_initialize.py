"""Models are built on the meta device, then given memory once (xspec/nn/initialize.py): initialized, a
seed gives the tensors the generated constructors give; for a checkpoint, nothing is initialized but the
tensors modules derive, which no checkpoint holds."""

from pathlib import Path

import pytest
import torch
import torch.nn as nn

import xspec
from generated_config import module_and_config

SPECS = sorted([*Path("specs").glob("*.xspec"), *Path("specs/modern").glob("*.xspec")])


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_a_built_model_is_what_its_constructors_make_from_the_same_seed(path):
    spec = xspec.compile(str(path))
    torch.manual_seed(0)
    constructed = spec.model_class()()
    torch.manual_seed(0)
    built = spec.build("cpu")
    expected, found = constructed.state_dict(), built.state_dict()
    assert found.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(found[name], tensor), name
    # derived buffers (no checkpoint holds them) too, and ties are the same tensor as they were
    assert all(torch.equal(dict(built.named_buffers())[name], buffer) for name, buffer in constructed.named_buffers())
    assert len(list(built.parameters())) == len(list(constructed.parameters()))


@pytest.mark.parametrize("name", ["base", "alibi", "llama3", "gpt_oss", "phi3", "deepseek_v3"])
def test_a_model_built_for_a_checkpoint_initializes_nothing_but_derives_its_buffers(name, monkeypatch):
    path = next(p for p in SPECS if p.stem == name)
    spec = xspec.compile(str(path))
    reference = spec.build("cpu")

    def refused(self):  # (on the meta device, while constructing, it costs nothing)
        if not self.weight.is_meta:
            raise AssertionError(f"{type(self).__name__} initialized for a checkpoint")

    monkeypatch.setattr(nn.Linear, "reset_parameters", refused)
    monkeypatch.setattr(nn.Embedding, "reset_parameters", refused)
    empty = spec.build("cpu", init=False)
    monkeypatch.undo()
    derived = {name for name, _ in reference.named_buffers()} - set(reference.state_dict())
    assert derived  # rotary frequencies, a sinusoid table, ALiBi slopes
    for buffer in derived:
        assert torch.equal(dict(empty.named_buffers())[buffer], dict(reference.named_buffers())[buffer]), buffer
    empty.load_state_dict(reference.state_dict())
    tokens = torch.randint(4, 100, (2, 6))
    inputs = (tokens, tokens) if spec.has_encoder else (tokens,)
    with torch.no_grad():
        assert torch.equal(empty.eval()(*inputs), reference.eval()(*inputs))


@pytest.mark.parametrize("name, init", [("base", True), ("base", False), ("albert", False), ("deepseek_v3", False)])
def test_a_tied_tensor_stays_one_tensor(name, init):
    spec = xspec.compile(str(next(p for p in SPECS if p.stem == name)), overrides={"layers": 3})
    model = spec.build("cpu", init=init)
    tied = spec.ties
    assert tied
    everything = dict(model.named_parameters(remove_duplicate=False))
    for name, owner in tied.items():
        assert everything[name] is everything[owner], name


def test_tie_weights_ties_again_what_to_empty_gave_tensors_of_their_own():
    """The generated model's `tie_weights()` (transformers' name) holds its spec's ties, under the config's
    condition: a model built on the meta device and given memory with `to_empty` is tied by calling it."""
    spec = xspec.compile("specs/base.xspec", overrides={"layers": 1, "d_model": 32, "d_ff": 64, "vocab": 50})
    tied = spec.ties
    for tie in (True, False):
        config = module_and_config(spec)[1](tie_embeddings=tie)
        with torch.device("meta"):
            model = spec.model_class()(config)
        model = model.to_empty(device="cpu")
        everything = dict(model.named_parameters(remove_duplicate=False))
        assert not any(everything[name] is everything[owner] for name, owner in tied.items())
        model.tie_weights()
        everything = dict(model.named_parameters(remove_duplicate=False))
        assert all((everything[name] is everything[owner]) == tie for name, owner in tied.items())


@pytest.mark.parametrize("name", ["base", "llama", "albert", "deepseek_v3", "qwen3_next"])
def test_a_standalone_file_initializes_a_model_built_on_the_meta_device(name):
    """torchtitan's order with the file alone (torch, no xspec): build on the meta device, give the tensors
    memory, `init_weights()`: the tensors the constructors give from the same seed, ties tied again."""
    from xspec.compiler.codecheck import compile_checked

    spec = xspec.compile(str(next(p for p in SPECS if p.stem == name)), overrides={"layers": 2})
    namespace: dict = {}
    exec(compile_checked(spec.standalone_source, f"<{name}>"), namespace)
    model_class = namespace["Model"]
    torch.manual_seed(0)
    constructed = model_class()
    with torch.device("meta"):
        model = model_class()
    model = model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    expected = constructed.state_dict()
    assert model.state_dict().keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(model.state_dict()[key], tensor), key
    shared = dict(constructed.named_parameters(remove_duplicate=False))
    mine = dict(model.named_parameters(remove_duplicate=False))
    for key in shared:  # the same names share one tensor
        owner = next(k for k in shared if shared[k] is shared[key])
        assert mine[key] is mine[owner], key
