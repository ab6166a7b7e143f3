"""Marian (MarianMTModel) in and out: random checkpoints of uncommon sizes written by transformers (a test-only
oracle) import with their logits proven, with equal parameters, and export back to the same logits; what a
checkpoint keeps beside its tensors (copies of the shared embedding, the positions' tables) must hold what the
spec computes."""

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
from hf_runs import Checkpoints
from toy_text import LINES, WORDS
from seq2seq_pairs import fine_tuned_losses, pair_losses

transformers = pytest.importorskip("transformers")

CHECKPOINTS = Checkpoints("xspec-marian-", lambda i: reference(i), lambda i: f"marian-{i}")
ROOT = CHECKPOINTS.root
saved, imported = CHECKPOINTS.saved, CHECKPOINTS.imported
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
    dict(vocab_size=50, decoder_vocab_size=61, d_model=20, encoder_layers=1, decoder_layers=2,   # separate vocabs
         encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=28, decoder_ffn_dim=24,
         activation_function="swish", scale_embedding=True, share_encoder_decoder_embeddings=False),
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


def batch(sizes: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A source batch whose second sentence is padded, and target prefixes (of the target's own vocabulary,
    where the sizes give it one)."""
    draw = torch.Generator().manual_seed(5)
    source = torch.randint(0, sizes["vocab_size"] - 1, (2, 11), generator=draw)
    padding = torch.zeros(2, 11, dtype=torch.bool)
    padding[1, 7:] = True
    target_vocab = sizes.get("decoder_vocab_size", sizes["vocab_size"])
    return source, padding, torch.randint(0, target_vocab - 1, (2, 9), generator=draw)


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
    source, padding, target = batch(SIZES[index])
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
    source, padding, target = batch(SIZES[index])
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
     "model.decoder.embed_tokens.weight differs from model.shared.weight, but the encoder and the decoder share "
     "one embedding"),
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


@pytest.mark.parametrize("index, change, message", [
    (2, {"decoder_vocab_size": 49}, "tensor model.decoder.embed_tokens.weight (50, 16) has the wrong shape: the model "
                                    "with this config.json needs (49, 16)"),
    (0, {"activation_function": "tanh"}, 'activation_function "tanh" is not supported (supported: swish, silu, gelu, '
                                         'relu)'),
    (0, {"normalize_before": True}, "normalize_before true is not supported (supported: false)"),
])
def test_a_config_the_spec_does_not_compute_is_refused_by_key(tmp_path, index, change, message):
    from xspec.hf.importer import import_checkpoint

    directory = CHECKPOINTS.with_config(index, tmp_path / "marian", change)
    with pytest.raises(UserError, match=re.escape(message)):
        import_checkpoint(directory, tmp_path / "run", say=lambda line: None)


# --- its tokenizer and its generation settings ---------------------------------------------------------------


@functools.cache
def with_tokenizer(codes: tuple[str, ...] = ()) -> Path:
    """A checkpoint as opus-mt's are: source.spm and target.spm (sentencepiece, one trained here), vocab.json (its
    pieces, after </s> 0 and <unk> 1, then the target languages' `>>xx<<` of `codes`, <pad> last), a model of
    that vocabulary, and generation_config.json's decoder start, bad words, forced end and maximum length."""
    import random

    import sentencepiece as spm

    folder = ROOT / ("marian-text" + "-".join(("", *codes)))
    folder.mkdir()
    draw = random.Random(0)
    text = folder / "text.txt"
    text.write_text("\n".join(" ".join(draw.choice(WORDS) for _ in range(draw.randint(3, 9))) for _ in range(400)))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(folder / "spm"), vocab_size=40,
                                   character_coverage=1.0, minloglevel=2)
    processor = spm.SentencePieceProcessor(model_file=str(folder / "spm.model"))
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())
              if not (processor.is_control(i) or processor.is_unknown(i))]
    vocab = {"</s>": 0, "<unk>": 1, **{piece: i + 2 for i, piece in enumerate(pieces)}}
    vocab |= {f">>{code}<<": len(vocab) + i for i, code in enumerate(codes)}
    vocab["<pad>"] = len(vocab)
    saved = ROOT / ("marian-with-tokenizer" + "-".join(("", *codes)))
    tokenizer = transformers.MarianTokenizer(str(folder / "spm.model"), str(folder / "spm.model"),
                                             _json(folder / "vocab.json", vocab))
    tokenizer.save_pretrained(saved)
    config = transformers.MarianConfig(vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=2,
                                       encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
                                       decoder_ffn_dim=48, activation_function="swish", scale_embedding=True,
                                       max_position_embeddings=64, pad_token_id=len(vocab) - 1, eos_token_id=0,
                                       decoder_start_token_id=len(vocab) - 1, forced_eos_token_id=0)
    torch.manual_seed(7)
    model = transformers.MarianMTModel(config)
    with torch.no_grad():   # weights that make varied outputs, and an end token likely enough to end some early
        torch.manual_seed(2)
        for name, parameter in model.named_parameters():
            if "layer_norm" not in name and parameter.requires_grad:
                parameter.copy_(torch.randn_like(parameter) * 0.5)
        model.final_logits_bias[0, 0] = 3.0
    model.generation_config = transformers.GenerationConfig(
        decoder_start_token_id=len(vocab) - 1, eos_token_id=0, forced_eos_token_id=0, pad_token_id=len(vocab) - 1,
        bad_words_ids=[[len(vocab) - 1]], max_length=24, num_beams=1)
    model.eval().save_pretrained(saved)
    return saved


