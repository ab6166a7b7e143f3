"""config.json in every form transformers' configuration classes read, read by `xspec import` as they read
it. transformers is the oracle twice over: a config in some form and transformers' own re-save of it
(`from_dict(...).to_dict()`, every default written out) must map to the same spec parameters; and so must
the form and the plain config it spells differently. Weights play no part here (a model is built only by the
verified imports at the end), so every family and form is checked in seconds."""

from __future__ import annotations

import copy
import functools
import json
import warnings
from pathlib import Path
from typing import Callable

import pytest

from hf_checkpoints import saved
from hf_families import BY_NAME, FAMILIES
from xspec.base.errors import UserError
from xspec.hf.families import Mapped, map_config

pytest.importorskip("transformers")


def written(name: str) -> dict:
    """The family's first sizes as save_pretrained writes config.json (keys at their defaults left out)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = BY_NAME[name].hf_config(BY_NAME[name].sizes[0])
        return json.loads(config.to_json_string(use_diff=True))


def resaved(config: dict) -> dict:
    """transformers' reading of `config`, every attribute written out as its class holds it."""
    from transformers import CONFIG_MAPPING

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kind = CONFIG_MAPPING[config["model_type"]]
        read = kind.from_dict(kind._decode_special_floats(copy.deepcopy(config)))   # as from_json_file does
        return json.loads(read.to_json_string(use_diff=False))


def meaning(mapped: Mapped) -> dict:
    """What an import builds and checks from a config: the spec, every parameter's value (those the spec
    derives, such as a schedule, included), the window and the scaling verification reaches past."""
    settings = tuple((s.param, tuple(s.value) if isinstance(s.value, list) else s.value) for s in mapped.settings)
    return {"spec": mapped.spec, "window": mapped.window, "scaled_from": mapped.scaled_from,
            "max_positions": mapped.max_positions, **_parameters(mapped.spec, settings)}


@functools.cache
def _parameters(spec: str, settings: tuple) -> dict:
    from xspec.compiler.diagnostics import Diagnostics
    from xspec.compiler.resolve import resolve
    from xspec.hf.spec_text import family_spec

    diagnostics = Diagnostics()
    model = resolve(str(family_spec(spec)), {p: list(v) if isinstance(v, tuple) else v for p, v in settings},
                    diagnostics)
    assert model is not None and not diagnostics.errors, diagnostics.render()
    params = dict(model.params)
    for name in ("layer_types", "layers_block_type", "sparse_layers"):   # a schedule may run past the last layer
        if name in params:
            params[name] = params[name][:params["layers"]]
    return params


@pytest.mark.parametrize("name", [family.name for family in FAMILIES])
def test_a_config_and_transformers_resave_of_it_mean_the_same(name):
    """Every default xspec assumes for a key save_pretrained leaves out is the config class's."""
    config = written(name)
    assert meaning(map_config(config)) == meaning(map_config(resaved(config)))


@pytest.mark.parametrize("name", [family.name for family in FAMILIES])
def test_without_any_one_key_xspec_reads_what_transformers_reads_or_names_the_key(name):
    """Each key of the full config left out in turn: xspec takes the config class's default for it, as
    transformers does, or refuses naming it."""
    from transformers import CONFIG_MAPPING

    full = resaved(written(name))
    for key in sorted(full):
        if key == "model_type":
            continue
        config = {k: v for k, v in full.items() if k != key}
        try:
            theirs = resaved(config)
        except Exception:   # a config transformers cannot read either (its validation refuses it)
            continue
        try:
            ours = meaning(map_config(config))
        except UserError as error:
            assert f"config.json: no {key}, " in str(error) or key in str(error), (key, str(error))
            continue
        assert ours == meaning(map_config(theirs)), key
    assert CONFIG_MAPPING[full["model_type"]]    # the family is transformers' own


def _hub_rope(config: dict) -> None:
    """The rope_theta + rope_scaling spelling of most checkpoints on the Hub (`type`, the older key)."""
    parameters = config.pop("rope_parameters")
    config["rope_theta"] = parameters.pop("rope_theta")
    parameters.pop("partial_rotary_factor", None)
    kind = parameters.pop("rope_type")
    config["rope_scaling"] = None if kind == "default" else {"type": kind, **parameters}


