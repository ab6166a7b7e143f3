"""BART and its descendants mBART and M2M100/NLLB in and out, against transformers (a test-only oracle): random
checkpoints of uncommon sizes import with their logits proven and export back, and, with a byte-level BPE
tokenizer trained here, translate as generate does: with BART's generation settings (a forced first token,
n-gram bans, least lengths, early stopping), and into the language `--tgt-lang` names."""

from __future__ import annotations

import functools
import json
import random
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

import xspec
from xspec.base.errors import UserError
from float32 import assert_close
from hf_runs import read_alike
from seq2seq_pairs import pair_losses

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

ROOT = Path(tempfile.mkdtemp(prefix="xspec-bart-"))
WORDS = ["the", "house", "is", "small", "big", "a", "dog", "runs", "fast", "green", "tree", "under", "we", "see",
         "it", "and", "river", "old", "new", "city", "."]
LINES = ["the house is small .", "we see a green tree under the old city", "dog", "it runs fast and the river is new",
         "a big dog and a small dog ."]


def sentences(count: int, seed: int) -> list[str]:
    draw = random.Random(seed)
    return [" ".join(draw.choice(WORDS) for _ in range(draw.randint(3, 9))) for _ in range(count)]


def save_random(model_class, config, seed: int, generation: dict, folder: Path, end_bias: float = 0.0) -> None:
    """A model of `config` whose weights but its norms' are drawn anew, wide enough that outputs vary (and its
    final_logits_bias, where it has one, with `end_bias` on the end token 2), saved into `folder` with the
    generation settings `generation`."""
    torch.manual_seed(seed)
    model = model_class(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" not in name and "layernorm" not in name:
                parameter.copy_(torch.randn_like(parameter) * 0.5)
        bias = getattr(model, "final_logits_bias", None)
        if bias is not None:
            bias.normal_()
            bias[0, 2] += end_bias
    model.generation_config = transformers.GenerationConfig(bos_token_id=0, decoder_start_token_id=2, eos_token_id=2,
                                                            pad_token_id=1, **generation)
    model.eval().save_pretrained(folder)


@functools.cache
def checkpoint(generation: str = "{}") -> Path:
    """A random BART (weights moved so that outputs vary) with BART's byte-level BPE tokenizer, trained here, and
    generation_config.json's `generation` over BART's own."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    folder = ROOT / f"bart-{len(list(ROOT.iterdir()))}"
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tokenizer.train_from_iterator(sentences(300, 0), trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")
    fast.save_pretrained(folder)
    config = transformers.BartConfig(vocab_size=tokenizer.get_vocab_size(), d_model=24, encoder_layers=2,
                                     decoder_layers=2, encoder_attention_heads=3, decoder_attention_heads=2,
                                     encoder_ffn_dim=40, decoder_ffn_dim=36, max_position_embeddings=64)
    # the end token likely enough to end some outputs early
    save_random(transformers.BartForConditionalGeneration, config, 3, {
        "forced_bos_token_id": 0, "forced_eos_token_id": 2, "max_length": 20, **json.loads(generation)}, folder,
        end_bias=2.0)
    return folder


def imported(directory: Path, out: Path) -> xspec.TrainedModel:
    from xspec.hf.importer import import_checkpoint

    import_checkpoint(directory, out, say=lambda line: None)
    return xspec.load(out, device="cpu", weights="fp32")


def test_an_import_gives_barts_logits_and_parameters_and_exports_back(tmp_path):
    from xspec.hf.export import export_hf
    from xspec.runtime.inference import load

    run = imported(checkpoint(), tmp_path / "run")
    record = json.loads((tmp_path / "run" / "import.json").read_text())
    assert record["verification"]["verified"]
    reference = transformers.BartForConditionalGeneration.from_pretrained(checkpoint()).eval()
    theirs = sum(p.numel() for p in reference.parameters()) + reference.final_logits_bias.numel()
    assert sum(p.numel() for p in run.model.parameters()) == theirs     # the positions' two unread rows too
    source = torch.randint(3, 200, (2, 11), generator=torch.Generator().manual_seed(1))
    target = torch.randint(3, 200, (2, 7), generator=torch.Generator().manual_seed(2))
    padding = torch.zeros(2, 11, dtype=torch.bool)
    padding[1, 8:] = True
    with torch.no_grad():
        expected = reference(input_ids=source, attention_mask=(~padding).long(), decoder_input_ids=target).logits
        assert_close(run.model(source, target, padding), expected)
        (tmp_path / "hf").mkdir()
        export_hf(load(tmp_path / "run", "cpu", weights="fp32"), tmp_path / "hf")
        exported = transformers.BartForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
        assert_close(exported(input_ids=source, attention_mask=(~padding).long(), decoder_input_ids=target).logits,
                     expected)


def test_a_checkpoint_of_bart_model_without_final_logits_bias_imports_with_zeros(tmp_path):
    """BartModel's checkpoints hold no final_logits_bias: transformers takes zeros, and so does the import."""
    from safetensors.torch import load_file, save_file

    directory = tmp_path / "bart"
    shutil.copytree(checkpoint(), directory)
    tensors = load_file(directory / "model.safetensors")
    del tensors["final_logits_bias"]
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    run = imported(directory, tmp_path / "run")
    assert not run.model.decoder.lm_head.bias.any()
    assert json.loads((tmp_path / "run" / "import.json").read_text())["verification"]["verified"]


def generated(directory: Path, lines: list[str]) -> list[str]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.BartForConditionalGeneration.from_pretrained(directory).eval()
    with torch.no_grad():
        outputs = model.generate(**tokenizer(lines, return_tensors="pt", padding=True))
    return tokenizer.batch_decode(outputs, skip_special_tokens=True)


@pytest.mark.parametrize("generation", [
    {"num_beams": 1},
    {"num_beams": 4, "no_repeat_ngram_size": 3, "early_stopping": True},
    {"num_beams": 3, "min_length": 8, "length_penalty": 2.0},
    {"num_beams": 1, "no_repeat_ngram_size": 2, "repetition_penalty": 1.5},
], ids=["greedy", "beam-ngrams", "beam-min-length", "greedy-penalties"])
def test_translation_is_generates_with_barts_generation_settings(tmp_path, generation):
    directory = checkpoint(json.dumps(generation, sort_keys=True))
    lines = LINES + sentences(12, 5)
    ours = imported(directory, tmp_path / "run").translate(lines)
    theirs = generated(directory, lines)
    assert ours == theirs
    assert len(set(ours)) >= 3


# --- mBART: pre-norm, and language codes ---------------------------------------------------------------

LANGUAGES = ["en_XX", "de_DE", "fr_XX"]


def multilingual_tokenizer(folder: Path, languages: list[str], template: str) -> int:
    """A byte-level BPE tokenizer.json with `languages`' codes as special tokens and the post-processor
    `template` (mBART's "$A </s> en_XX", NLLB's "eng_Latn $A </s>"), saved into `folder`; its size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(sentences(300, 0), trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.add_special_tokens([AddedToken(code, special=True) for code in languages])
    source = languages[0]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[("</s>", 2), (source, tokenizer.token_to_id(source))])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>", unk_token="<unk>")
    fast.save_pretrained(folder)
    return tokenizer.get_vocab_size()


@functools.cache
def mbart_checkpoint(generation: str = "{}") -> Path:
    """A random mBART whose tokenizer.json ends each source with `</s> en_XX` (its language codes added tokens)."""
    folder = ROOT / f"mbart-{len(list(ROOT.iterdir()))}"
    size = multilingual_tokenizer(folder, LANGUAGES, "$A </s> en_XX")
    config = transformers.MBartConfig(vocab_size=size, d_model=32, encoder_layers=2,
                                      decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=2,
                                      encoder_ffn_dim=40, decoder_ffn_dim=24, max_position_embeddings=64,
                                      scale_embedding=True)
    save_random(transformers.MBartForConditionalGeneration, config, 4,
                {"forced_eos_token_id": 2, "max_length": 16, **json.loads(generation)}, folder)
    return folder


def test_an_mbart_import_gives_its_logits(tmp_path):
    run = imported(mbart_checkpoint(), tmp_path / "run")
    assert json.loads((tmp_path / "run" / "import.json").read_text())["verification"]["verified"]
    reference = transformers.MBartForConditionalGeneration.from_pretrained(mbart_checkpoint()).eval()
    source = torch.randint(3, 200, (2, 9), generator=torch.Generator().manual_seed(1))
    target = torch.randint(3, 200, (2, 6), generator=torch.Generator().manual_seed(2))
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[0, 5:] = True
    with torch.no_grad():
        assert_close(run.model(source, target, padding), reference(input_ids=source, attention_mask=(~padding).long(),
                                                                   decoder_input_ids=target).logits)


def translated_into(code: str, directory: Path, hf_class, lines: list[str], tmp_path: Path,
                    capsys) -> tuple[list[str], list[str]]:
    """(`xspec translate --tgt-lang code`'s lines, generate's with the code's token forced first) of the checkpoint
    `directory`, imported into tmp_path/run."""
    from xspec.cli import main
    from xspec.hf.importer import import_checkpoint

    import_checkpoint(directory, tmp_path / "run", say=lambda line: None)
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    assert main(["translate", str(tmp_path / "run"), "--tgt-lang", code, "-i", str(tmp_path / "in.txt")]) == 0
    ours = capsys.readouterr().out.splitlines()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = hf_class.from_pretrained(directory).eval()
    with torch.no_grad():
        outputs = model.generate(**tokenizer(lines, return_tensors="pt", padding=True),
                                 forced_bos_token_id=tokenizer.convert_tokens_to_ids(code))
    return ours, tokenizer.batch_decode(outputs, skip_special_tokens=True)


@pytest.mark.parametrize("generation", [{"num_beams": 1}, {"num_beams": 3, "no_repeat_ngram_size": 2}],
                         ids=["greedy", "beam"])
def test_tgt_lang_forces_an_mbart_outputs_first_token_as_generate_does(tmp_path, capsys, generation):
    """`--tgt-lang de_DE`: the output's first token is the code's (generate's forced_bos_token_id), the source
    ending as the tokenizer ends it (`</s> en_XX`)."""
    from xspec.cli import main

    ours, theirs = translated_into("de_DE", mbart_checkpoint(json.dumps(generation, sort_keys=True)),
                                   transformers.MBartForConditionalGeneration, LINES + sentences(8, 6), tmp_path,
                                   capsys)
    assert ours == theirs and len(set(ours)) >= 3
    assert main(["translate", str(tmp_path / "run"), "--tgt-lang", "xx_YY", "-i", str(tmp_path / "in.txt")]) == 1
    assert "--tgt-lang xx_YY: " in capsys.readouterr().err


NLLB_LANGUAGES = ["eng_Latn", "deu_Latn", "fra_Latn"]


@functools.cache
def nllb_checkpoint(generation: str = "{}") -> Path:
    """A random M2M100 as NLLB-200's are: a tokenizer.json starting each source with `eng_Latn`, LayerDrop set."""
    folder = ROOT / f"nllb-{len(list(ROOT.iterdir()))}"
    size = multilingual_tokenizer(folder, NLLB_LANGUAGES, "eng_Latn $A </s>")
    config = transformers.M2M100Config(vocab_size=size, d_model=24, encoder_layers=1, decoder_layers=2,
                                       encoder_attention_heads=2, decoder_attention_heads=3, encoder_ffn_dim=40,
                                       decoder_ffn_dim=28, max_position_embeddings=64, encoder_layerdrop=0.05,
                                       decoder_layerdrop=0.05)
    save_random(transformers.M2M100ForConditionalGeneration, config, 5, {"max_length": 16, **json.loads(generation)},
                folder)
    return folder


def test_an_nllb_import_gives_its_logits_and_exports_back(tmp_path):
    from xspec.hf.export import export_hf
    from xspec.runtime.inference import load

    run = imported(nllb_checkpoint(), tmp_path / "run")
    record = json.loads((tmp_path / "run" / "import.json").read_text())
    assert record["verification"]["verified"]
    assert "LayerDrop" in record["not_architectural"]["encoder_layerdrop"]
    reference = transformers.M2M100ForConditionalGeneration.from_pretrained(nllb_checkpoint()).eval()
    assert sum(p.numel() for p in run.model.parameters()) == sum(p.numel() for p in reference.parameters())
    source = torch.randint(3, 200, (2, 9), generator=torch.Generator().manual_seed(1))
    target = torch.randint(3, 200, (2, 6), generator=torch.Generator().manual_seed(2))
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[0, 6:] = True
    with torch.no_grad():     # the padded source's pads at the end: transformers' positions count no pads
        expected = reference(input_ids=source.masked_fill(padding, 1), attention_mask=(~padding).long(),
                             decoder_input_ids=target).logits
        assert_close(run.model(source, target, padding), expected)
        (tmp_path / "hf").mkdir()
        export_hf(load(tmp_path / "run", "cpu", weights="fp32"), tmp_path / "hf")
        exported = transformers.M2M100ForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
        assert_close(exported(input_ids=source.masked_fill(padding, 1), attention_mask=(~padding).long(),
                              decoder_input_ids=target).logits, expected)


@pytest.mark.parametrize("generation", [{"num_beams": 1}, {"num_beams": 4, "length_penalty": 1.2}],
                         ids=["greedy", "beam"])
def test_tgt_lang_translates_an_nllb_model_as_generate_does(tmp_path, capsys, generation):
    ours, theirs = translated_into("fra_Latn", nllb_checkpoint(json.dumps(generation, sort_keys=True)),
                                   transformers.M2M100ForConditionalGeneration, LINES + sentences(8, 7), tmp_path,
                                   capsys)
    assert ours == theirs and len(set(ours)) >= 3


# --- M2M100's own tokenizer: sentencepiece.bpe.model and vocab.json -------------------------------------

M2M100_LANGUAGES = ["en", "ha", "is", "ja", "cs", "ru", "zh", "de"]      # language_codes "wmt21"


@functools.cache
def m2m100_checkpoint(generation: str = "{}") -> Path:
    """A random M2M100 with its tokenizer as facebook/m2m100_418M ships it: a sentencepiece BPE model, vocab.json
    in fairseq's order (<s> <pad> </s> <unk> first), the language codes after it, listed as special tokens."""
    import sentencepiece as spm

    folder = ROOT / f"m2m100-{len(list(ROOT.iterdir()))}"
    folder.mkdir()
    text = ROOT / "m2m100-text.txt"
    text.write_text("\n".join(sentences(300, 3)) + "\n")
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(folder / "sentencepiece.bpe"), vocab_size=60,
                                   model_type="bpe", character_coverage=1.0, minloglevel=2)
    processor = spm.SentencePieceProcessor(model_file=str(folder / "sentencepiece.bpe.model"))
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for piece in map(processor.id_to_piece, range(processor.get_piece_size())):
        vocab.setdefault(piece, len(vocab))
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "M2M100Tokenizer", "language_codes": "wmt21", "src_lang": None, "tgt_lang": None,
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>", "sep_token": "</s>",
        "num_madeup_words": 8, "additional_special_tokens": [f"__{code}__" for code in M2M100_LANGUAGES]}))
    config = transformers.M2M100Config(vocab_size=len(vocab) + len(M2M100_LANGUAGES) + 8, d_model=24,
                                       encoder_layers=2, decoder_layers=1, encoder_attention_heads=3,
                                       decoder_attention_heads=2, encoder_ffn_dim=36, decoder_ffn_dim=20,
                                       max_position_embeddings=64)
    save_random(transformers.M2M100ForConditionalGeneration, config, 6, {"max_length": 16, **json.loads(generation)},
                folder)
    return folder


