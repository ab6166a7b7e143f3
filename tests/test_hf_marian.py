"""Marian (MarianMTModel) in and out: random checkpoints of uncommon sizes written by transformers (a test-only
oracle) import with their logits proven, with equal parameters, and export back to the same logits; what a
checkpoint keeps beside its tensors (copies of the shared embedding, the positions' tables) must hold what the
spec computes."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import pytest
import torch

import xspec
from xspec.base.errors import UserError
from float32 import assert_close

transformers = pytest.importorskip("transformers")

ROOT = Path(tempfile.mkdtemp(prefix="xspec-marian-"))
# Uncommon sizes: heads of 8 and 4 features, encoder and decoder of their own depths, widths and head counts.
SIZES = [
    dict(vocab_size=67, d_model=24, encoder_layers=1, decoder_layers=3, encoder_attention_heads=3,
         decoder_attention_heads=2, encoder_ffn_dim=40, decoder_ffn_dim=52, activation_function="swish",
         scale_embedding=True),
    dict(vocab_size=91, d_model=32, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
         decoder_attention_heads=8, encoder_ffn_dim=24, decoder_ffn_dim=36, activation_function="gelu",
         scale_embedding=False),
    dict(vocab_size=50, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
         decoder_attention_heads=4, encoder_ffn_dim=20, decoder_ffn_dim=20, activation_function="relu",
         scale_embedding=True, share_encoder_decoder_embeddings=False, tie_word_embeddings=False),
]


def reference(index: int) -> "transformers.MarianMTModel":
    sizes = SIZES[index]
    config = transformers.MarianConfig(**sizes, max_position_embeddings=64, pad_token_id=sizes["vocab_size"] - 1,
                                       eos_token_id=0, decoder_start_token_id=sizes["vocab_size"] - 1)
    torch.manual_seed(index)
    model = transformers.MarianMTModel(config)
    with torch.no_grad():   # transformers' initialization gives near-zero logits: move every weight and the bias
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn_like(parameter) * 0.1)
        model.final_logits_bias.add_(torch.randn_like(model.final_logits_bias))
    return model.eval()


@functools.cache
def saved(index: int) -> Path:
    path = ROOT / f"marian-{index}"
    reference(index).save_pretrained(path)
    return path


@functools.cache
def imported(index: int) -> Path:
    from xspec.hf.importer import import_checkpoint

    run = ROOT / f"run-{index}"
    import_checkpoint(saved(index), run, say=lambda line: None)
    return run


def batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A source batch whose second sentence is padded, and target prefixes."""
    draw = torch.Generator().manual_seed(5)
    source = torch.randint(0, vocab - 1, (2, 11), generator=draw)
    padding = torch.zeros(2, 11, dtype=torch.bool)
    padding[1, 7:] = True
    return source, padding, torch.randint(0, vocab - 1, (2, 9), generator=draw)


def their_logits(model, source, padding, target) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=source, attention_mask=(~padding).long(), decoder_input_ids=target).logits


@pytest.mark.parametrize("index", range(len(SIZES)))
def test_an_import_gives_marians_logits_with_its_parameters(index):
    run = imported(index)
    record = json.loads((run / "import.json").read_text())
    assert record["verification"]["verified"] and record["verification"]["max_abs_logit_difference"] < 1e-4
    model = xspec.load(run, device="cpu", weights="fp32").model
    original = reference(index)
    source, padding, target = batch(SIZES[index]["vocab_size"])
    with torch.no_grad():
        assert_close(model(source, target, padding), their_logits(original, source, padding, target))
        memory = model.encode(source, padding)   # the positions go on in cached decoding, step by step
        from xspec.runtime.cache import DecoderCache

        cache = DecoderCache(capacity=2)
        steps = [model.decode(target[:, t:t + 1], memory, padding, cache=cache) for t in range(target.size(1))]
        assert_close(torch.cat(steps, dim=1), model(source, target, padding))
    # transformers counts the two positions' tables (frozen) as parameters and final_logits_bias as a buffer
    positions = 2 * 64 * SIZES[index]["d_model"]
    theirs = sum(p.numel() for p in original.parameters()) - positions + original.final_logits_bias.numel()
    assert sum(p.numel() for p in model.parameters()) == theirs