def _json(path: Path, value: dict) -> str:
    path.write_text(json.dumps(value))
    return str(path)


def test_an_import_reads_marians_tokenizer_as_marian_tokenizer_does(tmp_path):
    from xspec.hf.importer import import_checkpoint

    imported = import_checkpoint(with_tokenizer(), tmp_path / "run", say=lambda line: None)
    assert imported.tokenizer.kind == "marian"
    theirs = transformers.MarianTokenizer.from_pretrained(with_tokenizer())
    lines = [*LINES, "zebra unknown words", ">>de<< the house"]
    assert [ids + [0] for ids in imported.tokenizer.encode(lines)] == theirs(lines)["input_ids"]
    ids = theirs(LINES)["input_ids"]
    assert [imported.tokenizer.decode(i) for i in ids] == theirs.batch_decode(ids, skip_special_tokens=True)


def test_greedy_translation_is_generates_on_every_sentence(tmp_path):
    """decoder_start_token_id, bad_words_ids (the padding id), forced_eos_token_id and max_length as generate
    applies them: the same text for every line, with the batch's padding."""
    from xspec.hf.importer import import_checkpoint

    import_checkpoint(with_tokenizer(), tmp_path / "run", say=lambda line: None)
    ours = xspec.load(tmp_path / "run", device="cpu", weights="fp32").translate(LINES)
    tokenizer = transformers.MarianTokenizer.from_pretrained(with_tokenizer())
    model = transformers.MarianMTModel.from_pretrained(with_tokenizer()).eval()
    with torch.no_grad():
        outputs = model.generate(**tokenizer(LINES, return_tensors="pt", padding=True))
    assert ours == tokenizer.batch_decode(outputs, skip_special_tokens=True)
    assert len(set(ours)) >= 3    # varied outputs: not a degenerate model agreeing by chance


@pytest.mark.parametrize("settings", [{"num_beams": 4}, {"num_beams": 3, "length_penalty": 0.5},
                                      {"num_beams": 5, "early_stopping": True},
                                      {"num_beams": 2, "length_penalty": 2.0}])
