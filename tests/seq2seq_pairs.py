"""What the encoder-decoder import tests share: a training pair's loss as xspec's translation task makes its
batch and as transformers' seq2seq training does (labels from `text_target`, padding ignored)."""

from __future__ import annotations

from pathlib import Path

import torch


def pair_losses(trained, tokenizer, model, sources: list[str], targets: list[str], folder: Path,
                language: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(xspec's loss, transformers') of the pairs: `trained` an imported run (xspec.load), `tokenizer` and `model`
    the checkpoint as transformers loads it; `language` the targets' code (--tgt-lang) where the tokenizer frames a
    text with one."""
    from xspec.runtime.corpus import ParallelText
    from xspec.runtime.tasks.translation import Translation

    spec = trained.spec if language is None else trained.spec.with_overrides({"decode.forced_bos": language})
    task = Translation(spec)
    task.texts = {"train": ParallelText(sources, targets, list(range(1, len(sources) + 1)), folder)}
    batch = task.encode(trained.tokenizer, truncate=False).train.collate(list(range(len(sources))))
    src, tgt_in, padding = batch.inputs
    with torch.no_grad():
        ours = torch.nn.functional.cross_entropy(trained.model(src, tgt_in, padding).flatten(0, 1),
                                                 batch.labels.flatten(), ignore_index=-100)
        inputs = tokenizer(sources, text_target=targets, return_tensors="pt", padding=True)
        inputs["labels"] = inputs["labels"].masked_fill(inputs["labels"] == tokenizer.pad_token_id, -100)
        return ours, model.eval()(**inputs).loss


def fine_tuned_losses(run: Path, lines: list[str], folder: Path) -> list[float]:
    """The validation losses of `train --init run` on pairs of `lines` and their words reversed (the lines
    eight times over to train on, once to validate), four validations in all."""
    import json

    from xspec.cli import main

    for split, chosen in (("train", lines * 8), ("valid", lines)):
        (folder / f"{split}.src").write_text("\n".join(chosen) + "\n")
        (folder / f"{split}.tgt").write_text("\n".join(" ".join(line.split()[::-1]) for line in chosen) + "\n")
    tuned = folder / "tuned"
    assert main(["train", "--init", str(run), "--train-src", str(folder / "train.src"),
                 "--train-tgt", str(folder / "train.tgt"), "--valid-src", str(folder / "valid.src"),
                 "--valid-tgt", str(folder / "valid.tgt"), "-o", str(tuned), "--no-test", "--no-tensorboard",
                 "--no-progress", "--set", "train.epochs=12", "--set", "train.validate_every_steps=3",
                 "--set", "train.lr=0.01", "--set", "train.warmup_fraction=0.01",
                 "--set", "train.batch_tokens=400"]) == 0
    return [json.loads(line)["valid_loss"] for line in (tuned / "metrics.jsonl").read_text().splitlines()
            if "valid_loss" in line]
