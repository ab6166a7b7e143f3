"""BERT, RoBERTa and ModernBERT in and out: random masked-LM checkpoints of uncommon sizes written by transformers
(a test-only oracle) import with their logits proven and equal parameters, export back to the same logits, set
aside what pretraining checkpoints hold beside the masked-LM class, and fill masks as the fill-mask pipeline
does."""

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
from toy_text import WORDS

transformers = pytest.importorskip("transformers")

CHECKPOINTS = Checkpoints("xspec-bert-", lambda i: reference(i), lambda i: f"{SIZES[i][0]}-{i}")
ROOT = CHECKPOINTS.root
saved, imported = CHECKPOINTS.saved, CHECKPOINTS.imported
# Uncommon sizes: heads of 8 and 5 features, each activation the head may use, three token types.
SIZES = [
    ("bert", dict(vocab_size=61, hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=40,
                  max_position_embeddings=40)),
    ("bert", dict(vocab_size=47, hidden_size=20, num_hidden_layers=1, num_attention_heads=4, intermediate_size=28,
                  max_position_embeddings=33, type_vocab_size=3, hidden_act="gelu_new", tie_word_embeddings=False)),
    ("roberta", dict(vocab_size=58, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=36,
                     max_position_embeddings=42, type_vocab_size=1, pad_token_id=1)),
    # local windows shorter than the texts (4 positions either side), the tanh GELU, every bias but the head's
    ("modernbert", dict(vocab_size=61, hidden_size=24, intermediate_size=40, num_hidden_layers=4, num_attention_heads=3,
                        max_position_embeddings=64, local_attention=8, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                        cls_token_id=1, sep_token_id=2, hidden_activation="gelu_pytorch_tanh")),
    ("modernbert", dict(vocab_size=45, hidden_size=24, intermediate_size=28, num_hidden_layers=3, num_attention_heads=4,
                        max_position_embeddings=40, local_attention=6, pad_token_id=0, bos_token_id=1,
                        eos_token_id=2, cls_token_id=1, sep_token_id=2, norm_bias=True,
                        attention_bias=True, mlp_bias=True, classifier_bias=True, decoder_bias=False,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5000.0},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}})),
]
CLASSES = {"bert": ("BertConfig", "BertForMaskedLM"), "roberta": ("RobertaConfig", "RobertaForMaskedLM"),
           "modernbert": ("ModernBertConfig", "ModernBertForMaskedLM")}


def model_class(index: int):
    return getattr(transformers, CLASSES[SIZES[index][0]][1])


def reference(index: int):
    kind, sizes = SIZES[index]
    torch.manual_seed(index)
    model = model_class(index)(getattr(transformers, CLASSES[kind][0])(**sizes))
    with torch.no_grad():   # transformers' initialization gives near-zero logits: move every weight
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    return model.eval()


def batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two texts, the second padded, no token the padding id (RoBERTa's 1, BERT's 0)."""
    draw = torch.Generator().manual_seed(5)
    tokens = torch.randint(2, vocab, (2, 19), generator=draw)
    padding = torch.zeros(2, 19, dtype=torch.bool)
    padding[1, 12:] = True
    return tokens, padding


def their_logits(model, tokens, padding) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens, attention_mask=(~padding).long()).logits


@pytest.mark.parametrize("index", range(len(SIZES)), ids=lambda i: f"{SIZES[i][0]}-{i}")
def test_an_import_gives_the_masked_lm_logits_with_its_parameters(index):
    run = imported(index)
    record = json.loads((run / "import.json").read_text())
    assert record["verification"]["verified"] and record["verification"]["max_abs_logit_difference"] < 1e-4
    model = xspec.load(run, device="cpu", weights="fp32").model
    original = reference(index)
    tokens, padding = batch(SIZES[index][1]["vocab_size"])
    with torch.no_grad():
        ours = model(tokens, padding)
    assert_close(ours[~padding], their_logits(original, tokens, padding)[~padding])
    # untied, transformers keeps the head's bias beside the projection's own, which its forward adds
    unused = 0 if SIZES[index][1].get("tie_word_embeddings", True) else SIZES[index][1]["vocab_size"]
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in original.parameters()) - unused


@pytest.mark.parametrize("index", [0, 1], ids=lambda i: f"{SIZES[i][0]}-{i}")
def test_an_imported_bert_reads_each_positions_token_type_as_transformers_does(index):
    """Given token types (a sentence pair's), each position adds its type's row; without them, the first
    type's, as transformers' zeros do."""
    model = xspec.load(imported(index), device="cpu", weights="fp32").model
    tokens, padding = batch(SIZES[index][1]["vocab_size"])
    types = torch.randint(0, SIZES[index][1].get("type_vocab_size", 2), tokens.shape,
                          generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ours = model(tokens, padding, types)
        theirs = reference(index)(input_ids=tokens, attention_mask=(~padding).long(), token_type_ids=types).logits
        assert_close(ours[~padding], theirs[~padding])
        assert_close(model(tokens, padding), model(tokens, padding, torch.zeros_like(types)))
        assert not torch.allclose(ours[~padding], model(tokens, padding)[~padding])


@pytest.mark.parametrize("index", range(len(SIZES)), ids=lambda i: f"{SIZES[i][0]}-{i}")
def test_an_import_exports_back_to_the_same_logits(index, tmp_path):
    from xspec.hf.export import export_hf
    from xspec.runtime.inference import load

    (tmp_path / "hf").mkdir()
    export_hf(load(imported(index), "cpu", weights="fp32"), tmp_path / "hf")
    exported = model_class(index).from_pretrained(tmp_path / "hf").eval()
    tokens, padding = batch(SIZES[index][1]["vocab_size"])
    assert_close(their_logits(exported, tokens, padding), their_logits(reference(index), tokens, padding))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert {k: config[k] for k in SIZES[index][1]} == SIZES[index][1]


def with_tensors(tmp_path: Path, **extra: torch.Tensor) -> Path:
    from safetensors.torch import load_file, save_file

    directory = tmp_path / "bert"
    directory.mkdir()
    (directory / "config.json").write_bytes((saved(0) / "config.json").read_bytes())
    tensors = load_file(saved(0) / "model.safetensors")
    save_file({**tensors, **{k.replace("__", "."): v for k, v in extra.items()}}, directory / "model.safetensors",
              metadata={"format": "pt"})
    return directory


def test_what_a_pretraining_checkpoint_holds_beside_the_masked_lm_is_set_aside(tmp_path):
    """bert-base-*'s checkpoints are BertForPreTraining's: the pooler and the next-sentence head, which the
    masked-LM class does not read, and copies of the tied projection and its bias."""
    from xspec.hf.importer import import_checkpoint

    original = reference(0)
    kept = with_tensors(tmp_path, bert__pooler__dense__weight=torch.randn(24, 24),
                        bert__pooler__dense__bias=torch.randn(24), cls__seq_relationship__weight=torch.randn(2, 24),
                        cls__seq_relationship__bias=torch.randn(2),
                        bert__embeddings__position_ids=torch.arange(40)[None],
                        cls__predictions__decoder__weight=original.bert.embeddings.word_embeddings.weight.detach(),
                        cls__predictions__decoder__bias=original.cls.predictions.bias.detach())
    import_checkpoint(kept, tmp_path / "run", say=lambda line: None)
    assert json.loads((tmp_path / "run" / "import.json").read_text())["verification"]["verified"]
    with pytest.raises(UserError, match=re.escape("cls.predictions.decoder.bias differs from cls.predictions.bias")):
        (tmp_path / "b").mkdir()
        import_checkpoint(with_tensors(tmp_path / "b", cls__predictions__decoder__bias=torch.zeros(61)),
                          tmp_path / "run-b", say=lambda line: None)


@pytest.mark.parametrize("change, message", [
    ({"position_embedding_type": "relative_key"}, 'position_embedding_type "relative_key" is not supported '
                                                  '(supported: absolute)'),
    ({"hidden_act": "tanh"}, 'hidden_act "tanh" is not supported (supported: gelu, gelu_new, gelu_pytorch_tanh, '
                             'relu, silu, swish)'),
    ({"is_decoder": True}, "is_decoder true is not supported (supported: false)"),
    ({"architectures": ["BertForSequenceClassification"], "problem_type": "multi_label_classification"},
     'problem_type "multi_label_classification" is not supported (supported: null, single_label_classification) '
     '(one class a text, a softmax over them)'),
    ({"architectures": ["BertForSequenceClassification"], "id2label": {"0": "a", "2": "c"}},
     "id2label's keys are not the classes 0 to 1"),
])
def test_a_config_the_spec_does_not_compute_is_refused_by_key(tmp_path, change, message):
    from xspec.hf.importer import import_checkpoint

    directory = CHECKPOINTS.with_config(0, tmp_path / "bert", change)
    with pytest.raises(UserError, match=re.escape(f"{directory}/config.json: {message}")):
        import_checkpoint(directory, tmp_path / "run", say=lambda line: None)


# --- filling masks -------------------------------------------------------------------------------------------


@functools.cache
def with_tokenizer(kind: str = "bert") -> Path:
    """A masked LM with its tokenizer as transformers writes one: BERT's WordPiece of a vocab.txt (with
    [MASK]), or RoBERTa's byte-level BPE trained here (with <mask>)."""
    folder = ROOT / f"{kind}-with-tokenizer"
    if kind == "bert":
        vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s", "##ing", ".", ","]
        (ROOT / "vocab.txt").write_text("\n".join(vocab) + "\n")
        tokenizer = transformers.BertTokenizer(str(ROOT / "vocab.txt"))
        config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=48, max_position_embeddings=64)
    else:
        from tokenizers import ByteLevelBPETokenizer

        trainer = ByteLevelBPETokenizer()
        trainer.train_from_iterator([" ".join(WORDS)] * 20, vocab_size=300,
                                    special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
        trainer.save_model(str(ROOT))
        tokenizer = transformers.RobertaTokenizer(str(ROOT / "vocab.json"), str(ROOT / "merges.txt"))
        config = transformers.RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                            num_attention_heads=4, intermediate_size=48, max_position_embeddings=66,
                                            pad_token_id=1, bos_token_id=0, eos_token_id=2)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(3)
    model = getattr(transformers, CLASSES[kind][1])(config)
    return saved_moved(model, folder)


