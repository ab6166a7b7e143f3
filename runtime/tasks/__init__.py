"""What a model is trained to do: the one piece of training that depends on it.

The training loop (runtime/loop.py) runs any model on any examples; a task knows its data. It reads
and checks the files of each split, gives the text the vocabulary is trained on, turns the text into
examples the loop batches, and scores the trained model at the end:

    translation.py      an encoder-decoder model: aligned source and target files, BLEU (§6.1)
    language_model.py   a decoder-only model: text files, perplexity and sampled continuations

`task_for(spec)` picks the task from the model: an encoder and a decoder translate; a decoder alone
models language.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Protocol

import torch

from xspec.errors import UserError
from xspec.runtime.batching import Batch
from xspec.runtime.distributed import Context
from xspec.runtime.run_dir import DataFiles
from xspec.runtime.vocab import Vocab


class Examples(Protocol):
    """What the loop reads of a split: lengths to batch by (an example's target tokens, EOS excluded,
    and its source tokens, 0 without a source) and the batch of some examples."""

    @property
    def src_lens(self) -> list[int]: ...

    @property
    def tgt_lens(self) -> list[int]: ...

    def __len__(self) -> int: ...

    def collate(self, indices: list[int]) -> Batch: ...

    def summary(self, name: str) -> str: ...


@dataclass
class Corpus:
    train: Examples
    valid: Optional[Examples]


@dataclass
class Outcome:
    """A finished run's test figures (for metrics.json) and the lines that report them."""

    metrics: dict
    lines: list[str]


class Task(Protocol):
    kind: str                         # "translation" or "language model", as run.json and messages say

    def demo_files(self, run_dir: Path) -> DataFiles: ...

    def read(self, data: DataFiles) -> None: ...

    def vocab_text(self) -> Iterable[str]: ...

    def encode(self, vocab: Vocab, truncate: bool) -> Corpus: ...

    def evaluate(self, model: torch.nn.Module, vocab: Vocab, context: Context, run_dir: Path,
                 progress: bool) -> Optional[Outcome]: ...


def task_for(spec) -> Task:
    from xspec.runtime.tasks.language_model import LanguageModelling
    from xspec.runtime.tasks.translation import Translation

    if not spec.has_decoder:
        raise UserError(f"{spec.name}: an encoder-only model (no decoder, so no logits): xspec trains "
                        "translation models (encoder and decoder) and language models (a decoder alone)")
    return Translation(spec) if spec.has_encoder else LanguageModelling(spec)


def max_sequence_tokens(spec) -> int:
    """The longest sequence the run feeds the model: the data section's limit, within the positions."""
    return min(spec.data.max_tokens, spec.max_positions or spec.data.max_tokens)