def _nemotron_pattern(config: dict) -> None:
    """NVIDIA's own spelling: hybrid_override_pattern and the mamba_* keys."""
    characters = {"linear_attention": "M", "full_attention": "*", "mlp": "-"}
    config["hybrid_override_pattern"] = "".join(characters[k] for k in config.pop("layers_block_type"))
    config["num_hidden_layers"] = len(config["hybrid_override_pattern"])
    for key, older in (("n_groups", "mamba_n_groups"), ("conv_kernel", "mamba_d_conv"),
                       ("chunk_size", "mamba_chunk_size"), ("time_step_min", "mamba_dt_min")):
        if key in config:
            config[older] = config.pop(key)
    config["rms_norm_eps"] = config["attention_head_dim"] = 1   # NVIDIA's code's keys, not transformers'


def _gemma3_hub_rope(config: dict) -> None:
    """Gemma 3's spelling before rope_parameters: the two bases apart, the global layers' scaling."""
    parameters = config.pop("rope_parameters")
    full = dict(parameters["full_attention"])
    config["rope_theta"] = full.pop("rope_theta")
    config["rope_local_base_freq"] = parameters["sliding_attention"]["rope_theta"]
    config["rope_scaling"] = full if full.pop("rope_type") != "default" else None
    if config["rope_scaling"] is not None:
        config["rope_scaling"]["rope_type"] = "linear"


def _legacy_kinds(config: dict) -> None:
    for key in ("layer_types", "layers_block_type"):
        if key in config:
            config[key] = [{"full_attention": "attention", "linear_attention": "mamba"}.get(k, k) for k in config[key]]


def _set(**values) -> Callable[[dict], None]:
    return lambda config: config.update(values)


def _drop(*keys: str) -> Callable[[dict], None]:
    return lambda config: [config.pop(key, None) for key in keys] and None


