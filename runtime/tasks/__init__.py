"""What a model is trained to do: the one piece of training that depends on it.

The training loop (runtime/loop.py) runs any model on any examples; a task knows its data. It reads
and checks the files of each split, gives the text the vocabulary is trained on, turns the text into
examples the loop batches, and scores the trained model at the end:

    translation.py      an encoder-decoder model: aligned source and target files, BLEU (§6.1)
    language_model.py   a decoder-only model: text files, perplexity and sampled continuations
    masked_lm.py        an encoder alone returning logits (BERT's): text files, masked tokens' loss and accuracy
    classification.py   an encoder alone scoring classes: text and label files, accuracy and macro F1

`task_for(spec)` picks the task from the model: an encoder and a decoder translate; a decoder alone
models language; an encoder alone fills masks, or, scoring classes, classifies texts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Protocol

import torch

from xspec.base.errors import UserError
from ..batching import Batch
from ..data_order import Window
from ..distributed import Context
from ..prepared.format import PreparedDir
from ..prepared.splits import open_split
from ..run_dir import DataFiles, PreparedSplit, Split
from ..vocab import Vocab


class Examples(Protocol):
    """What the loop reads of a split: lengths to batch by (an example's target tokens, EOS excluded,
    and its source tokens, 0 without a source), the batch of some examples, and the training split's
    windows (runtime/data_order.py). Held in memory (runtime/corpus.py, documents.py) or read from
    prepared directories as needed (runtime/prepared/examples.py), where only a validation split's
    `src_lens` and `tgt_lens` are ever asked for."""

    @property
    def src_lens(self) -> list[int]: ...

    @property
    def tgt_lens(self) -> list[int]: ...

    @property
    def longest_padded(self) -> int: ...

    def __len__(self) -> int: ...

    def window(self, number: int, seed: int) -> Window: ...

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


class SplitReader:
    """The reading every task does: each split given, prepared directories opened (the training split's
    read as needed, with its mixture weights; the others decoded to text) or plain files checked for size
    and read. A task says what its prepared directories hold (`prepared_kind`), how prepared text is
    decoded, and how its plain files are read."""

    prepared_kind: str                  # "parallel" or "text"

    def __init__(self) -> None:
        self.texts: dict = {}
        self.prepared: dict[str, list[PreparedDir]] = {}  # splits given as prepared directories
        self.weights: tuple[float, ...] = ()

    def read(self, data: DataFiles) -> list[str]:
        """Every file read and checked before any work is done; returns notes for the user."""
        notes = []
        for name, split in data.splits().items():
            if split is None:
                continue
            if isinstance(split, PreparedSplit):
                self.prepared[name] = open_split(split, self.prepared_kind,
                                                 "--data" if name == "train" else f"--{name}")
                if name == "train":
                    self.weights = split.weights
                else:
                    self.texts[name] = self.decoded(self.prepared[name])
                continue
            note = check_plain_size(split.files, name)
            if note is not None:
                notes.append(note)
            self.texts[name] = self.read_plain(name, split)
        return notes

    def decoded(self, dirs: list[PreparedDir]):
        """A validation or test split's prepared directories, as the task's text."""
        raise NotImplementedError

    def read_plain(self, name: str, split: Split):
        """A split's plain files, as the task's text."""
        raise NotImplementedError

    def settings(self) -> dict:
        return {}


class Task(Protocol):
    kind: str                         # "translation" or "language model", as run.json and messages say

    def demo_files(self, run_dir: Path) -> DataFiles: ...

    def read(self, data: DataFiles) -> list[str]: ...

    def vocab_text(self) -> Iterable[str]: ...

    def prepared_vocab(self) -> Optional[tuple[Path, bytes]]: ...

    def encode(self, vocab: Vocab, truncate: bool, vocab_path: str = "") -> Corpus: ...

    def evaluate(self, model: torch.nn.Module, vocab: Vocab, context: Context, run_dir: Path,
                 progress: bool) -> Optional[Outcome]: ...

    def settings(self) -> dict:
        """Spec parameters the data decides, once read (a classifier's label names), which the run's spec keeps."""
        ...


def task_for(spec) -> Task:
    from .classification import Classification
    from .language_model import LanguageModelling
    from .masked_lm import MaskedLanguageModelling
    from .translation import Translation

    if spec.masked_lm:
        return MaskedLanguageModelling(spec)
    if spec.classes is not None:
        return Classification(spec)
    if not spec.has_decoder:
        raise UserError(f"{spec.name}: an encoder alone whose output is not a score per vocabulary entry: xspec "
                        "trains translation models (encoder and decoder), language models (a decoder alone) and "
                        "masked language models (an encoder alone returning logits, BERT's)")
    return Translation(spec) if spec.has_encoder else LanguageModelling(spec)


# Training text files are read into memory (about 15 bytes a byte of text); beyond these sizes a run says
# to prepare them (`xspec data prepare`), which reads them as a stream, once.
PLAIN_TEXT_NOTE_BYTES = 100 << 20
PLAIN_TEXT_LIMIT_BYTES = 1 << 30


def check_plain_size(files: tuple[Path, ...], split: str) -> Optional[str]:
    """Refuses training text beyond what is read into memory; returns a note for the user (rank 0 says
    it) when it is large enough to be worth preparing."""
    size = sum(f.stat().st_size for f in files if f.is_file())
    if split != "train" or size <= PLAIN_TEXT_NOTE_BYTES:
        return None
    what = " ".join(str(f) for f in files)
    how = (f"xspec data prepare --src {files[0]} --tgt {files[1]} -o DIR" if len(files) == 2
           else f"xspec data prepare {what} -o DIR")
    if size > PLAIN_TEXT_LIMIT_BYTES:
        raise UserError(f"{what}: {size / 2**30:.1f} GiB of training text, more than xspec train reads into memory "
                        f"({PLAIN_TEXT_LIMIT_BYTES >> 30} GiB; about 15 bytes of memory a byte of text): prepare it "
                        f"once ({how}), then train with --data DIR, in memory that does not grow with the corpus")
    return (f"note: {what}: {size / 2**20:,.0f} MiB of training text is read into memory (about 15 bytes a byte) "
            f"at every start and resume; {how}, then --data DIR, reads it once, as a stream")


def max_sequence_tokens(spec) -> int:
    """The longest sequence the run feeds the model: the data section's limit, within the positions."""
    return min(spec.data.max_tokens, spec.max_positions or spec.data.max_tokens)
