"""T5, mT5 and umT5 in and out: random checkpoints of uncommon sizes written by transformers (a test-only oracle)
import with their logits proven, with equal parameters, decode step by step as they compute whole, export back to
the same logits, read their tokenizer, translate as `generate` does and fine-tune on sentence pairs."""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

import xspec
from xspec.base.errors import UserError
from float32 import assert_close
from hf_runs import Checkpoints, read_alike
from toy_text import LINES, WORDS
from seq2seq_pairs import fine_tuned_losses, pair_losses

transformers = pytest.importorskip("transformers")

CHECKPOINTS = Checkpoints("xspec-t5-", lambda i: reference(i), lambda i: f"{SIZES[i][0]}-{i}")
ROOT = CHECKPOINTS.root
saved, imported = CHECKPOINTS.saved, CHECKPOINTS.imported
# Uncommon sizes: heads of 5 and 3 features (d_kv apart from d_model / num_heads), encoder and decoder of their
# own depths, few buckets and a short maximum distance (so that the log-spaced buckets are reached), each
# feed-forward kind, an untied configuration (no scaling of the decoder's output).
SIZES = [
    ("t5", dict(vocab_size=61, d_model=24, d_kv=5, d_ff=40, num_layers=2, num_decoder_layers=3, num_heads=3,
                relative_attention_num_buckets=8, relative_attention_max_distance=20)),
    ("t5", dict(vocab_size=70, d_model=16, d_kv=3, d_ff=36, num_layers=3, num_decoder_layers=1, num_heads=4,
                relative_attention_num_buckets=12, relative_attention_max_distance=9, feed_forward_proj="gated-gelu",
                tie_word_embeddings=False)),
    ("mt5", dict(vocab_size=53, d_model=20, d_kv=6, d_ff=28, num_layers=1, num_decoder_layers=2, num_heads=2,
                 relative_attention_num_buckets=10, relative_attention_max_distance=16)),
    ("umt5", dict(vocab_size=58, d_model=12, d_kv=4, d_ff=20, num_layers=2, num_decoder_layers=2, num_heads=3,
                  relative_attention_num_buckets=6, relative_attention_max_distance=12,
                  feed_forward_proj="gated-silu")),
]
CLASSES = {"t5": ("T5Config", "T5ForConditionalGeneration"), "mt5": ("MT5Config", "MT5ForConditionalGeneration"),
           "umt5": ("UMT5Config", "UMT5ForConditionalGeneration")}


def model_class(index: int):
    return getattr(transformers, CLASSES[SIZES[index][0]][1])


def reference(index: int):
    kind, sizes = SIZES[index]
    config = getattr(transformers, CLASSES[kind][0])(**sizes, decoder_start_token_id=0, pad_token_id=0,
                                                     eos_token_id=1)
    torch.manual_seed(index)
    model = model_class(index)(config)
    with torch.no_grad():   # transformers' initialization gives near-zero logits: move every weight
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    return model.eval()


def batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A source batch whose second sentence is padded, and target prefixes longer than the largest distance
    counted one by one."""
    draw = torch.Generator().manual_seed(5)
    source = torch.randint(2, vocab, (2, 27), generator=draw)
    padding = torch.zeros(2, 27, dtype=torch.bool)
    padding[1, 17:] = True
    return source, padding, torch.randint(2, vocab, (2, 23), generator=draw)


def their_logits(model, source, padding, target) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=source, attention_mask=(~padding).long(), decoder_input_ids=target).logits


@pytest.mark.parametrize("index", range(len(SIZES)), ids=lambda i: f"{SIZES[i][0]}-{i}")
def test_an_import_gives_the_checkpoints_logits_with_its_parameters(index):
    run = imported(index)
    record = json.loads((run / "import.json").read_text())
    assert record["verification"]["verified"] and record["verification"]["max_abs_logit_difference"] < 1e-4
    model = xspec.load(run, device="cpu", weights="fp32").model
    original = reference(index)
    source, padding, target = batch(SIZES[index][1]["vocab_size"])
    with torch.no_grad():
        assert_close(model(source, target, padding), their_logits(original, source, padding, target))
        memory = model.encode(source, padding)   # the relative positions go on in cached decoding, step by step
        from xspec.runtime.cache import DecoderCache

        cache = DecoderCache(capacity=2)
        steps = [model.decode(target[:, t:t + 1], memory, padding, cache=cache) for t in range(target.size(1))]
        assert_close(torch.cat(steps, dim=1), model(source, target, padding))
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in original.parameters())


@pytest.mark.parametrize("index", range(len(SIZES)), ids=lambda i: f"{SIZES[i][0]}-{i}")
def test_an_import_exports_back_to_the_same_logits(index, tmp_path):
    from xspec.hf.export import export_hf
    from xspec.runtime.inference import load

    (tmp_path / "hf").mkdir()
    export_hf(load(imported(index), "cpu", weights="fp32"), tmp_path / "hf")
    exported = model_class(index).from_pretrained(tmp_path / "hf").eval()
    source, padding, target = batch(SIZES[index][1]["vocab_size"])
    assert_close(their_logits(exported, source, padding, target),
                 their_logits(reference(index), source, padding, target))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == SIZES[index][0] and config["is_encoder_decoder"] is True


def test_the_untied_configuration_scales_nothing_and_a_head_of_its_own_is_read(tmp_path):
    """tie_word_embeddings false (T5 v1.1, Flan-T5): the decoder's output is not scaled; transformers 5 still
    ties the head, unless the checkpoint holds one of other values, which it (and the import) then reads."""
    from safetensors.torch import load_file, save_file

    from xspec.hf.importer import import_checkpoint

    assert xspec.load(imported(1), device="cpu").spec.params["scale_decoder_outputs"] is False
    directory = tmp_path / "flan"
    shutil.copytree(saved(1), directory)
    tensors = load_file(directory / "model.safetensors")
    tensors["lm_head.weight"] = torch.randn_like(tensors["shared.weight"])
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    said: list[str] = []
    import_checkpoint(directory, tmp_path / "run", say=said.append)
    trained = xspec.load(tmp_path / "run", device="cpu", weights="fp32")
    assert trained.spec.params["tie_word_embeddings"] is False and any("imported apart" in line for line in said)
    source, padding, target = batch(SIZES[1][1]["vocab_size"])
    theirs = transformers.T5ForConditionalGeneration.from_pretrained(directory).eval()
    with torch.no_grad():
        assert_close(trained.model(source, target, padding), their_logits(theirs, source, padding, target))


@pytest.mark.parametrize("change, message", [
    ({"feed_forward_proj": "gated-gelu-relu"}, 'feed_forward_proj "gated-gelu-relu" is not an activation ("relu") '
                                               'or a gated one ("gated-gelu")'),
    ({"dense_act_fn": "tanh"}, 'dense_act_fn activation "tanh" is not supported (supported: gelu, gelu_new, '
                               'gelu_pytorch_tanh, relu, silu, swish)'),
    ({"is_decoder": True}, "is_decoder true is not supported (supported: false)"),
    ({"tie_word_embeddings": "yes"}, 'tie_word_embeddings "yes" is not true or false'),
])
def test_a_config_the_spec_does_not_compute_is_refused_by_key(tmp_path, change, message):
    from xspec.hf.importer import import_checkpoint

    directory = CHECKPOINTS.with_config(0, tmp_path / "t5", change)
    with pytest.raises(UserError, match=re.escape(f"{directory}/config.json: {message}")):
        import_checkpoint(directory, tmp_path / "run", say=lambda line: None)


@pytest.mark.parametrize("change, message", [
    ({"relative_attention_num_buckets": 2}, "relative_attention_num_buckets 2 is not an integer >= 4"),
    ({"relative_attention_max_distance": 4}, "relative_attention_max_distance 4 is not an integer >= 5"),
])
def test_relative_buckets_the_distances_cannot_fill_are_refused_by_key(tmp_path, change, message):
    """Each direction's buckets are half exact distances, half log-spaced ones reaching past them."""
    from xspec.hf.importer import import_checkpoint

    directory = CHECKPOINTS.with_config(0, tmp_path / "t5", change)
    with pytest.raises(UserError, match=re.escape(f"{directory}/config.json: {message}")):
        import_checkpoint(directory, tmp_path / "run", say=lambda line: None)


# --- its tokenizer, its generation settings, fine-tuning ---------------------------------------------------


