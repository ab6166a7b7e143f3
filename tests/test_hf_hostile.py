"""`xspec import` of checkpoints it must refuse: config.json attributes it does not map (each named), weights
missing, left over or misshapen, pickles, sizes too large to allocate, truncated or lying safetensors
headers; and nothing written when it refuses. Sharded checkpoints import."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from hf_checkpoints import saved
from xspec.base.errors import UserError
from xspec.hf.importer import import_checkpoint

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def copy(name: str, tmp_path: Path) -> Path:
    target = tmp_path / "checkpoint"
    shutil.copytree(saved(name), target)
    return target


def edit_config(directory: Path, change) -> None:
    config = json.loads((directory / "config.json").read_text())
    change(config)
    (directory / "config.json").write_text(json.dumps(config))


def refused(directory: Path, out: Path) -> str:
    with pytest.raises(UserError) as error:
        import_checkpoint(directory, out, verify=False, say=lambda _: None)
    assert not out.exists() and [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")] == []
    return str(error.value)


def v4_rope(config: dict, scaling: dict | None) -> None:
    """The rope_theta + rope_scaling spelling of most checkpoints on the Hub."""
    config["rope_theta"] = config.pop("rope_parameters")["rope_theta"]
    config["rope_scaling"] = scaling


CONFIG_CASES = [
    ("llama3", lambda c: v4_rope(c, {"rope_type": "dynamic", "factor": 2.0}),
     'config.json: rope_scaling.rope_type "dynamic" is not supported (supported: default, linear, llama3, yarn)'),
    ("llama3", lambda c: v4_rope(c, {"type": "longrope", "factor": 2.0}),
     'config.json: rope_scaling.rope_type "longrope" is not supported (supported: default, linear, llama3, yarn)'),
    ("llama3", lambda c: c["rope_parameters"].update(mscale=0.7),
     'config.json: rope_parameters.mscale (0.7) is not supported with rope_type "llama3" (supported: factor, '
     'low_freq_factor, high_freq_factor, original_max_position_embeddings)'),
    ("mistral", lambda c: c.update(shiny_new_option=True),
     'config.json: attribute shiny_new_option (true) is not one xspec maps for model_type "mistral"; refusing '
     'rather than guessing what it changes'),
    ("mistral", lambda c: c.update(model_type="gpt2"),
     'config.json: model_type "gpt2" is not supported (supported: llama, mistral, qwen2, qwen3, gemma2, '
     'gemma3_text, olmo2, phi3, mixtral, qwen3_moe, gpt_oss, deepseek_v2, deepseek_v3, glm4_moe, bamba, '
     'qwen3_next, nemotron_h, marian, bart, mbart, m2m_100, t5, mt5, umt5, bert, roberta, modernbert)'),
    ("mistral", lambda c: c.pop("model_type"), "config.json: no model_type is not supported (supported: llama,"),
    ("gemma3", lambda c: c.update(model_type="gemma3"),
     'config.json: model_type "gemma3" is not supported: a Gemma 3 checkpoint with its vision tower'),
    ("mistral", lambda c: c.update(auto_map={"AutoModelForCausalLM": "modeling.Model"}),
     "config.json: auto_map names remote code; xspec runs none"),
    ("qwen2", lambda c: c.update(use_sliding_window=False, layer_types=["full_attention", "sliding_attention"] * 2),
     "config.json: layer_types is not a list of 3 layer kinds (num_hidden_layers)"),
    ("qwen2", lambda c: c.update(use_sliding_window=False, layer_types=["full_attention", "sliding_attention"] * 1
                                 + ["attention"]),
     'config.json: layer_types[1] is "sliding_attention" but use_sliding_window is false: transformers has no window '
     "to slide it by"),
    ("qwen2", lambda c: c.update(layer_types=["full_attention", "global", "full_attention"]),
     'config.json: layer_types[1] "global" is not supported (supported: sliding_attention, full_attention)'),
    ("gemma3", lambda c: c.update(layer_types=["full_attention"] * 2),
     "config.json: layer_types is not a list of 3 layer kinds (num_hidden_layers)"),
    ("gpt_oss", lambda c: c.update(layer_types=["sliding_attention", "chunked_attention", "full_attention"]),
     'config.json: layer_types[1] "chunked_attention" is not supported (supported: sliding_attention, '
     "full_attention)"),
    ("mistral", lambda c: c.update(hidden_act="gelu"),
     'config.json: hidden_act "gelu" is not supported (supported: silu)'),
    ("mixtral", lambda c: c.update(router_jitter_noise=0.1),
     "config.json: router_jitter_noise 0.1 is not supported (supported: 0, 0.0) (jitter noise on the router"),
    ("qwen3_moe", lambda c: c.update(mlp_only_layers=[3]),
     "config.json: mlp_only_layers [3] is not a list of layer indices from 0 to 2"),
    ("gemma2", lambda c: c.update(attn_logit_softcapping=None),
     "config.json: attn_logit_softcapping null is not"),
    ("phi3", lambda c: c.update(sliding_window=2047),
     'config.json: sliding_window 2047 is not supported for model_type "phi3" (supported: null)'),
    ("gpt_oss", lambda c: c.update(quantization_config={"quant_method": "mxfp4"}),
     'config.json: quantization_config ("mxfp4") is not supported'),
    ("mistral", lambda c: c.update(num_hidden_layers="3"), 'config.json: num_hidden_layers "3" is not an integer'),
    ("mistral", lambda c: c.update(attention_dropout=0.1), "config.json: attention_dropout 0.1 is not supported"),
    ("mistral", lambda c: c.update(rms_norm_eps=float("nan")),
     "config.json: not JSON xspec reads (NaN is not a JSON number)"),
]


@pytest.mark.parametrize("name, change, message", CONFIG_CASES,
                         ids=[f"{n}-{m.split(':', 1)[1][:40].strip()}" for n, _, m in CONFIG_CASES])
def test_a_config_attribute_it_does_not_map_is_refused_by_name(tmp_path, name, change, message):
    directory = copy(name, tmp_path)
    edit_config(directory, change)
    assert refused(directory, tmp_path / "out").startswith(f"{directory}/{message}")


def rewrite_weights(directory: Path, change) -> None:
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_a_missing_an_extra_and_a_misshapen_tensor_are_each_named(tmp_path):
    import torch

    directory = copy("qwen3", tmp_path)
    rewrite_weights(directory, lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"))
    assert refused(directory, tmp_path / "out") == (f"{directory}: no tensor model.layers.1.self_attn.k_norm.weight, "
                                                    "which a qwen3 model with this config.json has")
    directory = copy("qwen3", tmp_path / "b")
    rewrite_weights(directory, lambda t: t.update({"model.layers.0.mlp.extra.weight": torch.zeros(2)}))
    assert refused(directory, tmp_path / "out") == (f"{directory}: tensor model.layers.0.mlp.extra.weight is left "
                                                    "over: a qwen3 model with this config.json has no such tensor")
    directory = copy("phi3", tmp_path / "c")
    rewrite_weights(directory, lambda t: t.update({"model.layers.2.self_attn.qkv_proj.weight": torch.zeros(120, 64)}))
    assert refused(directory, tmp_path / "out") == (
        f"{directory}: tensor model.layers.2.self_attn.qkv_proj.weight (120, 64) has the wrong shape: the model with "
        "this config.json needs (128, 64)")
    directory = copy("gemma2", tmp_path / "d")    # tied: a kept lm_head.weight must be the embedding's shape
    rewrite_weights(directory, lambda t: t.update({"lm_head.weight": torch.zeros(300, 32)}))
    assert refused(directory, tmp_path / "out") == (f"{directory}: lm_head.weight differs from "
                                                    "model.embed_tokens.weight, but tie_word_embeddings is true")


def test_a_tied_config_whose_checkpoint_holds_another_output_head_imports_untied(tmp_path):
    """transformers loads a head of other values apart from the embedding it would be tied to (and says so):
    the import does the same, and its logits are transformers'."""
    import torch

    directory = copy("gemma2", tmp_path)
    rewrite_weights(directory, lambda t: t.update({"lm_head.weight": torch.randn(300, 64)}))
    said: list[str] = []
    imported = import_checkpoint(directory, tmp_path / "out", say=said.append)
    assert imported.spec.params["tie_word_embeddings"] is False and imported.verification["verified"]
    assert f"{directory}: the checkpoint's lm_head.weight differs from model.embed_tokens.weight: imported apart, " \
           "as transformers loads it" in said