# (family, form, the change from the plain config, whether the form means the same as the plain config)
FORMS = [
    *[(name, "rope_scaling", _hub_rope, True) for name in ("qwen3", "mistral", "olmo2", "deepseek_v2")],
    ("llama3", "rope_scaling llama3", _hub_rope, True),
    ("llama3", "rope_parameters with rope_scaling beside it", lambda c: c.update(rope_scaling=c["rope_parameters"],
                                                                               rope_parameters={"rope_theta": 7.0}),
     True),
    ("llama3", "a top-level rope_theta beside rope_parameters", _set(rope_theta=1.0), True),
    ("llama3", "no original_max_position_embeddings", lambda c: c["rope_parameters"].pop(
        "original_max_position_embeddings"), False),
    ("qwen3", "explicit layer_types", _set(use_sliding_window=True, sliding_window=4, max_window_layers=9,
                                           layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
     False),
    ("qwen3", "layer_types in older names", lambda c: c.update(layer_types=[
        {"full_attention": "attention"}.get(k, k) for k in resaved(c)["layer_types"]]), True),
    ("qwen2", "sliding from max_window_layers", _set(use_sliding_window=True, sliding_window=5, max_window_layers=1),
     False),
    ("qwen2", "a head_dim of its own", _set(head_dim=32), False),
    ("qwen3_moe", "the window in every layer", _set(use_sliding_window=True, sliding_window=5, max_window_layers=2),
     False),
    ("qwen3_moe", "num_experts", lambda c: c.update(num_experts=c.pop("num_local_experts")), True),
    ("mixtral", "num_experts", lambda c: c.update(num_experts=c.pop("num_local_experts")), True),
    ("gemma2", "layer_types in older names", _legacy_kinds, True),
    ("gemma2", "a sliding_window_pattern it does not read", _set(sliding_window_pattern=3), True),
    ("gemma3", "rope_theta, rope_local_base_freq and rope_scaling", _gemma3_hub_rope, True),
    ("gemma3", "sliding_window_pattern", lambda c: c.update(sliding_window_pattern=3) or c.pop("layer_types"),
     False),
    ("gemma3", "_sliding_window_pattern alone", lambda c: c.update(_sliding_window_pattern=2) or [
        c.pop(key) for key in ("layer_types", "sliding_window_pattern")] and None, False),
    ("gpt_oss", "num_experts and experts_per_token", lambda c: c.update(num_experts=c.pop("num_local_experts"),
                                                                       experts_per_token=c["num_experts_per_tok"]),
     True),
    ("gpt_oss", "no rotary settings", _drop("rope_parameters"), False),
    ("deepseek_v3", "num_local_experts and num_mtp_layers",
     lambda c: c.update(num_local_experts=c.pop("n_routed_experts"), num_mtp_layers=c.pop("num_nextn_predict_layers")),
     True),
    ("deepseek_v3", "DeepSeek's own keys", _set(topk_method="noaux_tc", scoring_func="sigmoid", moe_layer_freq=1,
                                                ep_size=1, head_dim=998), True),
    ("deepseek_v2", "num_experts", lambda c: c.update(num_experts=c.pop("n_routed_experts")), True),
    ("glm4_moe", "a top-level partial_rotary_factor", lambda c: c.update(
        partial_rotary_factor=c["rope_parameters"].pop("partial_rotary_factor")), True),
    ("bamba", "attn_layer_indices past the last layer", lambda c: c["attn_layer_indices"].append(99), True),
    ("bamba", "Bamba's own keys", _set(attn_rotary_emb=8, partial_rotary_factor=1.0), True),
    ("qwen3_next", "full_attention_interval", lambda c: c.update(full_attention_interval=2) or c.pop("layer_types"),
     False),
    ("qwen3_next", "layer_types in older names", _legacy_kinds, True),
    ("qwen3_next", "mlp_only_layers null", _set(mlp_only_layers=None), True),
    ("nemotron_h", "hybrid_override_pattern and mamba_* keys", _nemotron_pattern, True),
    ("nemotron_h", "layer_types", lambda c: c.update(layer_types=c.pop("layers_block_type")), True),
    ("nemotron_h", "layers_block_type in older names", _legacy_kinds, True),
]


@pytest.mark.parametrize("name, form, change, same", FORMS, ids=[f"{n}-{f}" for n, f, _, _ in FORMS])
def test_every_form_transformers_reads_imports_as_it_reads_it(name, form, change, same):
    plain = written(name)
    config = copy.deepcopy(plain)
    change(config)
    ours = meaning(map_config(config))
    assert ours == meaning(map_config(resaved(config)))
    assert (ours == meaning(map_config(plain))) is same


# Forms whose weights import with the logits proven against transformers (the import's own verification).
VERIFIED = [("qwen2", "explicit layer_types",
             _set(use_sliding_window=True, sliding_window=4, max_window_layers=9,
                  layer_types=["full_attention", "sliding_attention", "full_attention"])),
            ("nemotron_h", "hybrid_override_pattern", _nemotron_pattern),
            ("qwen3_moe", "the window in every layer", _set(use_sliding_window=True, sliding_window=5))]


@pytest.mark.parametrize("name, form, change", VERIFIED, ids=[f"{n}-{f}" for n, f, _ in VERIFIED])
def test_a_form_imports_with_its_logits_proven(tmp_path, name, form, change):
    import shutil

    from xspec.hf.importer import import_checkpoint

    directory = tmp_path / "checkpoint"
    shutil.copytree(saved(name), directory)
    config = json.loads((directory / "config.json").read_text())
    change(config)
    (directory / "config.json").write_text(json.dumps(config))
    imported = import_checkpoint(directory, tmp_path / "run", say=lambda _: None)
    assert imported.verification is not None and imported.verification["kl"] < 1e-5
    assert Path(tmp_path / "run" / "model.xspec").is_file()


HOSTILE = [None, -1, 0, 10**30, 1e308, "x", [], {}, True, [[1]], 2.5]


@pytest.mark.parametrize("name", [family.name for family in FAMILIES])
def test_every_key_set_to_a_hostile_value_is_read_or_refused_naming_it(name):
    """Each key of the config transformers writes, set to values of every kind: read, or refused naming
    config.json and the key; a number or a flag replaced by a string, a list or an object is always refused."""
    full = resaved(written(name))
    for key, plain in full.items():
        if key in ("bos_token_id", "eos_token_id", "pad_token_id"):     # the tokenizer's (tests/test_hf_hostile.py)
            continue
        for value in HOSTILE:
            config = {**full, key: value}
            try:
                map_config(config)
            except UserError as error:
                message = str(error)
                assert message.startswith("config.json: ") and key.lstrip("_") in message, (key, value, message)
                continue
            scalar = isinstance(plain, (int, float, bool)) and plain is not None
            assert not (scalar and isinstance(value, (str, list, dict))), (key, value, "read without a check")


def test_qwen3_next_with_attention_biases_imports_with_its_logits_proven(tmp_path):
    """Its q_proj's bias holds each head's query rows then its gate's, as its weight does."""
    from xspec.hf.importer import import_checkpoint

    imported = import_checkpoint(saved("qwen3_next", "-biased", attention_bias=True), tmp_path / "run",
                                 say=lambda _: None)
    assert imported.verification is not None and imported.verification["kl"] < 1e-5
    assert imported.spec.params["attention_bias"] is True
