"""A generated file's config is the truth: each field of a shipped spec's config, edited, builds the same
tensors (names, shapes, ties) as the spec compiled with that `--set`. Bools are flipped, strings set to each
other value the spec lists, the layer and depth counts grown by one, and each schedule (a per-layer list)
reversed, and negated where it holds bools: branches no layer takes at the spec's values are in the file too.
With the same weights, the logits agree as well, and then each float is doubled too: a value the forward
computes from parameters (T5's 1 / sqrt(d_model)) is held over the config, not written as a number."""

import dataclasses
from pathlib import Path

import pytest
import torch

import xspec
from generated_config import module_and_config

SPECS = Path(__file__).resolve().parent.parent / "specs"
# The families' specs, and the paper's at a small size (base.xspec's flags through tiny.xspec).
MODERN = sorted([*(SPECS / "modern").glob("*.xspec"), SPECS / "tiny.xspec", SPECS / "lm.xspec"])


# The base model's sizes made small (specs/tiny.xspec's), where a spec is at the paper's.
SMALL = {"vocab": 1000, "d_model": 128, "d_ff": 512, "heads": 4}


def _edits(name: str, value: object, layers: int, choices: tuple = (), numbers: bool = False) -> list[object]:
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, float):  # rates, scales, epsilons: no tensor's shape reads one
        return [value * 2 if value else 0.5] if numbers else []
    if isinstance(value, str):
        return [choice for choice in choices if choice != value]
    if name in ("layers", "mtp_depth", "encoder_layers", "decoder_layers", "num_layers", "num_decoder_layers"):
        return [value + 1]
    if isinstance(value, tuple):
        schedule = value[:layers]
        negated = [tuple(not item for item in schedule)] if all(isinstance(item, bool) for item in schedule) else []
        return [tuple(reversed(schedule)), *negated]
    return []


def _tensors(model: torch.nn.Module) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}, {k for k, _ in model.named_parameters()}


@pytest.mark.parametrize("path", MODERN, ids=lambda p: p.stem)
def test_an_edited_config_builds_what_the_same_set_compiles(path):
    spec = xspec.compile(str(path))
    module, config = module_and_config(spec)
    default = config()
    checked = 0
    for field in dataclasses.fields(config):
        for edited in _edits(field.name, getattr(default, field.name), spec.params.get("layers", 0),
                             spec.choices.get(field.name, ())):
            given = list(edited) if isinstance(edited, tuple) else edited
            with torch.device("meta"):
                built = module.Model(config(**{field.name: edited}))
            wanted = xspec.compile(str(path), overrides={field.name: given}).build(device="meta")
            assert _tensors(built) == _tensors(wanted), f"{path.stem}: {field.name} = {edited}"
            checked += 1
    assert checked >= 1  # the layer count at least


def _logits(model: torch.nn.Module, spec) -> torch.Tensor:
    tokens = torch.randint(4, min(spec.vocab_size, 64), (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        if spec.has_encoder and spec.has_decoder:
            return model(tokens, tokens[:, :5])
        return model(tokens, None) if spec.has_encoder else model(tokens)


@pytest.mark.parametrize("path", MODERN, ids=lambda p: p.stem)
def test_an_edited_config_computes_what_the_same_set_compiles(path):
    """Equal tensors are not enough: a layer's window, rotary base or activation holds none. With the same
    weights, the edited config's model gives the logits of the spec compiled with that `--set`. Specs at the
    paper's base sizes are compiled smaller for it (both sides alike): each edit builds a model on the CPU."""
    spec = xspec.compile(str(path))
    small = {k: v for k, v in SMALL.items() if k in spec.params} if spec.parameters > 5_000_000 else {}
    spec = xspec.compile(str(path), overrides=small)
    module, config = module_and_config(spec)
    default = config()
    for field in dataclasses.fields(config):
        for edited in _edits(field.name, getattr(default, field.name), spec.params.get("layers", 0),
                             spec.choices.get(field.name, ()), numbers=True):
            given = list(edited) if isinstance(edited, tuple) else edited
            try:
                compiled = xspec.compile(str(path), overrides={**small, field.name: given})
            except xspec.SpecError:  # a value the spec refuses (phi3's rotary fraction doubled to 1.5)
                assert isinstance(edited, float), f"{path.stem}: {field.name} = {edited}"
                continue
            torch.manual_seed(0)
            wanted = compiled.build(device="cpu").eval()
            built = module.Model(config(**{field.name: edited})).eval()
            built.load_state_dict(wanted.state_dict())
            torch.testing.assert_close(_logits(built, compiled), _logits(wanted, compiled),
                                       msg=lambda m: f"{path.stem}: {field.name} = {edited}: {m}")


@pytest.mark.parametrize("name", ["t5", "umt5"])
def test_a_value_the_forward_computes_from_the_config_follows_an_edit(name):
    """T5 scales the decoder's output by 1 / sqrt(d_model) where it ties its embeddings: an edited d_model
    gives the logits of the same --set, where a number in the forward kept the spec's."""
    path = SPECS / "modern" / f"{name}.xspec"
    spec = xspec.compile(str(path))
    assert "self.scale = 1 / math.sqrt(config.d_model)" in spec.python_source
    module, config = module_and_config(spec)
    compiled = xspec.compile(str(path), overrides={"d_model": 2 * spec.params["d_model"]})
    torch.manual_seed(0)
    wanted = compiled.build(device="cpu").eval()
    built = module.Model(config(d_model=2 * spec.params["d_model"])).eval()
    built.load_state_dict(wanted.state_dict())
    torch.testing.assert_close(_logits(built, compiled), _logits(wanted, compiled))