def test_a_misshapen_tensor_is_named_before_any_reordering(tmp_path):
    """DeepSeek's interleaved rotary rows are reordered on import: a latent projection one row short is
    named with the shape it needs, not an indexing error of the reordering."""
    name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    directory = copy("deepseek_v3", tmp_path)
    rewrite_weights(directory, lambda t: t.update({name: t[name][:-1].clone()}))
    assert refused(directory, tmp_path / "out") == (f"{directory}: tensor {name} (23, 64) has the wrong shape: the "
                                                    "model with this config.json needs (24, 64)")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_weight_that_is_not_finite_is_named_with_where(tmp_path, value):
    """transformers would compute the same NaNs (DeepSeek's routing correction bias included), so the check
    against it cannot tell: the import refuses them itself."""
    import torch

    name = "model.layers.1.mlp.gate.e_score_correction_bias"
    directory = copy("deepseek_v3", tmp_path)
    rewrite_weights(directory, lambda t: t[name].fill_(value))
    assert refused(directory, tmp_path / "out") == (f"{directory}: tensor {name} holds {value} at [0]: weights must "
                                                    "be finite numbers")
    directory = copy("qwen3", tmp_path / "b")
    embedding = "model.embed_tokens.weight"

    def spoil(tensors):
        tensors[embedding] = tensors[embedding].to(torch.bfloat16)
        tensors[embedding][7, 5] = value
    rewrite_weights(directory, spoil)
    assert refused(directory, tmp_path / "out") == (f"{directory}: tensor {embedding} holds {value} at [7, 5]: "
                                                    "weights must be finite numbers")