def test_beam_translation_is_generates(tmp_path, settings):
    """Beam search as transformers' generate runs it (an import's beam_scoring): |Y|^length_penalty, only the
    best `beam` candidates of a step may end, early_stopping's rule; the same text for every line."""
    from xspec.hf.importer import import_checkpoint

    directory = tmp_path / "marian"
    shutil.copytree(with_tokenizer(), directory)
    generation = json.loads((directory / "generation_config.json").read_text())
    (directory / "generation_config.json").write_text(json.dumps({**generation, **settings}))
    import_checkpoint(directory, tmp_path / "run", say=lambda line: None)
    lines = LINES + [" ".join(WORDS[i:i + 4]) for i in range(0, 16)]
    ours = xspec.load(tmp_path / "run", device="cpu", weights="fp32").translate(lines)
    tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    model = transformers.MarianMTModel.from_pretrained(directory).eval()
    with torch.no_grad():
        theirs = tokenizer.batch_decode(model.generate(**tokenizer(lines, return_tensors="pt", padding=True)),
                                        skip_special_tokens=True)
    assert ours == theirs


@pytest.mark.parametrize("settings, tokens", [({"do_sample": True, "top_k": 8}, 1),
                                              ({"do_sample": True, "num_beams": 3, "temperature": 0.7}, 2)],
                         ids=["sampling", "beam sampling"])
def test_sampled_translations_come_as_often_as_generates(tmp_path, settings, tokens):
    """An import whose generation_config.json samples translates by sampling (one translation a line, or beam
    sampling): 1,000 translations of one line, each drawn from its line's stream, begin with the same tokens
    as often as generate's 1,000 (a total variation distance at the noise of 1,000 draws, about 0.06); beam
    search, or sampling one where generate samples in beams, are far from them."""
    from collections import Counter

    from xspec.hf.importer import import_checkpoint

    directory = tmp_path / "marian"
    shutil.copytree(with_tokenizer(), directory)
    generation = json.loads((directory / "generation_config.json").read_text())
    (directory / "generation_config.json").write_text(json.dumps({**generation, **settings}))
    import_checkpoint(directory, tmp_path / "run", say=lambda line: None)
    draws, trained = 1000, xspec.load(tmp_path / "run", device="cpu", weights="fp32")
    tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    torch.manual_seed(0)
    with torch.no_grad():
        outputs = transformers.MarianMTModel.from_pretrained(directory).eval().generate(
            **tokenizer([LINES[0]] * draws, return_tensors="pt", padding=True))
    theirs = Counter(tuple(row[1:1 + tokens].tolist()) for row in outputs)     # after the decoder's start

    def ours(**settings) -> Counter:
        hypotheses = trained.translator(**settings).nbest([LINES[0]] * draws)
        return Counter(tuple(best[0].tokens[:tokens]) for best in hypotheses)

    def distance(a: Counter, b: Counter) -> float:
        return sum(abs(a[key] - b[key]) for key in {*a, *b}) / (2 * draws)

    drawn = ours()
    assert len(drawn) > 3 and distance(drawn, theirs) < 0.15
    beams = settings.get("num_beams", 1)
    assert distance(ours(beam=beams), theirs) > 0.3                         # beam search's
    if beams > 1:
        assert distance(ours(sample=True, beam=1), theirs) > 0.3           # one translation sampled a line
    assert trained.translate([LINES[0]] * 3, seed=4) == trained.translate([LINES[0]] * 3, seed=4)


def test_an_export_writes_marians_tokenizer_and_generation_settings_back(tmp_path):
    from xspec.hf.export import export_hf
    from xspec.hf.importer import import_checkpoint
    from xspec.runtime.inference import load

    import_checkpoint(with_tokenizer(), tmp_path / "run", say=lambda line: None)
    (tmp_path / "hf").mkdir()
    export_hf(load(tmp_path / "run", "cpu", weights="fp32"), tmp_path / "hf")
    original = transformers.MarianTokenizer.from_pretrained(with_tokenizer())
    exported = transformers.MarianTokenizer.from_pretrained(tmp_path / "hf")
    assert exported(LINES)["input_ids"] == original(LINES)["input_ids"]
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    pad = len(original) - 1
    assert (generation["decoder_start_token_id"], generation["bad_words_ids"], generation["max_length"]) == \
        (pad, [[pad]], 24)
    model = transformers.MarianMTModel.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        outputs = model.generate(**exported(LINES, return_tensors="pt", padding=True))
    assert exported.batch_decode(outputs, skip_special_tokens=True) == \
        xspec.load(tmp_path / "run", device="cpu", weights="fp32").translate(LINES)