@pytest.mark.parametrize("index", range(len(SIZES)))
def test_an_import_exports_back_to_the_same_logits(index, tmp_path):
    from xspec.hf.export import export_hf
    from xspec.runtime.inference import load

    (tmp_path / "hf").mkdir()
    export_hf(load(imported(index), "cpu", weights="fp32"), tmp_path / "hf")
    exported = transformers.MarianMTModel.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    source, padding, target = batch(SIZES[index]["vocab_size"])
    assert_close(their_logits(exported, source, padding, target),
                 their_logits(reference(index), source, padding, target))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "marian" and config["is_encoder_decoder"] is True
    assert {k: config[k] for k in SIZES[index]} == {k: v for k, v in SIZES[index].items()}


def with_tensors(tmp_path: Path, **extra: torch.Tensor) -> Path:
    """The first checkpoint with tensors added to its weights, as older conversions wrote them."""
    from safetensors.torch import load_file, save_file

    directory = tmp_path / "marian"
    directory.mkdir()
    for name in ("config.json", "generation_config.json"):
        (directory / name).write_bytes((saved(0) / name).read_bytes())
    tensors = load_file(saved(0) / "model.safetensors")
    save_file({**tensors, **{k.replace("__", "."): v for k, v in extra.items()}}, directory / "model.safetensors",
              metadata={"format": "pt"})
    return directory


def marian_positions() -> torch.Tensor:
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    return MarianSinusoidalPositionalEmbedding(64, SIZES[0]["d_model"]).create_weight()


def test_copies_of_the_shared_embedding_and_the_positions_tables_are_checked_not_read(tmp_path):
    from xspec.hf.importer import import_checkpoint

    shared = reference(0).model.shared.weight.detach()
    kept = with_tensors(tmp_path, model__encoder__embed_tokens__weight=shared.clone(),
                        model__decoder__embed_tokens__weight=shared.clone(), lm_head__weight=shared.clone(),
                        model__encoder__embed_positions__weight=marian_positions(),
                        model__decoder__embed_positions__weight=marian_positions())
    import_checkpoint(kept, tmp_path / "run", say=lambda line: None)
    assert json.loads((tmp_path / "run" / "import.json").read_text())["verification"]["verified"]


@pytest.mark.parametrize("name, tensor, message", [
    ("model__decoder__embed_tokens__weight", lambda: reference(0).model.shared.weight.detach() + 1,
     "model.decoder.embed_tokens.weight differs from model.shared.weight, but share_encoder_decoder_embeddings is "
     "true"),
    ("model__encoder__embed_positions__weight", lambda: marian_positions().roll(1, dims=1),
     "tensor model.encoder.embed_positions.weight differs from the sinusoidal positions Marian computes"),
    ("model__encoder__layers__0__fc3__weight", lambda: torch.zeros(2, 2), "tensor model.encoder.layers.0.fc3.weight "
     "is left over"),
])
def test_what_a_checkpoint_keeps_beside_its_tensors_must_be_what_the_spec_computes(tmp_path, name, tensor, message):
    from xspec.hf.importer import import_checkpoint

    with pytest.raises(UserError, match=message.replace(".", r"\.")):
        import_checkpoint(with_tensors(tmp_path, **{name: tensor()}), tmp_path / "run", say=lambda line: None)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("change, message", [
    ({"decoder_vocab_size": 66}, "decoder_vocab_size 66 differs from vocab_size 67: a target vocabulary of its own "
                                 "is not supported"),
    ({"activation_function": "tanh"}, 'activation_function "tanh" is not supported (supported: swish, silu, gelu, '
                                      'relu)'),
    ({"normalize_before": True}, "normalize_before true is not supported (supported: false)"),
    ({"encoder_layerdrop": 0.1}, "encoder_layerdrop 0.1 is not supported"),
])
def test_a_config_the_spec_does_not_compute_is_refused_by_key(tmp_path, change, message):
    from xspec.hf.importer import import_checkpoint

    directory = tmp_path / "marian"
    directory.mkdir()
    config = json.loads((saved(0) / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **change}))
    (directory / "model.safetensors").symlink_to(saved(0) / "model.safetensors")
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        import_checkpoint(directory, tmp_path / "run", say=lambda line: None)