def saved_moved(model, folder: Path, tokenizer: Path | None = None) -> Path:
    """`model` saved into `folder` with every weight moved (transformers' initialization gives near-zero
    logits), and the tokenizer of the checkpoint `tokenizer` beside it."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    model.eval().save_pretrained(folder)
    if tokenizer is not None:
        transformers.AutoTokenizer.from_pretrained(tokenizer).save_pretrained(folder)
    return folder


TEXTS = {"bert": ["the [MASK] is small.", "we see a green [MASK] under the old city", "[MASK] dog runs fast",
                  "the [MASK] and the [MASK] are big."],
         "roberta": ["the<mask> is small", "we see a green<mask> under the old city", "<mask> dog runs fast",
                     "the<mask> and the<mask> are big"]}


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_fill_gives_the_fill_mask_pipelines_candidates(tmp_path, kind):
    from xspec.hf.importer import import_checkpoint
    from xspec.runtime.fill import fill_masks

    import_checkpoint(with_tokenizer(kind), tmp_path / "run", say=lambda line: None)
    trained = xspec.load(tmp_path / "run", device="cpu", weights="fp32")
    pipeline = transformers.pipeline("fill-mask", model=str(with_tokenizer(kind)), device="cpu")
    for text, masks in zip(TEXTS[kind], fill_masks(trained, TEXTS[kind], top_k=4)):
        theirs = pipeline(text, top_k=4)
        theirs = [theirs] if isinstance(theirs[0], dict) else theirs
        assert [[(c.token, c.token_str, c.sequence) for c in mask] for mask in masks] == \
            [[(c["token"], c["token_str"], c["sequence"]) for c in mask] for mask in theirs]
        assert [c.score for mask in masks for c in mask] == \
            pytest.approx([c["score"] for mask in theirs for c in mask], abs=1e-5)


def vocab_only(tmp_path: Path, settings: dict) -> Path:
    """The masked LM as many BERT checkpoints ship: vocab.txt and tokenizer_config.json, no tokenizer.json."""
    directory = tmp_path / "vocab-only"
    shutil.copytree(with_tokenizer(), directory)
    (directory / "tokenizer.json").unlink()
    shutil.copy(ROOT / "vocab.txt", directory / "vocab.txt")
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", **settings}))
    return directory


@pytest.mark.parametrize("settings", [{}, {"do_lower_case": False, "strip_accents": False},
                                      {"tokenize_chinese_chars": False, "strip_accents": True}])
def test_a_vocab_txt_alone_is_read_as_transformers_reads_it(tmp_path, settings):
    """Without tokenizer.json, vocab.txt with tokenizer_config.json's settings gives BertTokenizer's ids, a fill
    the pipeline's, and an export the tokenizer.json transformers made of it."""
    from xspec.hf.export import export_hf
    from xspec.hf.importer import import_checkpoint
    from xspec.runtime.fill import fill_masks
    from xspec.runtime.inference import load

    directory = vocab_only(tmp_path, settings)
    imported = import_checkpoint(directory, tmp_path / "run", say=lambda line: None)
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    lines = [*TEXTS["bert"], "The Green CITY, runs.", "naïve café 中文 ①", "  spaces\tand\x00 tabs ", ""]
    ids = read_alike(imported.tokenizer, theirs, lines)
    pipeline = transformers.pipeline("fill-mask", model=str(directory), device="cpu")
    trained = xspec.load(tmp_path / "run", device="cpu", weights="fp32")
    ours = fill_masks(trained, TEXTS["bert"][:1], top_k=3)[0][0]
    assert [(c.token, c.sequence) for c in ours] == [(c["token"], c["sequence"]) for c in pipeline(TEXTS["bert"][0],
                                                                                                 top_k=3)]
    (tmp_path / "hf").mkdir()
    export_hf(load(tmp_path / "run", "cpu", weights="fp32"), tmp_path / "hf")
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")(lines)["input_ids"] == ids


@pytest.mark.parametrize("settings, vocab, message", [
    ({}, b"\xff\xfe[PAD]\n", "vocab.txt: not UTF-8 text (byte 0)"),
    ({}, b"", "vocab.txt: empty, not a WordPiece vocabulary (a token a line)"),
    ({}, b"[PAD]\nthe\n", "vocab.txt: has no [UNK], which every word it cannot split becomes"),
    ({"unk_token": "<unk>"}, None, "vocab.txt: has no <unk>"),
    ({"do_lower_case": "yes"}, None, "tokenizer_config.json: do_lower_case \"yes\" is not true or false"),
    ({"mask_token": ["[MASK]"]}, None, "tokenizer_config.json: mask_token [\"[MASK]\"] is not a token"),
    ({"added_tokens_decoder": {"0": {"content": "[MASK]", "special": True}}}, None,
     "tokenizer_config.json: added_tokens_decoder[\"0\"] \"[MASK]\": the vocabulary gives it id 4"),
    ({"added_tokens_decoder": {"x1": {"content": "[MASK]"}}}, None,
     "tokenizer_config.json: added_tokens_decoder[\"x1\"]: not a token id"),
    ({"added_tokens_decoder": {"4": {"content": "[MASK]", "special": "yes"}}}, None,
     "tokenizer_config.json: added_tokens_decoder[\"4\"]: not a token"),
])
def test_a_vocab_txt_or_its_settings_that_do_not_hold_are_refused_by_file_and_key(tmp_path, settings, vocab, message):
    from xspec.hf.importer import import_checkpoint

    directory = vocab_only(tmp_path, settings)
    if vocab is not None:
        (directory / "vocab.txt").write_bytes(vocab)
    with pytest.raises(UserError, match=re.escape(message)):
        import_checkpoint(directory, tmp_path / "run", say=lambda line: None)