def test_a_weight_of_integers_is_refused(tmp_path):
    name = "model.layers.0.mlp.down_proj.weight"
    directory = copy("llama3", tmp_path)
    rewrite_weights(directory, lambda t: t.update({name: t[name].to(dtype=__import__("torch").int8)}))
    assert refused(directory, tmp_path / "out") == (
        f"{directory}: tensor {name} holds int8, not floating-point numbers (quantized weights are not supported; "
        "dequantize with transformers first)")


# Values the generated spec would refuse, or could not hold, named as config.json's keys.
SPEC_CASES = [
    ("llama3", lambda c: c.update(num_key_value_heads=3),
     "num_attention_heads 4, num_key_value_heads 3: attention: kv_heads = 3 must divide heads = 4: each key/value "
     "head serves the same number of query heads"),
    ("deepseek_v3", lambda c: c["rope_parameters"].update(rope_type="yarn", factor=1e308, mscale=1e308,
                                                          mscale_all_dim=1.0, original_max_position_embeddings=64),
     "rope_parameters.mscale / mscale_all_dim gives rope_attention_factor = inf, not a finite number"),
    ("deepseek_v3", lambda c: c.update(kv_lora_rank=10 ** 9),
     "the model it describes has 459,0"),
    ("llama3", lambda c: c.update(hidden_size=66),
     "hidden_size 66, num_attention_heads 4: d_model / heads = 66 / 4 is not a whole number, but rotary_embedding "
     "needs a whole dim"),
]