def test_an_m2m100_tokenizer_is_read_as_m2m100_tokenizer_reads_it_and_exported_back(tmp_path):
    """Sources `__en__ x </s>` (src_lang's code, "en" where none is named, or --src-lang's), targets in their
    language's code, language codes in a text one token, decoding without the special tokens: M2M100Tokenizer's
    ids and texts. An export writes the two files back, and AutoTokenizer reads them to the same ids."""
    from xspec.hf.export import export_hf
    from xspec.runtime.inference import load

    run = imported(m2m100_checkpoint(), tmp_path / "run")
    theirs = transformers.AutoTokenizer.from_pretrained(m2m100_checkpoint())
    lines = [*LINES, "the __de__ word </s> zebra", "  two  spaces ", ""]
    ids = read_alike(run.tokenizer, theirs, lines)
    theirs.src_lang, theirs.tgt_lang = "ja", "de"
    ja, de = (run.tokenizer.language_code(code) for code in ("ja", "__de__"))
    assert run.tokenizer.encode_sources(lines, ja) == theirs(lines)["input_ids"]
    assert run.tokenizer.encode_targets(lines, de) == theirs(text_target=lines)["input_ids"]
    (tmp_path / "hf").mkdir()
    export_hf(load(tmp_path / "run", "cpu", weights="fp32"), tmp_path / "hf")
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")(lines)["input_ids"] == ids


