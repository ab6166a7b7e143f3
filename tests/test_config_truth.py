"""A generated file's config is the truth: each field of a shipped spec's config, edited, builds the same
tensors (names, shapes, ties) as the spec compiled with that `--set`. Bools are flipped, the layer and
depth counts grown by one, and each schedule (a per-layer list) reversed."""

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

import xspec

MODERN = sorted((Path(__file__).resolve().parent.parent / "specs" / "modern").glob("*.xspec"))
# Branches of a layer no default layer takes: the file is generated without them and refuses a config that
# takes them, by name, until lowering keeps a spec's conditions whole.
NOT_GENERATED = {("glm4_moe", "use_qk_norm"), ("qwen2", "use_sliding_window"), ("qwen3", "use_sliding_window"),
                 ("qwen3_moe", "use_sliding_window")}


def _edited(name: str, value: object, layers: int) -> object:
    if isinstance(value, bool):
        return not value
    if name in ("layers", "mtp_depth"):
        return value + 1
    if isinstance(value, tuple):
        return tuple(reversed(value[:layers]))
    return None


def _tensors(model: torch.nn.Module) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}, {k for k, _ in model.named_parameters()}


@pytest.mark.parametrize("path", MODERN, ids=lambda p: p.stem)
def test_an_edited_config_builds_what_the_same_set_compiles(path):
    spec = xspec.compile(str(path))
    module = sys.modules[spec.model_class().__module__]
    config = next(v for k, v in vars(module).items() if k.endswith("Config") and isinstance(v, type))
    default = config()
    checked = 0
    for field in dataclasses.fields(config):
        edited = _edited(field.name, getattr(default, field.name), spec.params["layers"])
        if edited is None:
            continue
        given = list(edited) if isinstance(edited, tuple) else edited
        with torch.device("meta"):
            if (path.stem, field.name) in NOT_GENERATED:
                with pytest.raises(ValueError, match="takes a branch this file was generated without"):
                    module.Model(config(**{field.name: edited}))
                continue
            built = module.Model(config(**{field.name: edited}))
        wanted = xspec.compile(str(path), overrides={field.name: given}).build(device="meta")
        assert _tensors(built) == _tensors(wanted), f"{path.stem}: {field.name} = {edited}"
        checked += 1
    assert checked >= 1  # the layer count at least