@pytest.mark.parametrize("name, change, message", SPEC_CASES, ids=[f"{n}-{m[:30]}" for n, _, m in SPEC_CASES])
def test_what_the_generated_spec_refuses_is_named_in_config_json(tmp_path, name, change, message):
    directory = copy(name, tmp_path)
    edit_config(directory, change)
    found = refused(directory, tmp_path / "out")
    assert found.startswith(f"{directory}/config.json: {message}"), found
    assert "model.xspec" not in found and ".xspec:" not in found


def test_a_refusal_naming_no_key_still_names_config_json_and_not_the_generated_spec():
    from xspec.base.errors import SpecError
    from xspec.compiler.diagnostics import Diagnostic, Span
    from xspec.hf.config_reader import Setting
    from xspec.hf.families import Mapped
    from xspec.hf.importer import _in_config
    from xspec.hf.weight_map import PLAIN

    mapped = Mapped("llama", "llama", "LlamaForCausalLM", PLAIN, [Setting("heads", 4, "num_attention_heads")], {}, 64)
    error = SpecError("rendered", [Diagnostic("shape", "error", Span("out/specs/modern/llama.xspec", 3, 1, 3, 2),
                                              "the shapes of an addition differ")])
    assert str(_in_config(error, mapped, Path("ckpt/config.json"))) == (
        "ckpt/config.json: the values it gives make a model xspec cannot build: the shapes of an addition differ")


def test_a_pickle_is_refused_with_how_to_convert_it(tmp_path):
    directory = copy("olmo2", tmp_path)
    (directory / "model.safetensors").rename(directory / "pytorch_model.bin")
    message = refused(directory, tmp_path / "out")
    assert message.startswith(f"{directory}/pytorch_model.bin: a pickle (torch.save) checkpoint; xspec reads only "
                              "safetensors, since unpickling runs code")
    assert "from_pretrained(DIR).save_pretrained(NEW_DIR)" in message


def test_a_config_of_a_trillion_parameters_is_refused_before_anything_is_allocated(tmp_path):
    directory = copy("mistral", tmp_path)
    edit_config(directory, lambda c: c.update(vocab_size=1_000_000, hidden_size=1_000_000, num_attention_heads=4,
                                              num_key_value_heads=2, head_dim=250_000))
    message = refused(directory, tmp_path / "out")
    assert message.startswith(f"{directory}/config.json: the model it describes has 11,00")
    assert message.endswith("GiB of memory; the largest sizes: vocab_size 1,000,000, hidden_size 1,000,000, "
                            "head_dim 250,000")


def header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + length]), data[8 + length:]


def write_with_header(path: Path, entries: dict, body: bytes) -> None:
    encoded = json.dumps(entries).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + body)


def lie_about_offsets(path: Path) -> None:
    entries, body = header(path)
    name = next(k for k in entries if k != "__metadata__")
    entries[name]["data_offsets"][1] += 4
    write_with_header(path, entries, body)


def overlap(path: Path) -> None:
    entries, body = header(path)
    names = [k for k in entries if k != "__metadata__"]
    entries[names[1]]["data_offsets"] = entries[names[0]]["data_offsets"]
    entries[names[1]]["shape"] = entries[names[0]]["shape"]
    write_with_header(path, entries, body)


SAFETENSORS_CASES = [
    ("truncated", lambda p: p.write_bytes(p.read_bytes()[:-100]), "past the end of the file"),
    ("a header longer than the file", lambda p: p.write_bytes(struct.pack("<Q", 10**9) + p.read_bytes()[8:]),
     "its header claims 1,000,000,000 bytes"),
    ("empty", lambda p: p.write_bytes(b""), "0 bytes, shorter than the 8-byte header length"),
    ("a header that is not JSON", lambda p: p.write_bytes(struct.pack("<Q", 4) + b"\xff{{{" + b"0" * 64),
     "its header is not UTF-8 (byte 0)"),
    ("offsets that disagree with the shape", lie_about_offsets, "its offsets give"),
    ("overlapping tensors", overlap, "(overlapping or scattered data)"),
]