# --- fine-tuning -------------------------------------------------------------------------------------------

def test_a_fine_tuning_batch_is_transformers_batch_with_its_loss(tmp_path):
    """`train --init` on sentence pairs feeds an imported Marian as transformers' seq2seq training does:
    sources ending in </s>, targets from decoder_start_token_id, labels ending in </s>; the same loss."""
    from xspec.hf.importer import import_checkpoint

    import_checkpoint(with_tokenizer(), tmp_path / "run", say=lambda line: None)
    trained = xspec.load(tmp_path / "run", device="cpu", weights="fp32")
    tokenizer = transformers.MarianTokenizer.from_pretrained(with_tokenizer())
    model = transformers.MarianMTModel.from_pretrained(with_tokenizer())
    assert_close(*pair_losses(trained, tokenizer, model, LINES, LINES[::-1], tmp_path))


def test_train_init_fine_tunes_an_imported_marian_on_sentence_pairs(tmp_path):
    from xspec.hf.importer import import_checkpoint

    import_checkpoint(with_tokenizer(), tmp_path / "run", say=lambda line: None)
    valid = fine_tuned_losses(tmp_path / "run", LINES, tmp_path)
    assert len(valid) == 4 and valid[-1] < valid[0], valid
    assert xspec.load(tmp_path / "tuned", device="cpu").tokenizer.kind == "marian"


@pytest.mark.parametrize("change, message", [
    ({"forced_eos_token_id": 5}, "forced_eos_token_id 5 is not the end token ([0]): not supported"),
    ({"bad_words_ids": [[3, 4]]}, "bad_words_ids [[3, 4]]: only single tokens are supported"),
    ({"early_stopping": "sometimes"}, 'early_stopping "sometimes" is not true, false or "never"'),
    ({"length_penalty": -1.0}, "length_penalty -1.0 is not a number >= 0"),
])
def test_generation_settings_translation_cannot_apply_are_refused_by_key(tmp_path, change, message):
    from xspec.hf.importer import import_checkpoint

    directory = tmp_path / "marian"
    shutil.copytree(with_tokenizer(), directory)
    generation = json.loads((directory / "generation_config.json").read_text())
    (directory / "generation_config.json").write_text(json.dumps({**generation, **change}))
    with pytest.raises(UserError, match=re.escape(f"{directory}/generation_config.json: {message}")):
        import_checkpoint(directory, tmp_path / "run", say=lambda line: None)


def test_tgt_lang_asks_a_multilingual_marian_for_its_target_language(tmp_path, capsys):
    """`--tgt-lang fr` puts Marian's `>>fr<<` before each line, as its multilingual models are asked; a code the
    vocabulary lacks is refused, listing those it has."""
    from xspec.cli import main
    from xspec.hf.importer import import_checkpoint

    directory = with_tokenizer(("de", "fr"))
    import_checkpoint(directory, tmp_path / "run", say=lambda line: None)
    (tmp_path / "in.txt").write_text("\n".join(LINES) + "\n")
    assert main(["translate", str(tmp_path / "run"), "--tgt-lang", "fr", "-i", str(tmp_path / "in.txt")]) == 0
    ours = capsys.readouterr().out.splitlines()
    tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    model = transformers.MarianMTModel.from_pretrained(directory).eval()
    with torch.no_grad():
        outputs = model.generate(**tokenizer([f">>fr<< {line}" for line in LINES], return_tensors="pt", padding=True))
    assert ours == tokenizer.batch_decode(outputs, skip_special_tokens=True)
    assert xspec.load(tmp_path / "run", device="cpu").translate(LINES) != ours    # the code changes the output
    assert main(["translate", str(tmp_path / "run"), "--tgt-lang", "it", "-i", str(tmp_path / "in.txt")]) == 1
    error = capsys.readouterr().err
    assert "--tgt-lang it: " in error and "has no >>it<< token (its target languages: de, fr)" in error