@functools.cache
def with_tokenizer() -> Path:
    """A checkpoint as T5's are: T5Tokenizer's files from a sentencepiece model trained here (<pad> 0, </s> 1,
    <unk> 2, then its pieces and 5 sentinels), a model of that vocabulary whose end token is likely enough to
    end some outputs early, and generation_config.json's decoder start and maximum length."""
    import random

    import sentencepiece as spm

    folder = ROOT / "spm"
    folder.mkdir()
    draw = random.Random(0)
    text = folder / "text.txt"
    text.write_text("\n".join(" ".join(draw.choice(WORDS) for _ in range(draw.randint(3, 9))) for _ in range(400)))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(folder / "spiece"), vocab_size=40,
                                   character_coverage=1.0, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
    source = ROOT / "t5-spiece"
    source.mkdir()
    shutil.copy(folder / "spiece.model", source / "spiece.model")
    (source / "config.json").write_text(json.dumps({"model_type": "t5"}))
    tokenizer = transformers.AutoTokenizer.from_pretrained(source, extra_ids=5)
    saved = ROOT / "t5-with-tokenizer"
    tokenizer.save_pretrained(saved)
    config = transformers.T5Config(vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=48, num_layers=2,
                                   num_heads=4, relative_attention_num_buckets=16, relative_attention_max_distance=32,
                                   feed_forward_proj="gated-gelu", decoder_start_token_id=0, pad_token_id=0,
                                   eos_token_id=1)
    torch.manual_seed(7)
    model = transformers.T5ForConditionalGeneration(config)
    with torch.no_grad():   # weights that make varied outputs, and an end token likely enough to end some early
        for name, parameter in model.named_parameters():
            if "layer_norm" not in name:
                parameter.copy_(torch.randn_like(parameter) * 0.5)
        model.shared.weight[1] *= 3
    model.generation_config = transformers.GenerationConfig(decoder_start_token_id=0, eos_token_id=1, pad_token_id=0,
                                                            max_length=20, num_beams=1)
    model.eval().save_pretrained(saved)
    return saved


def generated(directory: Path, lines: list[str]) -> list[str]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.T5ForConditionalGeneration.from_pretrained(directory).eval()
    with torch.no_grad():
        outputs = model.generate(**tokenizer(lines, return_tensors="pt", padding=True))
    return tokenizer.batch_decode(outputs, skip_special_tokens=True)


def test_an_import_reads_t5s_tokenizer_as_transformers_does(tmp_path):
    from xspec.hf.importer import import_checkpoint

    imported = import_checkpoint(with_tokenizer(), tmp_path / "run", say=lambda line: None)
    theirs = transformers.AutoTokenizer.from_pretrained(with_tokenizer())
    lines = [*LINES, "zebra unknown words", "the <extra_id_0> is small"]
    assert imported.tokenizer.encode_sources(lines) == theirs(lines)["input_ids"]
    ids = theirs(LINES)["input_ids"]
    assert [imported.tokenizer.decode(i) for i in ids] == theirs.batch_decode(ids, skip_special_tokens=True)


def spiece_only(tmp_path: Path, settings: dict) -> Path:
    """The checkpoint as mT5's ship: spiece.model and tokenizer_config.json, no tokenizer.json."""
    directory = tmp_path / "spiece-only"
    shutil.copytree(with_tokenizer(), directory)
    (directory / "tokenizer.json").unlink()
    shutil.copy(ROOT / "spm" / "spiece.model", directory / "spiece.model")
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer", **settings}))
    return directory


def test_a_spiece_model_alone_is_read_as_transformers_reads_it_and_exported_as_a_tokenizer_json(tmp_path):
    """Without tokenizer.json, spiece.model's unigram model, normalization and sentinels give the ids
    T5Tokenizer gives (<extra_id_0> the last id), and an export writes the tokenizer.json transformers made."""
    from xspec.hf.export import export_hf
    from xspec.hf.importer import import_checkpoint
    from xspec.runtime.inference import load

    unknown = {"__type": "AddedToken", "content": "<unk>"}     # as older tokenizer_config.json files give one
    directory = spiece_only(tmp_path, {"extra_ids": 5, "eos_token": "</s>", "unk_token": unknown})
    imported = import_checkpoint(directory, tmp_path / "run", say=lambda line: None)
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    lines = [*LINES, "zebra  unknown\twords ", "the <extra_id_0> and <extra_id_4> are small", "ﬁ café ①", ""]
    ids = read_alike(imported.tokenizer, theirs, lines)
    assert xspec.load(tmp_path / "run", device="cpu", weights="fp32").translate(LINES) == generated(directory, LINES)
    (tmp_path / "hf").mkdir()
    export_hf(load(tmp_path / "run", "cpu", weights="fp32"), tmp_path / "hf")
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")(lines)["input_ids"] == ids


@pytest.mark.parametrize("settings, damage, message", [
    ({}, b"not a model", "spiece.model: not a sentencepiece model"),
    ({}, b"", "spiece.model: not a sentencepiece model (it has no pieces)"),
    ({"extra_ids": -1}, None, "tokenizer_config.json: extra_ids -1 is not a count from 0 to 10,000"),
    ({"extra_ids": 3, "additional_special_tokens": ["<extra_id_0>"]}, None,
     "extra_ids 3, but its special tokens list 1 <extra_id_N> sentinels"),
    ({"eos_token": 7}, None, "tokenizer_config.json: eos_token 7 is not a token"),
    ({"added_tokens_decoder": {"3": {"content": "<extra_id_0>", "special": True}}}, None,
     "tokenizer_config.json: added_tokens_decoder[\"3\"] \"<extra_id_0>\": the vocabulary gives it id 44"),
])
def test_a_spiece_model_or_its_settings_that_do_not_hold_are_refused_by_file_and_key(tmp_path, settings, damage,
                                                                                    message):
    from xspec.hf.importer import import_checkpoint

    directory = spiece_only(tmp_path, {"extra_ids": 5, **settings})
    if damage is not None:
        (directory / "spiece.model").write_bytes(damage)
    with pytest.raises(UserError, match=re.escape(message)):
        import_checkpoint(directory, tmp_path / "run", say=lambda line: None)