@pytest.mark.parametrize("change, message", [c[1:] for c in SAFETENSORS_CASES], ids=[c[0] for c in SAFETENSORS_CASES])
def test_a_truncated_or_lying_safetensors_file_is_an_error_naming_it(tmp_path, change, message):
    directory = copy("olmo2", tmp_path)
    change(directory / "model.safetensors")
    text = refused(directory, tmp_path / "out")
    assert text.startswith(f"{directory / 'model.safetensors'}: not a valid safetensors file (") and message in text


def test_a_sharded_checkpoint_imports_and_a_shard_outside_the_directory_is_refused(tmp_path):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(saved("qwen2"))
    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    said = []
    import_checkpoint(tmp_path / "sharded", tmp_path / "out", say=said.append)
    assert said[0].startswith("verified against transformers' Qwen2ForCausalLM")
    index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors"
    (tmp_path / "sharded" / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "shard '../elsewhere.safetensors' is not a .safetensors file in" in refused(tmp_path / "sharded",
                                                                                       tmp_path / "out2")


def test_force_replaces_only_an_earlier_import_never_the_checkpoint(tmp_path):
    directory = copy("olmo2", tmp_path)
    assert refused(directory, directory / "run").startswith(f"{directory / 'run'}: the output may not be the "
                                                            "checkpoint directory")
    with pytest.raises(UserError, match="may not be the checkpoint directory"):
        import_checkpoint(directory, directory, force=True, verify=False)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="holds notes.txt, which no xspec import wrote there"):
        import_checkpoint(directory, tmp_path / "mine", force=True, verify=False)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    import_checkpoint(directory, tmp_path / "run", verify=False)
    (tmp_path / "run" / "checkpoints" / "step-00000100.safetensors").write_text("trained since")
    with pytest.raises(UserError, match="holds checkpoints/step-00000100.safetensors, which no xspec import wrote"):
        import_checkpoint(directory, tmp_path / "run", force=True, verify=False)
    (tmp_path / "run" / "checkpoints" / "step-00000100.safetensors").unlink()
    import_checkpoint(directory, tmp_path / "run", force=True, verify=False)
    (tmp_path / "link").symlink_to(tmp_path / "run")
    with pytest.raises(UserError, match="link: a symlink; give the directory itself"):
        import_checkpoint(directory, tmp_path / "link", force=True, verify=False)


@pytest.mark.parametrize("setting, message", [
    ({"suppress_tokens": [10 ** 30]}, "suppress_tokens [1000000000000000000000000000000] is not a list of token ids "
                                      "(integers from 0 to 2,147,483,647)"),
    ({"min_new_tokens": 10 ** 30}, "min_new_tokens 1000000000000000000000000000000 is not an integer from 0 to "
                                   "2,147,483,647"),
    ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size -1 is not an integer from 0 to 2,147,483,647"),
    ({"begin_suppress_tokens": [[1]]}, "begin_suppress_tokens [[1]] is not a list of token ids (integers from 0 to "
                                       "2,147,483,647)"),
    ({"repetition_penalty": "x"}, 'repetition_penalty "x" is not a number >= 1e-09'),
    # an id the tokenizer could never make: checked against the embedding, as the end ids are
    ({"suppress_tokens": [5, 100000]}, "suppress_tokens holds 100000, which is not a token id: the model's "
                                       "embedding has"),
])
def test_a_generation_rule_of_the_wrong_kind_or_size_is_refused_naming_its_key(tmp_path, setting, message):
    directory = copy("qwen3", tmp_path)
    (directory / "generation_config.json").write_text(json.dumps(setting))
    said = refused(directory, tmp_path / "out")
    assert said.startswith(f"{directory}/generation_config.json: {message}"), said