def test_tgt_lang_is_refused_where_the_tokenizer_names_no_languages(tmp_path, capsys):
    from xspec.cli import main

    (tmp_path / "in.txt").write_text("the house\n")
    assert main(["translate", str(imported(0)), "--tgt-lang", "fr", "-i", str(tmp_path / "in.txt")]) == 1
    error = capsys.readouterr().err
    assert "--tgt-lang fr: " in error and "names no target languages (Marian's >>xx<< tokens, or a " in error
    assert main(["translate", str(imported(0)), "--tgt-lang", "fr\x1b[2J\n", "-i", str(tmp_path / "in.txt")]) == 1
    error = capsys.readouterr().err
    assert "--tgt-lang fr\\x1b[2J\\n: " in error and "\x1b" not in error    # a terminal sees the code escaped


@pytest.mark.parametrize("name, content, message", [
    ("vocab.json", b"[1, 2]", "vocab.json is not a JSON object of pieces and their ids"),
    ("vocab.json", b'{"a": 1, "b": "two"}', 'vocab.json: the id of "b" is not an integer'),
    ("vocab.json", b'{"a": 0, "b": -3}', 'vocab.json: the id of "b" is not an integer'),
    ("vocab.json", b'{"</s>": 0, "a": 1}', "vocab.json has no <unk>"),
    ("vocab.json", b'{"</s>": 0, "<unk>": 1, "a": 2, "a": 3}', "vocab.json"),
    ("source.spm", b"", "source.spm: empty, not a sentencepiece model"),
    ("target.spm", b"not a model", "target.spm: not a sentencepiece model"),
])
def test_marians_tokenizer_files_are_checked_and_refused_by_name(tmp_path, capfd, name, content, message):
    from xspec.cli import main

    directory = tmp_path / "marian"
    shutil.copytree(with_tokenizer(), directory)
    (directory / name).write_bytes(content)
    capfd.readouterr()       # what making the checkpoint wrote
    assert main(["import", str(directory), "-o", str(tmp_path / "run"), "--no-verify"]) == 1
    error = capfd.readouterr().err
    assert message in error and str(directory) in error and "Traceback" not in error
    assert len(error.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_targets_of_training_pairs_are_split_by_target_spm_as_marian_tokenizer_splits_a_text_target(tmp_path):
    """opus-mt's source.spm and target.spm differ (one per language): a pair's target is split by the target's."""
    import random

    import sentencepiece as spm

    from xspec.runtime.tokenizer import CheckpointTokenizer
    from xspec.runtime.tokenizer_files import kept_files

    draw = random.Random(3)
    models = {}
    for side, words in (("source", WORDS[:10]), ("target", WORDS[8:])):
        text = tmp_path / f"{side}.txt"
        text.write_text("\n".join(" ".join(draw.choice(words) for _ in range(6)) for _ in range(300)))
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / side), vocab_size=30,
                                       character_coverage=1.0, minloglevel=2)
        models[side] = spm.SentencePieceProcessor(model_file=str(tmp_path / f"{side}.model"))
    pieces = dict.fromkeys(m.id_to_piece(i) for m in models.values() for i in range(m.get_piece_size())
                           if not (m.is_control(i) or m.is_unknown(i)))
    vocab = {"</s>": 0, "<unk>": 1, **{piece: i + 2 for i, piece in enumerate(pieces)}}
    vocab["<pad>"] = len(vocab)
    files = {f"{side}.spm": (tmp_path / f"{side}.model").read_bytes() for side in models}
    files["vocab.json"] = json.dumps(vocab).encode()
    ours = CheckpointTokenizer("marian", kept_files(files), None, [0], str(tmp_path), add_bos=False, add_eos=True)
    theirs = transformers.MarianTokenizer(str(tmp_path / "source.model"), str(tmp_path / "target.model"),
                                          _json(tmp_path / "vocab.json", vocab))
    lines = ["the river runs under the old city", "we see a green tree"]
    assert ours.encode_targets(lines) == theirs(text_target=lines)["input_ids"]
    assert ours.encode_sources(lines) == theirs(lines)["input_ids"]
    assert ours.encode_targets(lines) != ours.encode_sources(lines)