def merges_only(tmp_path: Path, settings: dict) -> Path:
    """The RoBERTa masked LM as older checkpoints ship it: vocab.json, merges.txt and tokenizer_config.json."""
    directory = tmp_path / "merges-only"
    shutil.copytree(with_tokenizer("roberta"), directory)
    (directory / "tokenizer.json").unlink()
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(ROOT / name, directory / name)
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    return directory


@pytest.mark.parametrize("settings", [{"tokenizer_class": "RobertaTokenizer"}, {},
                                      {"tokenizer_class": "BartTokenizer", "add_prefix_space": True}])
def test_vocab_json_and_merges_txt_alone_are_read_as_transformers_reads_them(tmp_path, settings):
    """Without tokenizer.json, RoBERTa's (and BART's) vocab.json and merges.txt give RobertaTokenizer's ids,
    pairs and texts, and a fill the pipeline's; config.json's model_type names the class where the settings do
    not."""
    from xspec.hf.importer import import_checkpoint
    from xspec.runtime.fill import fill_masks

    directory = merges_only(tmp_path, settings)
    imported = import_checkpoint(directory, tmp_path / "run", say=lambda line: None)
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    lines = [*TEXTS["roberta"], "The Green CITY, runs.", "naïve café 中文 ①", "  spaces\tand tabs ", ""]
    read_alike(imported.tokenizer, theirs, lines)
    first, second = imported.tokenizer.encode(["a small dog"])[0], imported.tokenizer.encode(["the city"])[0]
    assert imported.tokenizer.pair_template().frame(first, second, 64)[0] == \
        theirs("a small dog", "the city")["input_ids"]
    pipeline = transformers.pipeline("fill-mask", model=str(directory), device="cpu")
    ours = fill_masks(xspec.load(tmp_path / "run", device="cpu", weights="fp32"), TEXTS["roberta"][:1], top_k=3)[0][0]
    assert [(c.token, c.sequence) for c in ours] == [(c["token"], c["sequence"])
                                                     for c in pipeline(TEXTS["roberta"][0], top_k=3)]


@pytest.mark.parametrize("settings, damage, message", [
    ({"tokenizer_class": "GPT2Tokenizer"}, None, 'merges.txt: byte-level BPE files of a "GPT2Tokenizer" tokenizer '
                                                 "are not read (supported: RobertaTokenizer, BartTokenizer's"),
    ({}, ("merges.txt", "#version: 0.2\na b c\n"), "merges.txt:2: not a merge (two tokens and a space between)"),
    ({}, ("vocab.json", "[1, 2]"), "vocab.json: not a JSON object of tokens and their ids"),
    ({"mask_token": 5}, None, "tokenizer_config.json: mask_token 5 is not a token"),
])
def test_byte_level_bpe_files_that_do_not_hold_are_refused_by_file_and_line(tmp_path, settings, damage, message):
    from xspec.hf.importer import import_checkpoint

    directory = merges_only(tmp_path, settings)
    if damage is not None:
        (directory / damage[0]).write_text(damage[1])
    with pytest.raises(UserError, match=re.escape(message)):
        import_checkpoint(directory, tmp_path / "run", say=lambda line: None)


