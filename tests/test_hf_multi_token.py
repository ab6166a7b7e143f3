"""A DeepSeek-V3 checkpoint's multi-token prediction module (model.layers.{num_hidden_layers}.*, which
transformers neither loads nor writes): `xspec import` keeps it, checking the copies of the embedding and
output head it stores; `xspec export` writes it back as it was; a checkpoint whose config counts one but
holds no weights for it (as save_pretrained writes) imports without it, saying so."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import xspec
from float32 import assert_close
from hf_checkpoints import saved, saved_model
from xspec.base.errors import UserError
from xspec.hf.importer import import_checkpoint

transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors.torch")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def with_prediction(directory, copies_differ: bool = False):
    """deepseek_v3's checkpoint with one multi-token prediction module, stored as DeepSeek stores it: a layer
    numbered num_hidden_layers (its transformer layer's tensors under a layer's names), its norms and
    projection, and copies of the embedding and of the output head."""
    shutil.copytree(saved("deepseek_v3"), directory)
    config = json.loads((directory / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (directory / "config.json").write_text(json.dumps(config))
    tensors = safetensors.load_file(directory / "model.safetensors")
    last, new = config["num_hidden_layers"] - 1, config["num_hidden_layers"]
    generator = torch.Generator().manual_seed(2)
    for name in [n for n in tensors if n.startswith(f"model.layers.{last}.")]:
        moved = tensors[name] + 0.01 * torch.randn(tensors[name].shape, generator=generator)
        tensors[name.replace(f".{last}.", f".{new}.", 1)] = moved
    d = config["hidden_size"]
    for part, shape in (("enorm.weight", (d,)), ("hnorm.weight", (d,)), ("eh_proj.weight", (d, 2 * d)),
                        ("shared_head.norm.weight", (d,))):
        tensors[f"model.layers.{new}.{part}"] = torch.randn(shape, generator=generator)
    tensors[f"model.layers.{new}.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors[f"model.layers.{new}.shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    if copies_differ:
        tensors[f"model.layers.{new}.embed_tokens.weight"][3, 1] += 1.0
    safetensors.save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return tensors, new


def test_import_keeps_the_module_and_export_writes_it_back(tmp_path):
    from xspec.cli import main

    tensors, layer = with_prediction(tmp_path / "checkpoint")
    said: list[str] = []
    run = import_checkpoint(tmp_path / "checkpoint", tmp_path / "run", say=said.append).out
    trained = xspec.load(run, device="cpu", weights="fp32")
    model = trained.model
    assert trained.spec.params["mtp_depth"] == 1 and len(model.mtp) == 1
    assert torch.equal(model.mtp[0].eh_proj.weight, tensors[f"model.layers.{layer}.eh_proj.weight"])
    assert torch.equal(model.mtp[0].head_norm.weight, tensors[f"model.layers.{layer}.shared_head.norm.weight"])
    assert torch.equal(model.mtp[0].layer.mlp.gate.weight, tensors[f"model.layers.{layer}.mlp.gate.weight"])
    assert model.mtp[0].embed_tokens.weight is model.decoder.embed_tokens.weight
    out = tmp_path / "exported"
    assert main(["export", str(run), "--format", "hf", "-o", str(out)]) == 0
    written = safetensors.load_file(out / "model.safetensors")
    assert json.loads((out / "config.json").read_text())["num_nextn_predict_layers"] == 1
    assert sorted(written) == sorted(tensors)
    # Export writes rotary features in halves (rope_interleave false): those projections' rows reordered.
    rotary = ("q_b_proj", "kv_a_proj_with_mqa")
    assert all(torch.equal(written[name], tensors[name]) for name in tensors if not name.endswith(
        tuple(f"{part}.weight" for part in rotary)))
    assert all(torch.equal(written[name].sort(dim=0).values, tensors[name].sort(dim=0).values) for name in tensors)
    original = saved_model("deepseek_v3")
    exported = transformers.DeepseekV3ForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                                  attn_implementation="eager").eval()
    text = torch.randint(0, original.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        assert_close(exported(text).logits, original(text).logits)


def test_copies_of_the_embedding_that_differ_are_refused_naming_the_tensor(tmp_path):
    _, layer = with_prediction(tmp_path / "checkpoint", copies_differ=True)
    with pytest.raises(UserError, match=rf"tensor model\.layers\.{layer}\.embed_tokens\.weight differs from "
                                        r"model\.embed_tokens\.weight"):
        import_checkpoint(tmp_path / "checkpoint", tmp_path / "run", say=lambda _: None, verify=False)


def test_a_config_that_counts_a_module_the_weights_lack_imports_without_it(tmp_path):
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(saved("deepseek_v3"), checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (checkpoint / "config.json").write_text(json.dumps(config))
    said: list[str] = []
    imported = import_checkpoint(checkpoint, tmp_path / "run", say=said.append, verify=False)
    assert imported.spec.params["mtp_depth"] == 0
    layer = config["num_hidden_layers"]
    assert f"{checkpoint}: the checkpoint holds no weights for its 1 multi-token prediction module(s) (no " \
           f"model.layers.{layer}.eh_proj.weight; transformers' save_pretrained drops them): imported without " \
           "them" in said
