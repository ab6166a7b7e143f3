"""Sentence classification: an encoder alone with a classifier's head (BERT's spec with num_labels) trained on a
text file and a label file, scored by accuracy and macro F1 as its run scored it, classifying texts; and what
such data must hold, refused by file and line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from xspec.runtime.tasks.classification import class_scores

ANIMALS, PLACES = ["dog", "cat", "bird", "fish"], ["city", "river", "house", "tree"]
FILLERS = ["the", "a", "is", "big", "small", "old", "new"]


def test_accuracy_and_macro_f1_are_computed_per_class():
    scores = class_scores([0, 0, 1, 1, 2], [0, 1, 1, 1, 2])
    assert scores.accuracy == pytest.approx(0.8)
    assert scores.macro_f1 == pytest.approx((2 / 3 + 0.8 + 1.0) / 3)


def write_split(folder: Path, name: str, count: int, seed: int) -> tuple[Path, Path]:
    """Texts naming an animal or a place among filler words, labelled so."""
    draw = random.Random(seed)
    texts, labels = [], []
    for _ in range(count):
        kind = draw.choice(["animal", "place"])
        words = [draw.choice(ANIMALS if kind == "animal" else PLACES)]
        words += [draw.choice(FILLERS) for _ in range(draw.randint(2, 6))]
        draw.shuffle(words)
        texts.append(" ".join(words))
        labels.append(kind)
    (folder / f"{name}.txt").write_text("\n".join(texts) + "\n")
    (folder / f"{name}.labels").write_text("\n".join(labels) + "\n")
    return folder / f"{name}.txt", folder / f"{name}.labels"


def data_flags(folder: Path) -> list[str]:
    flags = []
    for name, count, seed in (("train", 400, 0), ("valid", 40, 1), ("test", 40, 2)):
        text, labels = write_split(folder, name, count, seed)
        flags += [f"--{name}", str(text), f"--{name}-labels", str(labels)]
    return flags


SMALL = ["--set", "layers=1", "--set", "d_model=32", "--set", "d_ff=64", "--set", "data.vocab_size=60",
         "--set", "train.lr_schedule=cosine", "--set", "train.lr=0.001", "--set", "train.warmup_steps=5",
         "--set", "train.batch_tokens=32", "--set", "train.epochs=10", "--set", "train.validate_every_steps=20"]


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory) -> Path:
    from xspec.cli import main

    folder = tmp_path_factory.mktemp("classes")
    run = folder / "run"
    assert main(["train", "specs/modern/bert.xspec", "--set", "num_labels=2", *data_flags(folder), *SMALL,
                 "-o", str(run), "--no-tensorboard", "--no-progress"]) == 0
    return run


def test_a_classifier_trains_on_texts_and_labels_and_keeps_their_names(classifier_run):
    import xspec

    metrics = json.loads((classifier_run / "metrics.json").read_text())
    assert metrics["test_accuracy"] >= 0.9 and metrics["test_macro_f1"] >= 0.9
    assert list(xspec.load(classifier_run, device="cpu").spec.params["labels"]) == ["animal", "place"]


def test_eval_and_classify_score_as_the_run_did(classifier_run, capsys):
    from xspec.cli import main

    folder = classifier_run.parent
    assert main(["eval", str(classifier_run), "--text", str(folder / "test.txt"), "--labels",
                 str(folder / "test.labels"), "--weights", "fp32"]) == 0
    metrics = json.loads((classifier_run / "metrics.json").read_text())
    assert f"accuracy {100 * metrics['test_accuracy']:.2f}%, macro F1 {metrics['test_macro_f1']:.4f}" in \
        capsys.readouterr().out
    assert main(["classify", str(classifier_run), "--text", "the big dog is old", "--scores"]) == 0
    label, *scores = capsys.readouterr().out.split("\t")
    assert label == "animal" and sum(map(float, scores)) == pytest.approx(1.0, abs=1e-3)
    assert main(["show", str(classifier_run)]) == 0
    assert f"xspec classify {classifier_run} < texts.txt" in capsys.readouterr().out
    assert main(["fill", str(classifier_run), "--text", "the <mask> is big"]) == 1
    assert "filling masks takes a masked language model" in capsys.readouterr().err


def test_eval_of_a_classifier_refuses_no_texts_and_an_ensemble_and_says_what_it_truncates(
        classifier_run, capsys, tmp_path):
    import xspec
    from xspec.cli import main

    (tmp_path / "empty.txt").write_text("")
    assert main(["eval", str(classifier_run), "--text", str(tmp_path / "empty.txt"), "--labels",
                 str(tmp_path / "empty.txt")]) == 1
    assert capsys.readouterr().err == f"xspec: error: {tmp_path / 'empty.txt'}: no text to classify\n"
    assert main(["eval", str(classifier_run), str(classifier_run), "--text", "t", "--labels", "l"]) == 1
    assert capsys.readouterr().err.endswith("classifiers are scored one at a time, not as an ensemble\n")
    (tmp_path / "long.txt").write_text("the big dog is old " * 400 + "\nthe big dog\n")
    (tmp_path / "long.labels").write_text("animal\nanimal\n")
    assert main(["eval", str(classifier_run), "--text", str(tmp_path / "long.txt"), "--labels",
                 str(tmp_path / "long.labels")]) == 0
    assert f"xspec: {tmp_path / 'long.txt'}: 1 of 2 texts are longer than the model's" in capsys.readouterr().err
    assert main(["classify", str(classifier_run), "-i", str(tmp_path / "long.txt")]) == 0
    captured = capsys.readouterr()
    assert captured.out == "animal\nanimal\n"
    positions = xspec.load(classifier_run, device="cpu").max_tokens
    assert captured.err.startswith(f"{tmp_path / 'long.txt'}:1: warning: ") and captured.err.count("\n") == 1
    assert f"tokens framed, more than the model's {positions} positions: classified from its start" in captured.err


@pytest.mark.parametrize("change, message", [
    (lambda f: (f / "train.labels").write_text("animal\nplace\nthird\n" * 133 + "animal\n"),
     "the training labels name 3 classes (animal, place, third), but the spec's classifier scores 2: "
     "--set num_labels=3"),
    (lambda f: (f / "valid.labels").write_text("place\n" * 39 + "unknown\n"),
     'valid.labels:40: "unknown" is no training label (animal, place)'),
    (lambda f: (f / "train.labels").write_text("animal\n" * 10),
     "train.txt has 400 lines but"),
    (lambda f: (f / "test.txt").write_text("a dog\n\nthe city\n" + "a dog\n" * 37),
     "test.txt:2: an empty text"),
])
def test_labels_that_do_not_fit_are_refused_by_file_and_line(tmp_path, capsys, change, message):
    from xspec.cli import main

    flags = data_flags(tmp_path)
    change(tmp_path)
    assert main(["train", "specs/modern/bert.xspec", "--set", "num_labels=2", *flags, *SMALL,
                 "-o", str(tmp_path / "run"), "--no-tensorboard", "--no-progress"]) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("argv, message", [
    (["specs/lm.xspec", "--train", "TRAIN", "--train-labels", "LABELS"],
     "--train-labels gives a classifier's classes; transformer_lm is no classifier"),
    (["specs/modern/bert.xspec", "--set", "num_labels=2", "--train", "TRAIN", "--train-labels", "LABELS",
      "--valid", "TRAIN"], "a classifier's valid split is a text file and its labels: give --valid-labels too"),
])
def test_labels_given_to_what_takes_none_or_left_out_are_refused(tmp_path, capsys, argv, message):
    from xspec.cli import main

    text, labels = write_split(tmp_path, "train", 20, 0)
    argv = [str(text) if a == "TRAIN" else str(labels) if a == "LABELS" else a for a in argv]
    assert main(["train", *argv, "-o", str(tmp_path / "run"), "--no-progress"]) == 1
    assert message in capsys.readouterr().err


def test_a_classifier_written_from_scratch_keeps_its_classes_where_it_declares_labels(tmp_path, capsys):
    """Any encoder alone whose head scores classes is a classifier: its count is the head's width; the names
    are kept in `param labels`, which such a spec must declare."""
    from xspec.cli import main

    text = """model tiny_classifier {{
  param vocab = 60
  param d_model = 32
  {labels}
  block encoder(src, src_mask) {{
    x = embedding(src, vocab, d_model) as embed
    x = x + attention(x, x, x, src_mask, 2, 16, 16) as attn
    return linear(x, 2) as classifier
  }}
  data {{
    vocab_size = vocab
  }}
}}
"""
    flags = data_flags(tmp_path)
    for declared, status in (("", 1), ("param labels = []", 0)):
        spec = tmp_path / "classifier.xspec"
        spec.write_text(text.format(labels=declared))
        out = tmp_path / f"run-{status}"
        assert main(["train", str(spec), *flags, *SMALL[8:], "-o", str(out), "--no-tensorboard",
                     "--no-progress"]) == status
    assert "declare `param labels = []`" in capsys.readouterr().err
    assert main(["classify", str(tmp_path / "run-0"), "--text", "the old dog"]) == 0
    assert capsys.readouterr().out.strip() in ("animal", "place")


# --- sentence pairs ----------------------------------------------------------------------------------------------


def write_pairs(folder: Path, name: str, count: int, seed: int) -> tuple[Path, Path, Path]:
    """Pairs of texts, one naming an animal and the other a place, labelled by which names the animal."""
    draw = random.Random(seed)
    rows = []
    for _ in range(count):
        texts = [[draw.choice(nouns)] + [draw.choice(FILLERS) for _ in range(draw.randint(1, 4))]
                 for nouns in (ANIMALS, PLACES)]
        for words in texts:
            draw.shuffle(words)
        draw.shuffle(texts)
        rows.append((" ".join(texts[0]), " ".join(texts[1]), "first" if set(texts[0]) & set(ANIMALS) else "second"))
    paths = tuple(folder / f"{name}.{suffix}" for suffix in ("txt", "pair", "labels"))
    for path, column in zip(paths, range(3)):
        path.write_text("".join(row[column] + "\n" for row in rows))
    return paths[0], paths[1], paths[2]


def pair_flags(folder: Path) -> list[str]:
    flags = []
    for name, count, seed in (("train", 300, 0), ("valid", 40, 1), ("test", 40, 2)):
        text, pair, labels = write_pairs(folder, name, count, seed)
        flags += [f"--{name}", str(text), f"--{name}-pair", str(pair), f"--{name}-labels", str(labels)]
    return flags


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory) -> Path:
    from xspec.cli import main

    folder = tmp_path_factory.mktemp("pairs")
    run = folder / "run"
    assert main(["train", "specs/modern/bert.xspec", "--set", "num_labels=2", *pair_flags(folder), *SMALL,
                 "--set", "train.lr=0.003", "-o", str(run), "--no-tensorboard", "--no-progress"]) == 0
    return run


def test_a_classifier_of_its_own_vocabulary_learns_pairs_framed_with_eos_and_typed(pair_run, capsys):
    """BERT's spec trained from scratch on pairs: xspec's vocabulary frames each as a EOS b EOS, of types 0
    then 1; the loss falls, the test pairs are classified, and eval and classify read pairs as the run did."""
    import torch
    import xspec
    from xspec.cli import main
    from xspec.runtime.tasks.classification import framed_pairs

    losses = [json.loads(line)["loss"] for line in (pair_run / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5])
    metrics = json.loads((pair_run / "metrics.json").read_text())
    assert metrics["test_accuracy"] >= 0.9
    trained = xspec.load(pair_run, device="cpu")
    kept, types = framed_pairs(trained.tokenizer, [[10, 11]], [[12]], 64, True, trained.spec.token_types)
    assert (kept.texts, types) == ([[10, 11, 3, 12, 3]], [[0, 0, 0, 1, 1]])
    folder = pair_run.parent
    assert main(["eval", str(pair_run), "--text", str(folder / "test.txt"), "--text-pair", str(folder / "test.pair"),
                 "--labels", str(folder / "test.labels")]) == 0
    assert f"accuracy {100 * metrics['test_accuracy']:.2f}%" in capsys.readouterr().out
    assert main(["classify", str(pair_run), "--text", "the big city", "--text-pair", "a small dog is old"]) == 0
    assert capsys.readouterr().out == "second\n"
    assert main(["show", str(pair_run)]) == 0
    assert f"--labels {folder / 'test.labels'} --text-pair {folder / 'test.pair'}" in capsys.readouterr().out
    # Types matter: the same tokens read as all of the first type score otherwise.
    batch = torch.tensor([[10, 11, 3, 12, 3]])
    with torch.no_grad():
        typed = trained.model(batch, None, torch.tensor([[0, 0, 0, 1, 1]]))[:, 0]
        assert not torch.allclose(typed, trained.model(batch, None)[:, 0])


@pytest.mark.parametrize("change, message", [
    (lambda f: (f / "valid.pair").write_text("a dog\n" * 39),
     "valid.txt:40: no line 40 in {f}/valid.pair, which has 39"),
    (lambda f: (f / "train.pair").write_text("a dog\n" * 301),
     "train.pair:301: no line 301 in {f}/train.txt, which has 300"),
    (lambda f: (f / "test.pair").write_text("a dog\n\n" + "a dog\n" * 38), "test.pair:2: an empty second text"),
])
def test_pair_files_out_of_line_with_their_texts_are_refused_by_file_and_line(tmp_path, capsys, change, message):
    from xspec.cli import main

    flags = pair_flags(tmp_path)
    change(tmp_path)
    assert main(["train", "specs/modern/bert.xspec", "--set", "num_labels=2", *flags, *SMALL,
                 "-o", str(tmp_path / "run"), "--no-tensorboard", "--no-progress"]) == 1
    assert message.format(f=tmp_path) in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("drop, message", [
    ("--valid-pair", "--train-pair makes a sentence-pair classifier, each of whose splits is pairs: give --valid-pair "
                     "too"),
    ("--valid", "--valid-pair gives the second texts of --valid's pairs: give --valid too"),
])
def test_pairs_given_for_some_splits_only_are_refused(tmp_path, capsys, drop, message):
    from xspec.cli import main

    flags = pair_flags(tmp_path)
    at = flags.index(drop)
    flags = flags[:at] + flags[at + 2:]
    if drop == "--valid":
        at = flags.index("--valid-labels")
        flags = flags[:at] + flags[at + 2:]
    assert main(["train", "specs/modern/bert.xspec", "--set", "num_labels=2", *flags, *SMALL,
                 "-o", str(tmp_path / "run"), "--no-tensorboard", "--no-progress"]) == 1
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("pairs", [False, True])
def test_an_export_classifies_with_transformers_as_xspec_does(classifier_run, pair_run, tmp_path, capsys, pairs):
    """The run exported as BERT with its own vocabulary (tokenizer.json framing a text, or a pair, as xspec
    does): transformers' text-classification pipeline gives xspec classify's class and probabilities."""
    transformers = pytest.importorskip("transformers")
    from xspec.cli import main

    run = pair_run if pairs else classifier_run
    assert main(["export", str(run), "--format", "hf", "-o", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    text, pair = "the big dog is old", "a small city"
    argv = ["--text", text, *(["--text-pair", pair] if pairs else []), "--scores", "--weights", "fp32"]
    assert main(["classify", str(run), *argv]) == 0
    label, *scores = capsys.readouterr().out.split("\t")
    classifier = transformers.pipeline("text-classification", model=str(tmp_path / "hf"), device="cpu", top_k=None)
    theirs = classifier({"text": text, "text_pair": pair} if pairs else text)
    theirs = theirs[0] if isinstance(theirs[0], list) else theirs
    assert max(theirs, key=lambda c: c["score"])["label"] == label
    names = ["first", "second"] if pairs else ["animal", "place"]
    assert sorted((c["label"], c["score"]) for c in theirs) == \
        [(name, pytest.approx(float(score), abs=1e-4)) for name, score in zip(names, scores)]
    # imported back, it is suggested to classify
    assert main(["import", str(tmp_path / "hf"), "-o", str(tmp_path / "imported")]) == 0
    assert f'xspec classify {tmp_path / "imported"} --text "..."' in capsys.readouterr().out


def test_classify_refuses_a_pair_file_out_of_line_with_its_texts(pair_run, tmp_path, capsys, monkeypatch):
    """A second text past the first texts' last line, or a first text past the pair file's, by file and line:
    of a file before any is classified; of stdin once it gets there."""
    import io
    import sys

    from xspec.cli import main

    (tmp_path / "first.txt").write_text("a dog\nthe city\n")
    (tmp_path / "second.txt").write_text("the river\n")
    assert main(["classify", str(pair_run), "-i", str(tmp_path / "first.txt"), "--input-pair",
                 str(tmp_path / "second.txt")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"first.txt:2: no line 2 in {tmp_path / 'second.txt'}, which has 1" in captured.err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a dog\n")))
    (tmp_path / "second.txt").write_text("the river\nthe tree\n")
    assert main(["classify", str(pair_run), "--input-pair", str(tmp_path / "second.txt")]) == 1
    assert "second.txt:2: no line 2 in <stdin>, which has 1" in capsys.readouterr().err
    assert main(["classify", str(pair_run), "--text-pair", "the river"]) == 1
    assert "--text-pair gives the second text of --text's pair: give --text too" in capsys.readouterr().err


def test_a_classifier_without_token_types_reads_pairs_as_one_framed_text(tmp_path, capsys):
    """An encoder with no token type embedding takes pairs too: framed, untyped."""
    import xspec
    from xspec.cli import main

    text = """model tiny_classifier {
  param vocab = 60
  param d_model = 32
  param labels = []
  block encoder(src, src_mask) {
    x = embedding(src, vocab, d_model) as embed
    x = x + attention(x, x, x, src_mask, 2, 16, 16) as attn
    return linear(x, 2) as classifier
  }
  data {
    vocab_size = vocab
  }
}
"""
    (tmp_path / "classifier.xspec").write_text(text)
    assert xspec.compile(str(tmp_path / "classifier.xspec")).token_types is None
    assert main(["train", str(tmp_path / "classifier.xspec"), *pair_flags(tmp_path), *SMALL[8:], "--set",
                 "train.epochs=2", "-o", str(tmp_path / "run"), "--no-tensorboard", "--no-progress"]) == 0
    assert "test: accuracy" in capsys.readouterr().out
    assert main(["classify", str(tmp_path / "run"), "--text", "the old dog", "--text-pair", "a city"]) == 0
    assert capsys.readouterr().out.strip() in ("first", "second")


def test_pairs_a_tokenizer_cannot_frame_or_the_model_cannot_type_are_refused(classifier_run):
    """A sentencepiece tokenizer.model has no pair template; a template of more token types than the model's
    embedding has rows is refused before any pair is read."""
    from xspec.base.errors import UserError
    from xspec.runtime.tokenizer import CheckpointTokenizer
    from xspec.runtime.tasks.classification import framed_pairs
    from xspec.runtime.vocab import Vocab

    data = (classifier_run / "sentencepiece.model").read_bytes()
    with pytest.raises(UserError, match="tokenizer.model: a sentencepiece tokenizer has no template for a pair of "
                                        "texts"):
        CheckpointTokenizer("sentencepiece", data, None, [3], "tokenizer.model").pair_template()
    with pytest.raises(UserError, match=r"gives a pair's tokens 2 types \(0 to 1\), but the model's token type "
                                        r"embedding has 1 \(type_vocab_size\)"):
        framed_pairs(Vocab(data), [[10]], [[11]], 64, True, 1)