@pytest.mark.parametrize("generation", [{"num_beams": 1}, {"num_beams": 3}], ids=["greedy", "beam"])
def test_tgt_lang_translates_an_m2m100_model_as_generate_does(tmp_path, capsys, generation):
    """`--tgt-lang de` (or `__de__`): the code's id forced first, as the translation pipeline's forced_bos_token_id."""
    from xspec.cli import main

    ours, theirs = translated_into("__de__", m2m100_checkpoint(json.dumps(generation, sort_keys=True)),
                                   transformers.M2M100ForConditionalGeneration, LINES + sentences(8, 8), tmp_path,
                                   capsys)
    assert ours == theirs and len(set(ours)) >= 3
    assert main(["translate", str(tmp_path / "run"), "--tgt-lang", "de", "-i", str(tmp_path / "in.txt")]) == 0
    assert capsys.readouterr().out.splitlines() == ours
    assert main(["translate", str(tmp_path / "run"), "--tgt-lang", "fr", "-i", str(tmp_path / "in.txt")]) == 1
    assert "--tgt-lang fr: " in capsys.readouterr().err


def test_fine_tuning_an_m2m100_frames_its_pairs_as_transformers_does(tmp_path):
    """Sources `__en__ x </s>`, labels `__de__ y </s>` after the decoder start token: the same loss."""
    trained = imported(m2m100_checkpoint(), tmp_path / "run")
    tokenizer = transformers.AutoTokenizer.from_pretrained(m2m100_checkpoint(), src_lang="en", tgt_lang="de")
    model = transformers.M2M100ForConditionalGeneration.from_pretrained(m2m100_checkpoint())
    assert_close(*pair_losses(trained, tokenizer, model, LINES, LINES[::-1], tmp_path,
                              trained.tokenizer.language_code("de")))


