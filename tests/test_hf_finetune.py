"""Fine-tuning an import with `xspec train --init` (every family's few training steps are in
test_hf_import.py): it runs end to end, keeps the tokenizer, and its run exports back to a checkpoint
transformers loads with the fine-tuned model's logits."""

from __future__ import annotations

import json
import random

import pytest
import torch

import xspec
from float32 import assert_close
from hf_checkpoints import BOS, EOS, imported

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def text(lines: int, seed: int) -> list[str]:
    draw = random.Random(seed)
    return [" ".join(f"w{draw.randint(3, 40)}" for _ in range(draw.randint(3, 10))) for _ in range(lines)]


def test_train_init_fine_tunes_an_import_and_the_result_exports_back(tmp_path, capsys):
    from xspec.cli import main

    for split, seed in (("train", 2), ("valid", 3)):
        (tmp_path / f"{split}.txt").write_text("\n".join(text(60, seed)) + "\n")
    run = imported("gemma3")
    tuned = tmp_path / "tuned"
    assert main(["train", "--init", str(run), "--train", str(tmp_path / "train.txt"), "--valid",
                 str(tmp_path / "valid.txt"), "-o", str(tuned), "--no-test", "--no-tensorboard", "--no-progress",
                 "--set", "train.max_steps=2", "--set", "train.validate_every_steps=2", "--set",
                 "train.batch_tokens=256"]) == 0
    assert f"starting from the weights of {run}/checkpoints/step-00000000.safetensors" in capsys.readouterr().out
    with torch.no_grad():       # the rest only runs the models
        before, after = xspec.load(run, device="cpu"), xspec.load(tuned, device="cpu")
        described = after.tokenizer.describe()    # the import's, kept through fine-tuning for an export
        assert described == {**before.tokenizer.describe(), "kind": "tokenizers", "bos_id": BOS, "eos_ids": [EOS],
                             "add_bos": True, "add_eos": False}
        assert described["hf_files"]["config.json"]["model_type"] == "gemma3_text"
        assert after.tokenizer.encode(["w7 w8"]) == [[7, 8]]
        ids = torch.randint(3, 40, (1, 9), generator=torch.Generator().manual_seed(4))
        changed = (after.model(ids) - before.model(ids)).abs().max().item()
        assert 0 < changed
        steps = [json.loads(line) for line in (tuned / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in steps if "loss" in r] == [1, 2]

        exported = tmp_path / "exported"
        assert main(["export", str(tuned), "--format", "hf", "-o", str(exported)]) == 0
        reloaded = transformers.Gemma3ForCausalLM.from_pretrained(exported, dtype=torch.float32,
                                                                 attn_implementation="eager").eval()
        assert_close(reloaded(ids).logits, after.model(ids))
        assert json.loads((exported / "config.json").read_text())["bos_token_id"] == BOS


def test_train_init_starts_from_the_fine_tuning_recipe_for_one_pass_over_the_data(tmp_path, capsys):
    """No --set: AdamW, a cosine schedule from 5e-5 after a short warm-up, no label smoothing, and as many
    steps as one pass over the data takes; the log says the recipe. A from-scratch run whose warm-up
    outlasts it says so."""
    from xspec.cli import main

    for split, seed in (("train", 4), ("valid", 5)):
        (tmp_path / f"{split}.txt").write_text("\n".join(text(120, seed)) + "\n")
    run = imported("qwen3")
    assert main(["train", "--init", str(run), "--train", str(tmp_path / "train.txt"), "--valid",
                 str(tmp_path / "valid.txt"), "-o", str(tmp_path / "tuned"), "--no-test", "--no-tensorboard",
                 "--no-progress", "--set", "train.batch_tokens=64", "--set", "data.block_size=32"]) == 0
    out = capsys.readouterr().out
    assert "fine-tuning recipe (--init): optimizer adamw, adam_betas 0.9, 0.999, adam_eps 1e-08, weight_decay 0.01, " \
           "lr_schedule cosine, lr 5e-05, warmup_fraction 0.03, label_smoothing 0.0, clip_norm 1.0, epochs 1, " \
           "lora_rank 0;" in out
    steps = int(out.split("train.epochs = 1: ")[1].split(" updates")[0])
    assert 3 < steps < 40 and "warning: train.warmup_steps" not in out
    lrs = [r["lr"] for r in map(json.loads, (tmp_path / "tuned" / "metrics.jsonl").read_text().splitlines())
           if "lr" in r]
    assert len(lrs) == steps and lrs[0] == pytest.approx(5e-5) and lrs[-1] < 0.05 * 5e-5
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))           # after its one step of warm-up, a cosine down

    assert main(["train", "specs/lm.xspec", "--set", "d_model=16", "--set", "d_ff=32", "--set", "layers=1",
                 "--set", "train.max_steps=2", "--set", "train.batch_tokens=256", "-o", str(tmp_path / "scratch"),
                 "--no-test", "--no-tensorboard", "--no-progress"]) == 0
    assert "warning: train.warmup_steps 400 is not shorter than the run's 2 steps: the learning rate never leaves " \
           "its warm-up" in capsys.readouterr().out


def test_token_id_0_is_a_label_like_any_other():
    """Padding labels are NO_LABEL, not PAD (0): an imported tokenizer's id 0 (Llama 3's "!") is trained and
    scored like every other token."""
    from xspec.runtime.batching import NO_LABEL, collate_sequences

    batch = collate_sequences([0, 1], [[BOS, 0, 5, EOS], [BOS, 7, EOS]])
    assert batch.labels.tolist() == [[0, 5, EOS], [7, EOS, NO_LABEL]] and batch.target_tokens == 5


def test_a_sentencepiece_tokenizer_model_is_read_with_the_checkpoints_own_ids(tmp_path):
    """A checkpoint's tokenizer.model (Llama 2's, Gemma's kind) reads text with sentencepiece; BOS and EOS
    are the config's ids, left out of decoded text."""
    import io

    import sentencepiece as spm

    from xspec.hf.tokenizer import find_tokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text(200, 7)), model_writer=model, vocab_size=40,
                                   model_type="bpe", minloglevel=2)
    (tmp_path / "tokenizer.model").write_bytes(model.getvalue())
    tokenizer = find_tokenizer(tmp_path, {"bos_token_id": 1, "eos_token_id": [2, 5]})
    assert (tokenizer.kind, tokenizer.document_start, tokenizer.document_end) == ("sentencepiece", 1, 2)
    ids = tokenizer.encode(["w3 w12 w7"])[0]
    assert len(ids) >= 3 and tokenizer.decode([1, *ids, 2]) == "w3 w12 w7"