def test_the_fill_command_writes_candidates_and_names_a_line_without_a_mask(tmp_path, capsys):
    from xspec.cli import main
    from xspec.hf.importer import import_checkpoint

    import_checkpoint(with_tokenizer(), tmp_path / "run", say=lambda line: None)
    assert main(["fill", str(tmp_path / "run"), "--text", "the [MASK] is small.", "--top-k", "3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 3 and all(row["sequence"].endswith(" is small.") for row in rows)
    (tmp_path / "in.txt").write_text("the [MASK] is small.\nno mask here\n")
    assert main(["fill", str(tmp_path / "run"), "-i", str(tmp_path / "in.txt")]) == 1
    assert f"{tmp_path / 'in.txt'}:2: no [MASK] to fill in \"no mask here\"" in capsys.readouterr().err


def test_train_init_fine_tunes_an_imported_bert_on_text_and_fill_reads_its_tokenizer(tmp_path, capsys):
    """`train --init` continues an imported masked LM on lines of text, masked as BERT's pretraining masks
    them; the tuned run keeps the checkpoint's tokenizer, [MASK] and all."""
    from xspec.cli import main
    from xspec.hf.importer import import_checkpoint

    lines = ["the house is small.", "we see a green tree under the old city", "a dog runs fast",
             "the river is old and the city is new", "it is a big green house"]
    (tmp_path / "train.txt").write_text("\n".join(lines * 20) + "\n")
    (tmp_path / "valid.txt").write_text("\n".join(lines) + "\n")
    import_checkpoint(with_tokenizer(), tmp_path / "run", say=lambda line: None)
    tuned = tmp_path / "tuned"
    assert main(["train", "--init", str(tmp_path / "run"), "--train", str(tmp_path / "train.txt"), "--valid",
                 str(tmp_path / "valid.txt"), "-o", str(tuned), "--no-test", "--no-tensorboard", "--no-progress",
                 "--set", "train.epochs=6", "--set", "train.validate_every_steps=3", "--set", "train.lr=0.001",
                 "--set", "train.warmup_fraction=0.01", "--set", "train.batch_tokens=40"]) == 0
    valid = [json.loads(line)["valid_loss"] for line in (tuned / "metrics.jsonl").read_text().splitlines()
             if "valid_loss" in line]
    assert len(valid) >= 4 and valid[-1] < valid[0]
    capsys.readouterr()
    assert main(["fill", str(tuned), "--text", "the [MASK] is small."]) == 0
    assert capsys.readouterr().out.count(" is small.") == 5


def test_train_init_makes_a_classifier_of_an_imported_bert(tmp_path, capsys):
    """`--set num_labels=2` puts a classifier's head on an imported masked LM: its encoder's weights are read,
    the head starts fresh (said), the masked-LM head is not read, and the texts' classes are learnt."""
    import random

    from xspec.cli import main
    from xspec.hf.importer import import_checkpoint

    draw = random.Random(0)
    flags = []
    for split, count in (("train", 200), ("valid", 30)):
        rows = [(kind, " ".join(draw.sample(["the", "is", "big", "old", "a", "new"], 3) +
                               [draw.choice(["dog"] if kind == "animal" else ["city", "river", "tree", "house"])]))
                for kind in (draw.choice(["animal", "place"]) for _ in range(count))]
        (tmp_path / f"{split}.txt").write_text("".join(text + "\n" for _, text in rows))
        (tmp_path / f"{split}.labels").write_text("".join(kind + "\n" for kind, _ in rows))
        flags += [f"--{split}", str(tmp_path / f"{split}.txt"), f"--{split}-labels", str(tmp_path / f"{split}.labels")]
    import_checkpoint(with_tokenizer(), tmp_path / "run", say=lambda line: None)
    tuned = tmp_path / "tuned"
    assert main(["train", "--init", str(tmp_path / "run"), "--set", "num_labels=2", *flags, "-o", str(tuned),
                 "--no-tensorboard", "--no-progress", "--set", "train.epochs=10", "--set", "train.lr=0.001",
                 "--set", "train.batch_tokens=16", "--set", "train.validate_every_steps=25"]) == 0
    said = capsys.readouterr().out
    assert "--init: the classifier's own tensors start fresh (encoder.pooler.weight, encoder.pooler.bias, " \
           "encoder.classifier.weight, encoder.classifier.bias)" in said
    assert "other head is not read (encoder.lm_head.bias, encoder.lm_head.weight, encoder.transform.bias" in said
    metrics = json.loads((tuned / "metrics.json").read_text())
    assert metrics["validation_accuracy"] >= 0.9, metrics


# --- sequence classifiers --------------------------------------------------------------------------------------

CLASSIFIER_CLASSES = {"bert": "BertForSequenceClassification", "roberta": "RobertaForSequenceClassification"}


@functools.cache
def classifier(kind: str) -> Path:
    """A sequence classifier of the family with its tokenizer (the masked LM's, above): BERT's with named
    classes, RoBERTa's with transformers' default names."""
    folder = ROOT / f"{kind}-classifier"
    masked = with_tokenizer(kind)
    config = json.loads((masked / "config.json").read_text())
    labels = {"id2label": {"0": "negative", "1": "neutral", "2": "positive"}} if kind == "bert" else {}
    model_class = getattr(transformers, CLASSIFIER_CLASSES[kind])
    config_class = getattr(transformers, CLASSES[kind][0])
    torch.manual_seed(4)
    model = model_class(config_class(**{k: v for k, v in config.items() if k not in ("architectures",
                                                                                          "transformers_version")},
                                     **labels))
    return saved_moved(model, folder, masked)


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_a_sequence_classifier_imports_classifies_as_the_pipeline_and_exports_back(tmp_path, capsys, kind):
    """architectures naming the family's sequence classifier imports its head (id2label's classes); `xspec
    classify` gives the text-classification pipeline's class and probability; export writes it back."""
    from xspec.cli import main
    from xspec.hf.export import export_hf
    from xspec.hf.importer import import_checkpoint
    from xspec.runtime.inference import load

    imported = import_checkpoint(classifier(kind), tmp_path / "run", say=lambda line: None)
    assert imported.verification["verified"]
    names = ["negative", "neutral", "positive"] if kind == "bert" else ["LABEL_0", "LABEL_1"]
    assert list(imported.spec.params["labels"]) == names
    texts = ["the house is small.", "we see a green tree under the old city", "a dog runs fast"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    assert main(["classify", str(tmp_path / "run"), "-i", str(tmp_path / "in.txt"), "--scores",
                 "--weights", "fp32"]) == 0
    ours = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    pipeline = transformers.pipeline("text-classification", model=str(classifier(kind)), device="cpu")
    theirs = pipeline(texts)
    assert [row[0] for row in ours] == [found["label"] for found in theirs]
    assert [max(map(float, row[1:])) for row in ours] == pytest.approx([found["score"] for found in theirs],
                                                                        abs=1e-4)
    (tmp_path / "hf").mkdir()
    export_hf(load(tmp_path / "run", "cpu", weights="fp32"), tmp_path / "hf")
    exported = getattr(transformers, CLASSIFIER_CLASSES[kind]).from_pretrained(tmp_path / "hf").eval()
    original = getattr(transformers, CLASSIFIER_CLASSES[kind]).from_pretrained(classifier(kind)).eval()
    tokens, padding = batch(original.config.vocab_size)
    assert_close(their_logits(exported, tokens, padding), their_logits(original, tokens, padding))
    assert exported.config.id2label == original.config.id2label


def test_a_modernbert_classifier_imports_with_its_scores_and_exports_back(tmp_path):
    """ModernBertForSequenceClassification (classifier_pooling "cls"): the head's state at the first position
    to the classes' scores; a pooling neither "cls" nor "mean" is refused by key."""
    from xspec.hf.export import export_hf
    from xspec.hf.importer import import_checkpoint
    from xspec.runtime.inference import load

    sizes = {k: v for k, v in SIZES[3][1].items()}
    config = transformers.ModernBertConfig(**sizes, id2label={0: "no", 1: "yes"}, classifier_dropout=0.1)
    torch.manual_seed(6)
    model = transformers.ModernBertForSequenceClassification(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    model.eval().save_pretrained(tmp_path / "hf-in")
    imported = import_checkpoint(tmp_path / "hf-in", tmp_path / "run", say=lambda line: None)
    assert imported.verification["verified"] and list(imported.spec.params["labels"]) == ["no", "yes"]
    tokens, padding = batch(sizes["vocab_size"])
    trained = load(tmp_path / "run", "cpu", weights="fp32")
    with torch.no_grad():
        assert_close(trained.model(tokens, padding)[:, 0], their_logits(model, tokens, padding))
    (tmp_path / "hf").mkdir()
    export_hf(trained, tmp_path / "hf")
    exported = transformers.ModernBertForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert_close(their_logits(exported, tokens, padding), their_logits(model, tokens, padding))
    most = CHECKPOINTS.with_config(3, tmp_path / "max", {"architectures": ["ModernBertForSequenceClassification"],
                                                          "classifier_pooling": "max"})
    with pytest.raises(UserError, match=r'classifier_pooling "max" is not supported \(supported: cls, mean\)'):
        import_checkpoint(most, tmp_path / "run-max", say=lambda line: None)


@functools.cache
def mean_pooled_classifier() -> Path:
    """A ModernBERT classifier of uncommon sizes (heads of 4 features, local windows of 2 positions either
    side, the head's SiLU and bias) that pools the mean of the texts' states, with BERT's tokenizer (above)."""
    folder = ROOT / "modernbert-mean-classifier"
    tokenizer = with_tokenizer("bert")
    config = transformers.ModernBertConfig(
        vocab_size=len(transformers.AutoTokenizer.from_pretrained(tokenizer)), hidden_size=20, intermediate_size=36,
        num_hidden_layers=4, num_attention_heads=5, max_position_embeddings=48, local_attention=4,
        classifier_activation="silu", classifier_bias=True, classifier_pooling="mean", pad_token_id=0,
        bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3,
        id2label={0: "negative", 1: "neutral", 2: "positive"})
    torch.manual_seed(8)
    model = transformers.ModernBertForSequenceClassification(config)
    return saved_moved(model, folder, tokenizer)


def test_a_mean_pooled_modernbert_classifier_imports_with_its_scores_and_exports_back(tmp_path):
    """classifier_pooling "mean": the head reads the mean of the final norm's states over each text's positions,
    the padding's left out (whatever its tokens), so a padded text scores as transformers scores it; a row of
    padding alone scores finitely; export writes the pooling back."""
    from xspec.hf.export import export_hf
    from xspec.hf.importer import import_checkpoint
    from xspec.runtime.inference import load

    original = transformers.ModernBertForSequenceClassification.from_pretrained(mean_pooled_classifier()).eval()
    imported = import_checkpoint(mean_pooled_classifier(), tmp_path / "run", say=lambda line: None)
    assert imported.verification["verified"] and imported.spec.params["classifier_pooling"] == "mean"
    tokens, padding = batch(original.config.vocab_size)
    trained = load(tmp_path / "run", "cpu", weights="fp32")
    with torch.no_grad():
        ours = trained.model(tokens, padding)
        other_padding = trained.model(tokens.masked_fill(padding, 7), padding)
        alone = trained.model(tokens, torch.ones_like(padding))
    assert_close(ours[:, 0], their_logits(original, tokens, padding))
    assert_close(other_padding[:, 0], ours[:, 0])
    assert torch.isfinite(alone).all()
    (tmp_path / "hf").mkdir()
    export_hf(trained, tmp_path / "hf")
    exported = transformers.ModernBertForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert exported.config.classifier_pooling == "mean"
    assert_close(their_logits(exported, tokens, padding), their_logits(original, tokens, padding))


def test_a_mean_pooled_modernbert_classifier_classifies_as_the_pipeline(tmp_path, capsys):
    """`xspec classify` of texts of several lengths, batched with padding, gives the text-classification
    pipeline's class and probability of each."""
    from xspec.cli import main
    from xspec.hf.importer import import_checkpoint

    import_checkpoint(mean_pooled_classifier(), tmp_path / "run", say=lambda line: None)
    texts = ["the house is small.", "we see a green tree under the old city", "a dog runs fast",
             "it is big and the river is new"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    assert main(["classify", str(tmp_path / "run"), "-i", str(tmp_path / "in.txt"), "--scores",
                 "--weights", "fp32"]) == 0
    ours = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    theirs = transformers.pipeline("text-classification", model=str(mean_pooled_classifier()), device="cpu")(texts)
    assert [row[0] for row in ours] == [found["label"] for found in theirs]
    assert [max(map(float, row[1:])) for row in ours] == pytest.approx([found["score"] for found in theirs],
                                                                        abs=1e-4)


# --- sentence pairs -------------------------------------------------------------------------------------------

PAIRS = [("the house is small.", "we see a green tree under the old city"), ("a dog runs fast", "it is big"),
         ("the river and the city", "the old dog runs under a green tree and the house is new"),
         ("we see it", "a small house")]


@functools.cache
def imported_classifier(kind: str) -> Path:
    from xspec.hf.importer import import_checkpoint

    run = ROOT / f"{kind}-classifier-run"
    import_checkpoint(classifier(kind), run, say=lambda line: None)
    return run


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_the_tokenizer_frames_pairs_as_transformers_does_and_cuts_the_longer_text_first(kind):
    """BERT's [CLS] a [SEP] b [SEP] (types 0, then 1) and RoBERTa's <s> a </s></s> b </s> (all 0), whole and
    cut to a length (transformers' truncation="longest_first")."""
    tokenizer = xspec.load(imported_classifier(kind), device="cpu").tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(classifier(kind))
    template = tokenizer.pair_template()
    for first, second in PAIRS:
        for size in (64, 12, 9, 7):
            ids, types = template.frame(*tokenizer.encode([first, second]), size)
            expected = theirs(first, second, truncation="longest_first", max_length=size, return_token_type_ids=True)
            assert (ids, types) == (expected["input_ids"], expected["token_type_ids"])


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_a_sequence_classifier_scores_padded_pairs_as_transformers_does(kind):
    """Pairs framed and typed by transformers' tokenizer, padded to one length: the same logits."""
    model = xspec.load(imported_classifier(kind), device="cpu", weights="fp32").model
    original = getattr(transformers, CLASSIFIER_CLASSES[kind]).from_pretrained(classifier(kind)).eval()
    encoded = transformers.AutoTokenizer.from_pretrained(classifier(kind))(
        [a for a, _ in PAIRS], [b for _, b in PAIRS], padding=True, return_token_type_ids=True, return_tensors="pt")
    padding = encoded["attention_mask"] == 0
    assert padding.any() and (kind == "roberta") == (encoded["token_type_ids"] == 0).all()
    with torch.no_grad():
        ours = model(encoded["input_ids"], padding, encoded["token_type_ids"])[:, 0]
        theirs = original(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"],
                          token_type_ids=encoded["token_type_ids"]).logits
    assert_close(ours, theirs)


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_classify_gives_the_pipelines_class_and_probabilities_of_pairs(tmp_path, capsys, kind):
    """`xspec classify --input-pair` (and --text-pair) against the text-classification pipeline given
    {"text": a, "text_pair": b}."""
    from xspec.cli import main

    run = imported_classifier(kind)
    (tmp_path / "first.txt").write_text("".join(a + "\n" for a, _ in PAIRS))
    (tmp_path / "second.txt").write_text("".join(b + "\n" for _, b in PAIRS))
    assert main(["classify", str(run), "-i", str(tmp_path / "first.txt"), "--input-pair", str(tmp_path / "second.txt"),
                 "--scores", "--weights", "fp32"]) == 0
    ours = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    pipeline = transformers.pipeline("text-classification", model=str(classifier(kind)), device="cpu")
    theirs = pipeline([{"text": a, "text_pair": b} for a, b in PAIRS], top_k=None)
    names = list(xspec.load(run, device="cpu").spec.params["labels"])   # the order of the scores
    assert [row[0] for row in ours] == [found[0]["label"] for found in theirs]
    for row, found in zip(ours, theirs):
        assert [float(p) for p in row[1:]] == pytest.approx(
            [next(f["score"] for f in found if f["label"] == name) for name in names], abs=1e-4)
    assert main(["classify", str(run), "--text", PAIRS[1][0], "--text-pair", PAIRS[1][1]]) == 0
    assert capsys.readouterr().out == f"{theirs[1][0]['label']}\n"


def test_an_imported_bert_fine_tunes_on_pairs_and_scores_them(tmp_path, capsys):
    """`train --init` of an imported BERT on pairs whose class is which of their texts names a dog: the
    validation loss falls; eval scores pairs; a pair file a line short is refused by file and line."""
    import random

    from xspec.cli import main
    from xspec.hf.importer import import_checkpoint

    draw, others = random.Random(1), ["city", "river", "tree", "house"]
    flags = []
    for split, count in (("train", 160), ("valid", 30)):
        rows = []
        for _ in range(count):
            texts = [["the", "dog", draw.choice(["is", "runs"])], ["a", draw.choice(others), "is", "big"]]
            draw.shuffle(texts)
            rows.append((" ".join(texts[0]), " ".join(texts[1]), "first" if "dog" in texts[0] else "second"))
        for suffix, column in (("txt", 0), ("pair", 1), ("labels", 2)):
            (tmp_path / f"{split}.{suffix}").write_text("".join(row[column] + "\n" for row in rows))
        flags += [f"--{split}", str(tmp_path / f"{split}.txt"), f"--{split}-pair", str(tmp_path / f"{split}.pair"),
                  f"--{split}-labels", str(tmp_path / f"{split}.labels")]
    import_checkpoint(with_tokenizer(), tmp_path / "run", say=lambda line: None)
    tuned = tmp_path / "tuned"
    assert main(["train", "--init", str(tmp_path / "run"), "--set", "num_labels=2", *flags, "-o", str(tuned),
                 "--no-tensorboard", "--no-progress", "--set", "train.epochs=8", "--set", "train.lr=0.001",
                 "--set", "train.batch_tokens=16", "--set", "train.validate_every_steps=8"]) == 0
    valid = [json.loads(line)["valid_loss"] for line in (tuned / "metrics.jsonl").read_text().splitlines()
             if "valid_loss" in line]
    assert len(valid) >= 3 and valid[-1] < 0.6 * valid[0], valid
    assert json.loads((tuned / "metrics.json").read_text())["validation_accuracy"] >= 0.9
    capsys.readouterr()
    assert main(["eval", str(tuned), "--text", str(tmp_path / "valid.txt"), "--text-pair", str(tmp_path / "valid.pair"),
                 "--labels", str(tmp_path / "valid.labels")]) == 0
    assert "(30 pairs)" in capsys.readouterr().out
    (tmp_path / "short.pair").write_text("".join((tmp_path / "valid.pair").read_text().splitlines(True)[:-1]))
    assert main(["eval", str(tuned), "--text", str(tmp_path / "valid.txt"), "--text-pair", str(tmp_path / "short.pair"),
                 "--labels", str(tmp_path / "valid.labels")]) == 1
    assert f"{tmp_path / 'valid.txt'}:30: no line 30 in {tmp_path / 'short.pair'}, which has 29" in \
        capsys.readouterr().err


# The activation as specs chose it before the `activation` op: `if`s over the parameter's value, which an import
# kept as transformers names it ("gelu_new").
OLDER_ACTIVATION = ('if hidden_act == "gelu_new" { act = h => gelu_tanh(h) } else { if hidden_act == "relu" '
                    '{ act = h => relu(h) } else { if hidden_act == "silu" { act = h => silu(h) } else '
                    '{ act = h => gelu(h) } } }')


@torch.no_grad()
def test_a_run_whose_spec_chose_its_activation_by_ifs_exports_as_its_family(tmp_path):
    """Runs an older xspec wrote hold no activation op (`gelu_tanh(...)` after an `if` over hidden_act,
    "gelu_new" as transformers names it): export compares them in today's form and gives the logits."""
    from xspec.hf.export import export_hf
    from xspec.hf.spec_text import family_spec
    from xspec.runtime.inference import load

    trained = load(imported(1), "cpu", weights="fp32")
    text = family_spec("bert").read_text()
    for current, older in ((r"activation\(linear\(x, d_ff\) as intermediate, hidden_act\) as intermediate_act_fn",
                            "act(linear(x, d_ff) as intermediate)"),
                           (r"activation\(linear\(x, d_model\) as transform, hidden_act\) as transform_act_fn",
                            "act(linear(x, d_model) as transform)"),
                           *((re.escape(f"block {block} {{"), f"block {block} {{\n    {OLDER_ACTIVATION}")
                             for block in ("encoder_layer(x, mask)", "encoder(src, src_mask)"))):
        text, found = re.subn(current, older, text)
        assert found == 1, current
    params = {k: v for k, v in trained.spec.params.items() if not isinstance(v, (str, list))}
    older = xspec.compile_source(text, str(family_spec("bert")), overrides={**params, "hidden_act": '"gelu_new"'})
    assert "activation" not in {node["op"] for node in json.loads(older.graph_json())["nodes"]}
    model = older.build("cpu").eval()
    model.load_state_dict(trained.model.state_dict())
    trained.spec, trained.model = older, model
    export_hf(trained, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["hidden_act"] == "gelu_new"
    exported = model_class(1).from_pretrained(tmp_path).eval()
    tokens, padding = batch(SIZES[1][1]["vocab_size"])
    assert_close(their_logits(exported, tokens, padding), their_logits(reference(1), tokens, padding))


def test_a_modernbert_run_whose_first_layer_passed_its_input_on_matches_its_family():
    """An older ModernBERT spec wrote `h = x` where the first layer has no norm (today `identity(x)`) and chose
    its head's activation by `if`s: export compares identities as the value they pass on."""
    from xspec.hf.export import match_family
    from xspec.hf.spec_text import family_spec

    text = family_spec("modernbert").read_text()
    for current, older in (("if i == 0 { h = identity(x) as attn_norm }", "if i == 0 { h = x }"),
                           ("x = activation(linear(x, d_model, bias = classifier_bias) as head_dense, "
                            "classifier_activation) as head_act",
                            'if classifier_activation == "gelu" { act = h => gelu(h) } else { act = h => silu(h) }\n'
                            "    x = act(linear(x, d_model, bias = classifier_bias) as head_dense)")):
        assert current in text
        text = text.replace(current, older)
    older = xspec.compile_source(text, str(family_spec("modernbert")))
    assert not {"identity", "activation"} & {node["op"] for node in json.loads(older.graph_json())["nodes"]}
    assert match_family(older, (None, [])).config["model_type"] == "modernbert"


def test_a_token_type_embedding_is_of_its_inputs_shape_with_or_without_the_types():
    """The graph, the shape comments and the module agree: each position's type's row, [B, T, d]; without the
    types, the first type's row at every position, a view of the one row."""
    from xspec.nn import TokenTypeEmbedding

    graph = json.loads(xspec.compile("specs/modern/bert.xspec").graph_json())
    node = next(n for n in graph["nodes"] if n["op"] == "token_type_embedding")
    assert node["shape"] == "[batch, src_len, 64]"
    module = TokenTypeEmbedding(6, types=3)
    x = torch.zeros(2, 5, 6)
    first = module(x)
    assert first.shape == x.shape and first.data_ptr() == module.weight.data_ptr()
    types = torch.tensor([[0, 1, 2, 1, 0], [2, 2, 0, 0, 1]])
    assert torch.equal(module(x, types)[1, 0], module.weight[2].detach())
