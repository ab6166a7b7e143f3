"""Masked language modelling: BERT's masking (15% of a text's tokens, never a special one; 80% to the mask token,
10% to a random one, 10% kept), drawn the same way for the same examples and seed; an encoder-only spec trained
on text from scratch with falling loss, scored by `xspec eval --text` as its run scored it, and filling masks."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch

from xspec.runtime.batching import NO_LABEL
from xspec.runtime.masking import Masking, masked, predictions

MASK, SPECIAL = 4, frozenset({0, 2, 3})


def batch(rows: int = 64, length: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    draw = torch.Generator().manual_seed(0)
    tokens = torch.randint(5, 1000, (rows, length), generator=draw)
    tokens[:, 0], tokens[:, -1] = 2, 3            # each text framed by special tokens
    padding = torch.zeros(rows, length, dtype=torch.bool)
    padding[::2, 40:] = True                      # every other row padded
    return tokens.masked_fill(padding, 0), padding


def test_masking_predicts_15_percent_of_each_text_never_a_special_token_and_replaces_80_10_10():
    tokens, padding = batch()
    inputs, labels = masked(tokens, padding, Masking(MASK, SPECIAL, 1000, 0), list(range(64)))
    chosen = labels != NO_LABEL
    eligible = (~padding & (tokens > 4)).sum(1)
    assert chosen.sum(1).tolist() == [predictions(int(n)) for n in eligible]
    assert not chosen[padding].any() and not chosen[:, 0].any() and not chosen[:, -1].any()
    assert torch.equal(labels[chosen], tokens[chosen]) and torch.equal(inputs[~chosen], tokens[~chosen])
    total = int(chosen.sum())
    as_mask = int((inputs[chosen] == MASK).sum()) / total
    kept = int((inputs[chosen] == tokens[chosen]).sum()) / total
    assert 0.74 < as_mask < 0.86 and 0.05 < kept < 0.15 and 0.05 < 1 - as_mask - kept < 0.15


def test_a_text_is_masked_alike_for_its_place_and_seed_whatever_its_batch():
    """A text's masking follows the run's seed and its place in the split alone: the same in another batch,
    of other texts and another padded length; another seed or place masks it otherwise."""
    tokens, padding = batch(8)
    masking = Masking(MASK, SPECIAL, 1000, 0)
    first = masked(tokens, padding, masking, list(range(8)))
    assert all(torch.equal(a, b) for a, b in zip(first, masked(tokens, padding, masking, list(range(8)))))
    alone = masked(tokens[2:3, :40], padding[2:3, :40], masking, [2])     # row 2's 40 tokens, unpadded
    assert torch.equal(alone[0][0], first[0][2, :40]) and torch.equal(alone[1][0], first[1][2, :40])
    assert not torch.equal(first[1], masked(tokens, padding, Masking(MASK, SPECIAL, 1000, 1), list(range(8)))[1])
    assert not torch.equal(first[1][2], masked(tokens, padding, masking, [0, 1, 7, 3, 4, 5, 6, 2])[1][2])


def test_a_text_holds_at_least_one_prediction():
    assert [predictions(n) for n in (0, 1, 3, 4, 10, 100)] == [0, 1, 1, 1, 2, 15]




def texts(path: Path, lines: int, seed: int) -> Path:
    """Sentences of a small grammar, whose masked words are guessable from their neighbours."""
    draw = random.Random(seed)
    made = []
    for _ in range(lines):
        subject = draw.choice(["the dog", "a house", "the river", "a tree", "the city"])
        made.append(f"{subject} is {draw.choice(['small', 'big', 'old', 'new', 'green'])} and "
                    f"{subject} {draw.choice(['runs fast', 'is under it', 'we see'])}")
    path.write_text("\n".join(made) + "\n")
    return path


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    from xspec.cli import main

    folder = tmp_path_factory.mktemp("mlm")
    splits = {name: texts(folder / f"{name}.txt", lines, seed)
              for name, lines, seed in (("train", 1500, 0), ("valid", 60, 1), ("test", 60, 2))}
    run = folder / "run"
    assert main(["train", "specs/modern/bert.xspec", "--train", str(splits["train"]), "--valid", str(splits["valid"]),
                 "--test", str(splits["test"]), "-o", str(run), "--no-tensorboard", "--no-progress",
                 "--set", "d_model=32", "--set", "d_ff=64", "--set", "layers=1", "--set", "max_len=64",
                 "--set", "data.vocab_size=60", "--set", "train.epochs=6", "--set", "train.lr=0.003",
                 "--set", "train.warmup_steps=5", "--set", "train.batch_tokens=600",
                 "--set", "train.validate_every_steps=10"]) == 0
    return run


def test_an_encoder_alone_trains_on_text_from_scratch_with_falling_loss(trained_run):
    from xspec.runtime.vocab import MASK_PIECE, Vocab

    valid = [json.loads(line)["valid_loss"] for line in (trained_run / "metrics.jsonl").read_text().splitlines()
             if "valid_loss" in line]
    assert len(valid) >= 3 and valid[-1] < valid[0] - 1.0
    assert Vocab.load(trained_run / "sentencepiece.model").mask() == (MASK_PIECE, 4)
    metrics = json.loads((trained_run / "metrics.json").read_text())
    assert metrics["test_masked_accuracy"] > 0.3     # the grammar's words guessed from their neighbours


def test_eval_text_scores_masked_tokens_as_the_run_scored_its_test_split(trained_run, capsys):
    from xspec.cli import main

    test = next(trained_run.parent.glob("test.txt"))
    assert main(["eval", str(trained_run), "--text", str(test), "--weights", "fp32", "--batch-tokens", "97"]) == 0
    printed = capsys.readouterr().out
    metrics = json.loads((trained_run / "metrics.json").read_text())
    # the same masked positions in other batches; the figures of two passes, compared within float32's rounding
    loss = float(re.search(r"masked-token loss ([0-9.]+) nats", printed).group(1))
    accuracy = float(re.search(r"accuracy ([0-9.]+)%", printed).group(1))
    assert loss == pytest.approx(metrics["test_masked_loss"], abs=2e-4)
    assert accuracy == pytest.approx(100 * metrics["test_masked_accuracy"], abs=0.01)


def test_eval_says_what_it_truncates(trained_run, capsys, tmp_path):
    from xspec.cli import main

    (tmp_path / "long.txt").write_text("the dog is small " * 400 + "\nthe dog is small\n")
    assert main(["eval", str(trained_run), "--text", str(tmp_path / "long.txt")]) == 0
    assert f"xspec: {tmp_path / 'long.txt'}: 1 of 2 texts are longer than the model's" in capsys.readouterr().err


def test_fill_takes_the_runs_own_mask_piece(trained_run, capsys):
    from xspec.cli import main

    text = "the dog is small and the dog <mask> fast"
    assert main(["fill", str(trained_run), "--text", text, "--json"]) == 0
    candidates = json.loads(capsys.readouterr().out)
    assert len(candidates) == 5 and candidates[0]["score"] >= candidates[-1]["score"]
    assert [c["sequence"].replace(" ", "") for c in candidates] == \
        [text.replace("<mask>", c["token_str"]).replace(" ", "") for c in candidates]


def test_an_export_fills_masks_with_transformers_as_xspec_does(trained_run, tmp_path, capsys):
    """The run exported as BERT with its own vocabulary (tokenizer.json, the mask named): transformers'
    fill-mask pipeline gives xspec fill's candidates, probabilities and texts."""
    transformers = pytest.importorskip("transformers")
    from xspec.cli import main

    assert main(["export", str(trained_run), "--format", "hf", "-o", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    text = "the dog is small and the dog <mask> fast"
    assert main(["fill", str(trained_run), "--text", text, "--json", "--weights", "fp32"]) == 0
    ours = json.loads(capsys.readouterr().out)
    theirs = transformers.pipeline("fill-mask", model=str(tmp_path / "hf"), device="cpu")(text)
    assert [(c["token"], c["token_str"], c["sequence"]) for c in theirs] == \
        [(c["token"], c["token_str"], c["sequence"]) for c in ours]
    assert [c["score"] for c in theirs] == pytest.approx([c["score"] for c in ours], abs=1e-5)
    # imported back, it is suggested to fill its own mask
    assert main(["import", str(tmp_path / "hf"), "-o", str(tmp_path / "imported")]) == 0
    assert f'xspec fill {tmp_path / "imported"} --text "... <mask> ..."' in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["eval", "RUN", "RUN", "--text", "TEST"], "masked language models are scored one at a time, not as an ensemble"),
    (["generate", "RUN", "--prompt", "the dog"],
     "a masked language model (an encoder alone) continues no prompts; use xspec fill, or xspec eval --text"),
    (["translate", "RUN", "-i", "TEST"], "a masked language model (an encoder alone) does not translate"),
    (["train", "specs/modern/bert.xspec", "--train-src", "a.txt", "--train-tgt", "b.txt", "-o", "OUT"],
     "--train-src gives a translation model's data; bert is a masked language model: give --train FILE"),
])
def test_what_a_masked_lm_does_not_take_is_refused(trained_run, tmp_path, capsys, argv, message):
    from xspec.cli import main

    named = {"RUN": str(trained_run), "OUT": str(tmp_path / "out"), "TEST": str(trained_run.parent / "test.txt")}
    argv = [named.get(a, a) for a in argv]
    assert main(argv) != 0
    assert message in capsys.readouterr().err


def test_show_and_attention_maps_read_an_encoder_alone(trained_run, tmp_path, capsys):
    from xspec.cli import main

    assert main(["show", str(trained_run)]) == 0
    shown = capsys.readouterr().out
    assert "masked language model" in shown and f"xspec fill {trained_run} --text" in shown
    assert main(["viz", "--attention", str(trained_run), "--sentence", "the dog is small", "-o",
                 str(tmp_path / "maps.png")]) == 0
    assert (tmp_path / "maps.png").stat().st_size > 0