@pytest.mark.parametrize("change, message", [
    ({"language_codes": "m2m50"}, "tokenizer_config.json: language_codes \"m2m50\" is not supported (supported: "
                                  "m2m100, wmt21)"),
    ({"language_codes": ["en"]}, "tokenizer_config.json: language_codes [\"en\"] is not supported"),
    ({"src_lang": "fr"}, "tokenizer_config.json: src_lang \"fr\" is not one of the language codes of language_codes "
                         "\"wmt21\""),
    ({"additional_special_tokens": ["<new>"]}, "the special token \"<new>\" is neither in vocab.json nor a language "
                                               "code"),
    ({"vocab.json": {"<unk>": 0, "a": 2}}, "vocab.json: its ids are not 0 to 1 once each"),
    ({"vocab.json": {"<unk>": 0}}, "vocab.json has no </s>, which ends every text"),
])
def test_m2m100s_tokenizer_files_and_settings_that_do_not_hold_are_refused_by_name(tmp_path, change, message):
    from xspec.hf.importer import import_checkpoint

    directory = tmp_path / "m2m100"
    shutil.copytree(m2m100_checkpoint(), directory)
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    vocab = change.pop("vocab.json", None)
    (directory / "tokenizer_config.json").write_text(json.dumps({**settings, **change}))
    if vocab is not None:
        (directory / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(UserError) as refused:
        import_checkpoint(directory, tmp_path / "run", say=lambda line: None)
    assert message in str(refused.value)


def tuned(run: Path, tmp_path: Path, *flags: str) -> int:
    """`train --init run` on LINES paired with themselves reversed, with `flags`; its exit status."""
    from xspec.cli import main

    for split, lines in (("train", LINES * 8), ("valid", LINES)):
        (tmp_path / f"{split}.src").write_text("\n".join(lines) + "\n")
        (tmp_path / f"{split}.tgt").write_text("\n".join(" ".join(line.split()[::-1]) for line in lines) + "\n")
    return main(["train", "--init", str(run), "--train-src", str(tmp_path / "train.src"), "--train-tgt",
                 str(tmp_path / "train.tgt"), "--valid-src", str(tmp_path / "valid.src"), "--valid-tgt",
                 str(tmp_path / "valid.tgt"), "-o", str(tmp_path / "tuned"), "--no-test", "--no-tensorboard",
                 "--no-progress", "--set", "train.epochs=6", "--set", "train.validate_every_steps=3",
                 "--set", "train.lr=0.003", "--set", "train.warmup_fraction=0.01", "--set", "train.batch_tokens=400",
                 *flags])


@pytest.mark.parametrize("model, flags, message", [
    ("nllb", (), "frames a text with a language code (NLLB's starts it with one), which a target takes in its own "
                 "language: give it with --tgt-lang CODE"),
    ("nllb", ("--tgt-lang", "xxx_Latn"), "--tgt-lang xxx_Latn: "),
    ("mbart", (), "frames a text with a language code (mBART's ends it with one)"),
])
def test_fine_tuning_a_multilingual_model_needs_the_targets_language_and_a_code_it_can_frame(tmp_path, capfd,
                                                                                             model, flags, message):
    from xspec.hf.importer import import_checkpoint

    import_checkpoint(nllb_checkpoint() if model == "nllb" else mbart_checkpoint(), tmp_path / "run",
                      say=lambda line: None)
    capfd.readouterr()
    assert tuned(tmp_path / "run", tmp_path, *flags) == 1
    assert message in capfd.readouterr().err


@pytest.mark.parametrize("model", ["nllb", "mbart"])
def test_fine_tuning_frames_targets_in_their_language_as_transformers_does(tmp_path, model):
    """Pairs with --tgt-lang: NLLB's sources `eng_Latn x </s>`, labels `fra_Latn y </s>` after the decoder start
    token (</s>), as NllbTokenizer's text_target and M2M100's shift_tokens_right make them; mBART's sources
    `x </s> en_XX`, labels `y </s> de_DE`, the decoder's input starting from the code, as MBartTokenizer and
    its shift_tokens_right make them: the same loss. `train --init --tgt-lang` then learns with falling loss,
    its translations starting in that language."""
    from xspec.runtime.corpus import ParallelText
    from xspec.runtime.tasks.translation import Translation

    directory, code = (nllb_checkpoint(), "fra_Latn") if model == "nllb" else (mbart_checkpoint(), "de_DE")
    trained = imported(directory, tmp_path / "run")
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    language = tokenizer.convert_tokens_to_ids(code)
    task = Translation(trained.spec.with_overrides({"decode.forced_bos": language}))
    targets = LINES[::-1]
    task.texts = {"train": ParallelText(LINES, targets, list(range(1, len(LINES) + 1)), tmp_path)}
    batch = task.encode(trained.tokenizer, truncate=False).train.collate(list(range(len(LINES))))
    src, tgt_in, padding = batch.inputs
    hf_class = transformers.M2M100ForConditionalGeneration if model == "nllb" else \
        transformers.MBartForConditionalGeneration
    reference = hf_class.from_pretrained(directory).eval()
    inputs = tokenizer(LINES, return_tensors="pt", padding=True)
    words, end = tokenizer(targets, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id
    labels = [[language, *ids, end] if model == "nllb" else [*ids, end, language] for ids in words]
    longest = max(map(len, labels))
    inputs["labels"] = torch.tensor([ids + [tokenizer.pad_token_id] * (longest - len(ids)) for ids in labels])
    with torch.no_grad():
        theirs = reference(**inputs, decoder_input_ids=None).logits
        shifted = inputs["labels"].masked_fill(inputs["labels"] == tokenizer.pad_token_id, -100)
        expected = torch.nn.functional.cross_entropy(theirs.flatten(0, 1), shifted.flatten(), ignore_index=-100)
        ours = torch.nn.functional.cross_entropy(trained.model(src, tgt_in, padding).flatten(0, 1),
                                                 batch.labels.flatten(), ignore_index=-100)
        assert_close(ours, expected)
    source = "deu_Latn" if model == "nllb" else "fr_XX"     # --src-lang: kept as decode.source_code
    assert tuned(tmp_path / "run", tmp_path, "--tgt-lang", code, "--src-lang", source) == 0
    valid = [json.loads(line)["valid_loss"] for line in (tmp_path / "tuned" / "metrics.jsonl").read_text().splitlines()
             if "valid_loss" in line]
    assert len(valid) == 2 and valid[1] < valid[0]
    decode = xspec.load(tmp_path / "tuned", device="cpu").spec.decode
    assert (decode.forced_bos, decode.source_code) == (language, tokenizer.convert_tokens_to_ids(source))


@pytest.mark.parametrize("model", ["nllb", "mbart"])
def test_src_lang_frames_sources_in_their_language_as_the_tokenizer_does_for_generate(tmp_path, capsys, model):
    """`translate --src-lang`: each source framed with that language's code in place of the one the tokenizer
    was saved with (NllbTokenizer's and MBartTokenizer's src_lang), generate's text on the same inputs."""
    from xspec.cli import main
    from xspec.hf.importer import import_checkpoint

    directory, source, target, hf_class = \
        (nllb_checkpoint(), "deu_Latn", "fra_Latn", transformers.M2M100ForConditionalGeneration) if model == "nllb" \
        else (mbart_checkpoint(), "fr_XX", "de_DE", transformers.MBartForConditionalGeneration)
    import_checkpoint(directory, tmp_path / "run", say=lambda line: None)
    lines = LINES + sentences(6, 9)
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    assert main(["translate", str(tmp_path / "run"), "--src-lang", source, "--tgt-lang", target, "-i",
                 str(tmp_path / "in.txt")]) == 0
    ours = capsys.readouterr().out.splitlines()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    code, end = tokenizer.convert_tokens_to_ids(source), tokenizer.eos_token_id
    words = tokenizer(lines, add_special_tokens=False)["input_ids"]
    framed = [[code, *ids, end] if model == "nllb" else [*ids, end, code] for ids in words]
    longest = max(map(len, framed))
    pad = tokenizer.pad_token_id
    inputs = torch.tensor([ids + [pad] * (longest - len(ids)) for ids in framed])
    with torch.no_grad():
        outputs = hf_class.from_pretrained(directory).eval().generate(
            input_ids=inputs, attention_mask=(inputs != pad).long(),
            forced_bos_token_id=tokenizer.convert_tokens_to_ids(target))
    assert ours == tokenizer.batch_decode(outputs, skip_special_tokens=True)
    assert main(["translate", str(tmp_path / "run"), "--tgt-lang", target, "-i", str(tmp_path / "in.txt")]) == 0
    assert capsys.readouterr().out.splitlines() != ours      # the source's code changes the translations


def test_fine_tuning_bart_frames_its_pairs_as_transformers_does(tmp_path):
    """BART's sources are `<s> x </s>`, its labels `<s> y </s>` after the decoder start: the same loss."""
    trained = imported(checkpoint(), tmp_path / "run")
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint())
    model = transformers.BartForConditionalGeneration.from_pretrained(checkpoint())
    assert_close(*pair_losses(trained, tokenizer, model, LINES, LINES[::-1], tmp_path))


def test_eval_scores_an_nllb_models_translations_into_the_target_language(tmp_path, capsys):
    """`xspec eval --tgt-lang` scores the translations `xspec translate --tgt-lang` writes."""
    from xspec.cli import main
    from xspec.hf.importer import import_checkpoint

    import_checkpoint(nllb_checkpoint(), tmp_path / "run", say=lambda line: None)
    (tmp_path / "src.txt").write_text("\n".join(LINES) + "\n")
    assert main(["translate", str(tmp_path / "run"), "--tgt-lang", "deu_Latn", "-i", str(tmp_path / "src.txt"),
                 "-o", str(tmp_path / "hyp.txt")]) == 0
    (tmp_path / "ref.txt").write_bytes((tmp_path / "hyp.txt").read_bytes())
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--tgt-lang", "deu_Latn", "--src", str(tmp_path / "src.txt"),
                 "--ref", str(tmp_path / "ref.txt"), "--no-progress"]) == 0
    bleu = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("BLEU"))
    assert bleu.split(" = ")[1].startswith("100.00")     # the references are those translations
