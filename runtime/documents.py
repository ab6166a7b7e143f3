"""Text for language models: one document (or sentence) a line, made into sequences in which every
position predicts the next token.

A document is read as EOS, its tokens, EOS: the EOS before it is the context its first token is predicted
from (as after the previous document), the one after it ends it. In `blocks` mode the documents follow
each other in one stream, `EOS d1 EOS d2 EOS ...`, cut into blocks of `block_size` predictions (a block
of n inputs is n + 1 tokens: consecutive blocks share one); in `lines` mode each document is a sequence
of its own, padded in its batch.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from xspec.base.errors import UserError
from xspec.base.text import shown
from .batching import Batch, collate_sequences
from .corpus import read_lines
from .data_order import WholeCorpusWindows
from .vocab import EOS, Tokenizer


@dataclass
class Documents:
    """The non-empty lines of a text file (stripped), with how many empty ones were skipped."""

    lines: list[str]
    path: Path
    empty_skipped: int = 0


@contextmanager
def lines_named(docs: Documents) -> Iterator[None]:
    """Inside, a document that an imported checkpoint's tokenizer cannot encode (runtime/tokenizer.py's
    TokenizingError, which counts the lines given to `encode`: docs.lines) is named by its file and line."""
    from .tokenizer import TokenizingError

    try:
        yield
    except TokenizingError as error:
        raise error.at(f"{shown(docs.path)}:{_line_number(docs.path, error.index)}") from None


def _line_number(path: Path, index: int) -> int:
    """The line of `path` holding its `index`-th non-empty line (read again: only an error needs it; a prepared
    split, decoded back into lines, is counted as they are)."""
    try:
        lines = read_lines(path)
    except UserError:
        return index + 1
    kept = -1
    for number, line in enumerate(lines, start=1):
        kept += bool(line.strip())
        if kept == index:
            return number
    return index + 1


def read_documents(path: Path) -> Documents:
    lines = read_lines(path)
    kept = [line.strip() for line in lines if line.strip()]
    if not kept:
        raise UserError(f"{path}: no text (every line is empty)")
    return Documents(kept, Path(path), empty_skipped=len(lines) - len(kept))


@dataclass
class EncodedText(WholeCorpusWindows):
    """Sequences of at least 2 tokens: the inputs are a sequence but its last token, the labels it but its
    first. Batching reads them as targets (`tgt_lens`: predictions - 1) with empty sources."""

    sequences: list[list[int]]
    documents: int
    mode: str
    empty_skipped: int = 0
    too_long: int = 0                  # lines mode: skipped, or truncated when `truncated`
    truncated: bool = False

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def src_lens(self) -> list[int]:
        return [0] * len(self.sequences)

    @property
    def tgt_lens(self) -> list[int]:
        return [len(s) - 2 for s in self.sequences]

    @property
    def predictions(self) -> int:
        return sum(len(s) - 1 for s in self.sequences)

    def collate(self, indices: list[int]) -> Batch:
        return collate_sequences(indices, self.sequences)

    def summary(self, name: str) -> str:
        unit = "blocks" if self.mode == "blocks" else "sequences"
        parts = [f"{name}: {self.documents} documents, {self.predictions:,} tokens to predict, "
                 f"{len(self)} {unit}"]
        if self.empty_skipped:
            parts.append(f"{self.empty_skipped} empty lines skipped")
        if self.too_long:
            parts.append(f"{self.too_long} too long {'truncated' if self.truncated else 'skipped'}")
        return ", ".join(parts)


def document_sequence(ids: list[int], vocab: Tokenizer | None = None) -> list[int]:
    """A document as the model reads it: EOS, its tokens, EOS (an imported tokenizer's own start and end)."""
    if vocab is None:
        return [EOS, *ids, EOS]
    return [vocab.document_start, *ids, vocab.document_end]


def windows(sequence: list[int], size: int) -> list[list[int]]:
    """`sequence` cut into pieces of at most `size` inputs (size + 1 tokens), consecutive pieces sharing a
    token, so that every token after the first is predicted exactly once."""
    return [sequence[i:i + size + 1] for i in range(0, len(sequence) - 1, size)]


def encode_documents(docs: Documents, vocab: Tokenizer, mode: str, size: int, truncate: bool) -> EncodedText:
    """`size`: a block's predictions (blocks), or the most inputs of a line's sequence (lines)."""
    with lines_named(docs):
        encoded = vocab.encode(docs.lines)
    if mode == "blocks":
        stream = [vocab.document_start]
        for ids in encoded:
            stream += ids
            stream.append(vocab.document_end)
        return EncodedText(windows(stream, size), len(encoded), mode, docs.empty_skipped)
    out = EncodedText([], len(encoded), mode, docs.empty_skipped, truncated=truncate)
    for ids in encoded:
        if len(ids) + 1 > size:            # the inputs are EOS + the tokens
            out.too_long += 1
            if not truncate:
                continue
            ids = ids[:size - 1]
        out.sequences.append(document_sequence(ids, vocab))
    out.documents = len(out.sequences)
    return out
