"""What the encoder-decoder import tests share: a training pair's loss as xspec's translation task makes its
batch and as transformers' seq2seq training does (labels from `text_target`, padding ignored)."""

from __future__ import annotations

from pathlib import Path

import torch


def pair_losses(trained, tokenizer, model, sources: list[str], targets: list[str],
                folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(xspec's loss, transformers') of the pairs: `trained` an imported run (xspec.load), `tokenizer` and `model`
    the checkpoint as transformers loads it."""
    from xspec.runtime.corpus import ParallelText
    from xspec.runtime.tasks.translation import Translation

    task = Translation(trained.spec)
    task.texts = {"train": ParallelText(sources, targets, list(range(1, len(sources) + 1)), folder)}
    batch = task.encode(trained.tokenizer, truncate=False).train.collate(list(range(len(sources))))
    src, tgt_in, padding = batch.inputs
    with torch.no_grad():
        ours = torch.nn.functional.cross_entropy(trained.model(src, tgt_in, padding).flatten(0, 1),
                                                 batch.labels.flatten(), ignore_index=-100)
        inputs = tokenizer(sources, text_target=targets, return_tensors="pt", padding=True)
        inputs["labels"] = inputs["labels"].masked_fill(inputs["labels"] == tokenizer.pad_token_id, -100)
        return ours, model.eval()(**inputs).loss