@functools.cache
def with_separate_vocabularies() -> Path:
    """A checkpoint as opus-mt's with separate_vocabs are: source.spm and target.spm trained on words of their own,
    vocab.json and target_vocab.json of each side's pieces (</s> 0, <unk> 1, <pad> 2 in both), and a model whose
    sides have embeddings of their own, the decoder's of the target's size."""
    import random

    import sentencepiece as spm

    folder = ROOT / "marian-separate-text"
    folder.mkdir()
    draw = random.Random(5)
    vocabularies = {}
    for side, words in (("source", WORDS[:12]), ("target", WORDS[9:])):
        text = folder / f"{side}.txt"
        text.write_text("\n".join(" ".join(draw.choice(words) for _ in range(draw.randint(3, 8))) for _ in range(300)))
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(folder / side),
                                       vocab_size=30 if side == "source" else 26, character_coverage=1.0, minloglevel=2)
        processor = spm.SentencePieceProcessor(model_file=str(folder / f"{side}.model"))
        pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())
                  if not (processor.is_control(i) or processor.is_unknown(i))]
        vocabularies[side] = {"</s>": 0, "<unk>": 1, "<pad>": 2, **{p: i + 3 for i, p in enumerate(pieces)}}
    saved = ROOT / "marian-separate-vocabularies"
    tokenizer = transformers.MarianTokenizer(
        str(folder / "source.model"), str(folder / "target.model"),
        _json(folder / "vocab.json", vocabularies["source"]),
        target_vocab_file=_json(folder / "target_vocab.json", vocabularies["target"]), separate_vocabs=True)
    tokenizer.save_pretrained(saved)
    config = transformers.MarianConfig(vocab_size=len(vocabularies["source"]),
                                       decoder_vocab_size=len(vocabularies["target"]),
                                       share_encoder_decoder_embeddings=False, d_model=24, encoder_layers=2,
                                       decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=3,
                                       encoder_ffn_dim=40, decoder_ffn_dim=36, activation_function="swish",
                                       max_position_embeddings=64, pad_token_id=2, eos_token_id=0,
                                       decoder_start_token_id=2, forced_eos_token_id=0)
    torch.manual_seed(11)
    model = transformers.MarianMTModel(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" not in name and parameter.requires_grad:
                parameter.copy_(torch.randn_like(parameter) * 0.5)
        model.final_logits_bias[0, 0] = 1.0     # an end token likely enough to end some outputs early
    model.generation_config = transformers.GenerationConfig(
        decoder_start_token_id=2, eos_token_id=0, forced_eos_token_id=0, pad_token_id=2, bad_words_ids=[[2]],
        max_length=20, num_beams=1)
    model.eval().save_pretrained(saved)
    return saved


def test_separate_vocabularies_are_read_translated_tuned_and_exported_as_transformers_does(tmp_path):
    """separate_vocabs: sources through source.spm and vocab.json, targets and outputs through target.spm and
    target_vocab.json; translations equal generate's, a fine-tuning batch's loss transformers', and an export
    writes both vocabularies back."""
    from xspec.hf.export import export_hf
    from xspec.runtime.inference import load

    directory = with_separate_vocabularies()
    import_checkpoint_quietly(directory, tmp_path / "run")
    trained = xspec.load(tmp_path / "run", device="cpu", weights="fp32")
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    lines = [*LINES, "zebra unknown words"]
    assert trained.tokenizer.encode_sources(lines) == theirs(lines)["input_ids"]
    assert trained.tokenizer.encode_targets(lines) == theirs(text_target=lines)["input_ids"]
    targets = theirs(text_target=lines)["input_ids"]
    assert [trained.tokenizer.decode(i) for i in targets] == theirs.batch_decode(targets, skip_special_tokens=True)
    model = transformers.MarianMTModel.from_pretrained(directory).eval()
    with torch.no_grad():
        outputs = model.generate(**theirs(lines, return_tensors="pt", padding=True))
    ours = trained.translate(lines)
    assert ours == theirs.batch_decode(outputs, skip_special_tokens=True) and len(set(ours)) >= 3
    assert_close(*pair_losses(trained, theirs, model, LINES, LINES[::-1], tmp_path))
    (tmp_path / "hf").mkdir()
    export_hf(load(tmp_path / "run", "cpu", weights="fp32"), tmp_path / "hf")
    assert (tmp_path / "hf" / "target_vocab.json").read_bytes() == (directory / "target_vocab.json").read_bytes()
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert exported(text_target=lines)["input_ids"] == targets


@pytest.mark.parametrize("change, message", [
    (lambda d: (d / "target_vocab.json").unlink(), "separate_vocabs is true, but"),
    (lambda d: (d / "target_vocab.json").write_text(json.dumps({"<unk>": 1, "</s>": 3})),
     "target_vocab.json gives </s> another id than vocab.json does"),
    (lambda d: (d / "target_vocab.json").write_text(json.dumps({"</s>": 0, "<unk>": 1, "a": 90})),
     "target_vocab.json: its ids reach 90, but the decoder scores"),
])
def test_a_target_vocabulary_that_does_not_hold_is_refused_by_file(tmp_path, change, message):
    directory = tmp_path / "marian"
    shutil.copytree(with_separate_vocabularies(), directory)
    change(directory)
    with pytest.raises(UserError, match=re.escape(message)):
        import_checkpoint_quietly(directory, tmp_path / "run")


def import_checkpoint_quietly(directory: Path, out: Path) -> None:
    from xspec.hf.importer import import_checkpoint

    import_checkpoint(directory, out, say=lambda line: None)


@torch.no_grad()
def test_a_run_whose_spec_named_its_activation_parameter_activation_exports_as_marian(tmp_path):
    """Runs an older xspec wrote named the parameter `activation` and chose the function by `if`s over it in
    each layer: export reads them as today's spec and gives the original logits."""
    from xspec.hf.export import export_hf
    from xspec.hf.spec_text import family_spec
    from xspec.runtime.inference import load

    trained = load(imported(1), "cpu", weights="fp32")   # gelu
    text = family_spec("marian").read_text()
    chosen = ('if activation == "gelu" { act = h => gelu(h) } else { if activation == "relu" { act = h => relu(h) } '
              'else { act = h => silu(h) } }\n    ')
    text = re.sub(r"(\n    )h = activation\(linear\(x, (\w+)\) as fc1, activation_function\) as activation_fn",
                  lambda m: f"{m[1]}{chosen}h = act(linear(x, {m[2]}) as fc1)", text)
    text = text.replace('param activation_function = "silu"', 'param activation = "silu"')
    assert "activation_function" not in text
    params = {k: v for k, v in trained.spec.params.items() if not isinstance(v, (str, list))}
    older = xspec.compile_source(text, str(family_spec("marian")), overrides={
        **params, "activation": '"gelu"', "data.max_tokens": trained.spec.data.max_tokens})
    assert "activation" not in {node["op"] for node in json.loads(older.graph_json())["nodes"]}
    model = older.build("cpu").eval()
    model.load_state_dict(trained.model.state_dict())
    trained.spec, trained.model = older, model
    (tmp_path / "hf").mkdir()
    export_hf(trained, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["activation_function"] == "gelu"
    exported = transformers.MarianMTModel.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    source, padding, target = batch(SIZES[1])
    assert_close(their_logits(exported, source, padding, target), their_logits(reference(1), source, padding, target))