@pytest.mark.parametrize("settings", [{}, {"num_beams": 4}, {"num_beams": 3, "length_penalty": 0.5},
                                      {"num_beams": 2, "early_stopping": True}])
def test_translation_is_generates_on_every_sentence(tmp_path, settings):
    """Greedy and beam search from the decoder start token (the padding id), as generate runs them: the same
    text for every line, with the batch's padding."""
    from xspec.hf.importer import import_checkpoint

    directory = tmp_path / "t5"
    shutil.copytree(with_tokenizer(), directory)
    generation = json.loads((directory / "generation_config.json").read_text())
    (directory / "generation_config.json").write_text(json.dumps({**generation, **settings}))
    import_checkpoint(directory, tmp_path / "run", say=lambda line: None)
    lines = LINES + [" ".join(WORDS[i:i + 4]) for i in range(0, 16)]
    ours = xspec.load(tmp_path / "run", device="cpu", weights="fp32").translate(lines)
    assert ours == generated(directory, lines)
    assert len(set(ours)) >= 3    # varied outputs: not a degenerate model agreeing by chance


def test_an_export_writes_t5s_tokenizer_and_generation_settings_back(tmp_path):
    from xspec.hf.export import export_hf
    from xspec.hf.importer import import_checkpoint
    from xspec.runtime.inference import load

    import_checkpoint(with_tokenizer(), tmp_path / "run", say=lambda line: None)
    (tmp_path / "hf").mkdir()
    export_hf(load(tmp_path / "run", "cpu", weights="fp32"), tmp_path / "hf")
    original = transformers.AutoTokenizer.from_pretrained(with_tokenizer())
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert exported(LINES)["input_ids"] == original(LINES)["input_ids"]
    ours = xspec.load(tmp_path / "run", device="cpu", weights="fp32").translate(LINES)
    assert generated(tmp_path / "hf", LINES) == ours


def test_a_fine_tuning_batch_is_transformers_batch_with_its_loss(tmp_path):
    """`train --init` on sentence pairs feeds an imported T5 as transformers' seq2seq training does: sources
    ending in </s>, targets from the decoder start token, labels ending in </s>; the same loss."""
    from xspec.hf.importer import import_checkpoint

    import_checkpoint(with_tokenizer(), tmp_path / "run", say=lambda line: None)
    trained = xspec.load(tmp_path / "run", device="cpu", weights="fp32")
    tokenizer = transformers.AutoTokenizer.from_pretrained(with_tokenizer())
    model = transformers.T5ForConditionalGeneration.from_pretrained(with_tokenizer())
    assert_close(*pair_losses(trained, tokenizer, model, LINES, LINES[::-1], tmp_path))


def test_train_init_fine_tunes_an_imported_t5_on_sentence_pairs(tmp_path):
    from xspec.hf.importer import import_checkpoint

    import_checkpoint(with_tokenizer(), tmp_path / "run", say=lambda line: None)
    valid = fine_tuned_losses(tmp_path / "run", LINES, tmp_path)
    assert len(valid) == 4 and valid[-1] < valid[0], valid


def test_attention_maps_hold_the_relative_position_bias():
    """`xspec viz --attention` draws the weights the model computes: with T5's position bias in the scores,
    the weights transformers returns (output_attentions) for every layer of each stack."""
    from xspec.viz.attention import attention_sites, capture

    trained = xspec.load(imported(0), device="cpu", weights="fp32")
    source, _, target = batch(SIZES[0][1]["vocab_size"])
    sites = attention_sites(trained.spec)
    captured = capture(trained.model, trained.spec, sites, source[:1], target[:1])
    theirs = model_class(0).from_pretrained(saved(0), attn_implementation="eager").eval()
    with torch.no_grad():
        out = theirs(input_ids=source[:1], decoder_input_ids=target[:1], output_attentions=True)
    expected = {"encoder self-attention": out.encoder_attentions, "decoder self-attention": out.decoder_attentions,
                "encoder-decoder attention": out.cross_attentions}
    for site in sites:
        assert_close(captured[site.module], expected[site.kind][site.layer - 1][0])
