"""Training examples read from prepared directories (format.py), never loaded whole.

What the loop reads of any examples (runtime/tasks `Examples`): `window(number, seed)` (runtime/data_order.py:
the lengths of one window's examples and their ids) and `collate(ids)`, which reads just those
examples' tokens from the memory-mapped shards. Each process reads only the slices its own passes need.

    PreparedText    a language model's documents: blocks of `block_size` predictions over the stream
                    EOS d1 EOS d2 ... EOS (blocks), or one document a sequence, EOS d EOS (lines)
    PreparedPairs   a translation corpus's sentence pairs: source + EOS, and the target
    Mixture         several of either, each window taking from each corpus its weight's share

Examples too long for the model are skipped (or truncated, with --truncate) as the in-memory path does,
when their window is formed; their number is counted once when the directory is opened, in bounded
memory. (A prepared validation or test split is decoded into text and read as a file is: splits.py.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xspec.base.errors import UserError
from xspec.base.text import printable, shown
from ..batching import Batch, collate, collate_sequences
from ..data_order import WINDOW, Permutation, Window, sequence_slice
from .format import PreparedDir
from ..vocab import EOS


class _Prepared:
    """What the prepared kinds share: their windows over the endless shuffled sequence of epochs."""

    prepared: PreparedDir
    count: int                          # examples, before any skipped as too long
    too_long: int
    truncate: bool

    def __len__(self) -> int:
        return self.count - (0 if self.truncate else self.too_long)

    def window(self, number: int, seed: int) -> Window:
        size = min(WINDOW, self.count)
        ids, epoch = sequence_slice(self.count, number * size, size, str(seed))
        return self.window_of(number, epoch, ids)

    def window_of(self, number: int, epoch: int, ids: np.ndarray) -> Window:
        src, tgt, kept = self.lengths(ids)
        return Window(number, epoch, src[kept].tolist(), tgt[kept].tolist(), ids[kept])

    def lengths(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source lengths, target lengths, kept) of examples `ids`, as batching reads them."""
        raise NotImplementedError

    @property
    def src_lens(self) -> list[int]:
        """Every example's, as the Examples protocol has it: lists as long as the corpus, which training
        never asks of a prepared corpus (it reads `window` and `longest_padded`)."""
        return self.lengths(np.arange(self.count))[0].tolist()

    @property
    def tgt_lens(self) -> list[int]:
        return self.lengths(np.arange(self.count))[1].tolist()

    @property
    def longest_padded(self) -> int:
        """The longest example's length in a padded batch, from the manifest (within the model's limits)."""
        raise NotImplementedError

    def summary(self, name: str) -> str:
        raise NotImplementedError

    def _skipped_note(self) -> str:
        if not self.too_long:
            return ""
        return f", {self.too_long:,} too long {'truncated' if self.truncate else 'skipped'}"


def _count_over(lengths, limit: int) -> int:
    """How many of the examples whose lengths come chunk by chunk are longer than `limit`."""
    return sum(int((chunk > limit).sum()) for chunk in lengths)


class PreparedText(_Prepared):
    """`mode` "blocks": `size` predictions a block; "lines": a document a sequence of at most `size` inputs."""

    def __init__(self, prepared: PreparedDir, mode: str, size: int, truncate: bool) -> None:
        if prepared.kind != "text":
            raise UserError(f"{shown(prepared.path)}: a translation corpus (sentence pairs); a language model trains "
                            "on prepared text (xspec data prepare TEXT... -o DIR)")
        self.prepared, self.mode, self.size, self.truncate = prepared, mode, size, truncate
        self.stream, self.offsets = prepared.streams["tokens"], prepared.offsets["documents"]
        if mode == "blocks":
            self.count = -(-(len(self.stream) - 1) // size)
            self.too_long = 0
        else:
            self.count = prepared.manifest.examples
            # a document of L tokens spans L + 1 offsets, and has L + 1 inputs: EOS and its tokens
            self.too_long = _count_over(prepared.example_lengths("documents"), size)
        if not len(self):
            raise UserError(f"{shown(prepared.path)}: every document is longer than {size} tokens; raise "
                            "data.max_tokens or pass --truncate")

    def lengths(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.mode == "blocks":
            starts = ids * self.size
            tokens = np.minimum(starts + self.size + 1, len(self.stream)) - starts
            return np.zeros_like(ids), tokens - 2, np.ones(len(ids), dtype=bool)
        doc = np.asarray(self.offsets[ids + 1]) - np.asarray(self.offsets[ids]) - 1
        kept = np.ones(len(ids), dtype=bool) if self.truncate else doc <= self.size - 1
        return np.zeros_like(ids), np.minimum(doc, self.size - 1), kept

    @property
    def longest_padded(self) -> int:
        if self.mode == "blocks":
            return self.size
        return min(self.prepared.manifest.longest["tokens"], self.size - 1) + 1

    def sequences(self, ids: list[int]) -> list[list[int]]:
        rows = []
        for i in ids:
            if self.mode == "blocks":
                start = i * self.size
                rows.append(self.stream.read(start, min(start + self.size + 1, len(self.stream))).tolist())
            else:
                start, end = int(self.offsets[i]), int(self.offsets[i + 1])
                row = self.stream.read(start, end + 1).tolist()
                rows.append(row if len(row) <= self.size + 1 else row[:self.size] + [EOS])
        return rows

    def collate(self, ids: list[int]) -> Batch:
        rows = self.sequences(ids)
        return collate_sequences(list(range(len(rows))), rows)

    def token_counts(self) -> np.ndarray:
        """How often each id is predicted in the training stream: every id but the first EOS, which is
        context only."""
        counts = np.zeros(self.prepared.pieces, dtype=np.int64)      # read from the vocabulary itself
        for chunk in self.prepared.id_chunks("tokens"):
            counts += np.bincount(chunk, minlength=len(counts))
        counts[EOS] -= 1
        return counts

    def summary(self, name: str) -> str:
        manifest = self.prepared.manifest
        unit = f"blocks of {self.size}" if self.mode == "blocks" else "sequences"
        return (f"{name}: prepared {shown(self.prepared.path)}, {manifest.examples:,} documents, "
                f"{manifest.tokens['tokens']:,} tokens, {self.count:,} {unit}{self._skipped_note()} "
                f"(read as needed, windows of {min(WINDOW, self.count):,})")


class PreparedPairs(_Prepared):
    """Sentence pairs with each side at most `max_tokens` with its EOS or BOS."""

    def __init__(self, prepared: PreparedDir, max_tokens: int, truncate: bool) -> None:
        if prepared.kind != "parallel":
            raise UserError(f"{shown(prepared.path)}: a language model's text; a translation model trains on a "
                            "prepared translation corpus (xspec data prepare --src FILE --tgt FILE -o DIR)")
        self.prepared, self.truncate, self.limit = prepared, truncate, max_tokens - 1
        self.source, self.target = prepared.streams["source"], prepared.streams["target"]
        self.src_offsets, self.tgt_offsets = prepared.offsets["source"], prepared.offsets["target"]
        self.count = prepared.manifest.examples
        longer = (np.maximum(s, t)
                  for s, t in zip(prepared.example_lengths("source"), prepared.example_lengths("target")))
        self.too_long = _count_over(longer, self.limit)
        if not len(self):
            raise UserError(f"{shown(prepared.path)}: every sentence is longer than {max_tokens} tokens; raise "
                            "data.max_tokens or pass --truncate")

    def lengths(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        src = np.asarray(self.src_offsets[ids + 1]) - np.asarray(self.src_offsets[ids])
        tgt = np.asarray(self.tgt_offsets[ids + 1]) - np.asarray(self.tgt_offsets[ids])
        kept = np.ones(len(ids), dtype=bool) if self.truncate else np.maximum(src, tgt) <= self.limit
        return np.minimum(src, self.limit) + 1, np.minimum(tgt, self.limit), kept

    @property
    def longest_padded(self) -> int:
        longest = self.prepared.manifest.longest
        return max(min(longest["source"], self.limit) + 1, min(longest["target"], self.limit) + 1)

    def pairs(self, ids: list[int]) -> tuple[list[list[int]], list[list[int]]]:
        sources, targets = [], []
        for i in ids:
            src = self.source.read(int(self.src_offsets[i]), int(self.src_offsets[i + 1]))[:self.limit].tolist()
            sources.append(src + [EOS])
            tgt = self.target.read(int(self.tgt_offsets[i]), int(self.tgt_offsets[i + 1]))[:self.limit].tolist()
            targets.append(tgt)
        return sources, targets

    def collate(self, ids: list[int]) -> Batch:
        sources, targets = self.pairs(ids)
        return collate(list(range(len(ids))), sources, targets)

    def summary(self, name: str) -> str:
        return (f"{name}: prepared {shown(self.prepared.path)}, {self.count:,} sentence pairs{self._skipped_note()} "
                f"(read as needed, windows of {min(WINDOW, self.count):,})")


@dataclass
class Part:
    examples: _Prepared
    weight: float                       # its share of each window's examples, the weights summing to 1
    base: int                           # its examples' global ids start here


class Mixture:
    """Corpora mixed by weight: each window takes round(WINDOW x weight) examples of each one, from its own
    endless shuffled sequence (a small corpus repeats sooner than a large one)."""

    def __init__(self, parts: list[tuple[_Prepared, float]]) -> None:
        self.parts, base = [], 0
        for (examples, _), share in zip(parts, shares([weight for _, weight in parts])):
            self.parts.append(Part(examples, share, base))
            base += examples.count
        self.bases = np.array([p.base for p in self.parts] + [base], dtype=np.int64)
        self.take = [max(1, round(min(WINDOW, base) * p.weight)) for p in self.parts]

    def __len__(self) -> int:
        return sum(len(p.examples) for p in self.parts)

    @property
    def count(self) -> int:
        return int(self.bases[-1])

    def window(self, number: int, seed: int) -> Window:
        src, tgt, ids, source_of, epoch = [], [], [], [], None
        for c, (part, take) in enumerate(zip(self.parts, self.take)):
            local, part_epoch = sequence_slice(part.examples.count, number * take, take, f"{seed}:{c}")
            window = part.examples.window_of(number, part_epoch, local)
            assert window.ids is not None       # window_of's windows carry their examples' ids
            epoch = part_epoch if epoch is None else epoch
            src += window.src_lens
            tgt += window.tgt_lens
            ids.append(window.ids + part.base)
            source_of.append(np.full(len(window.ids), c, dtype=np.int64))
        # Shuffled together, so that examples of equal length from different corpora share micro-batches.
        order = Permutation(len(src), f"{seed}:mix", number)(np.arange(len(src))) if src else np.zeros(0, np.int64)
        ids, source_of = np.concatenate(ids)[order], np.concatenate(source_of)[order]
        return Window(number, epoch or 0, [src[i] for i in order.tolist()], [tgt[i] for i in order.tolist()], ids,
                      source_of)

    def collate(self, ids: list[int]) -> Batch:
        corpus = np.searchsorted(self.bases, ids, side="right") - 1
        first = self.parts[0].examples
        if isinstance(first, PreparedText):
            rows = [self.parts[c].examples.sequences([i - self.parts[c].base])[0] for c, i in zip(corpus.tolist(), ids)]
            return collate_sequences(list(range(len(rows))), rows)
        sources, targets = [], []
        for c, i in zip(corpus.tolist(), ids):
            s, t = self.parts[c].examples.pairs([i - self.parts[c].base])
            sources += s
            targets += t
        return collate(list(range(len(ids))), sources, targets)

    @property
    def longest_padded(self) -> int:
        return max(p.examples.longest_padded for p in self.parts)

    def token_counts(self) -> np.ndarray:
        """A language model's: how often each id is predicted, over every corpus (each counted once)."""
        counts = [p.examples.token_counts() for p in self.parts if isinstance(p.examples, PreparedText)]
        return np.sum(counts, axis=0)

    def summary(self, name: str) -> str:
        lines = [p.examples.summary(f"{name} ({p.weight:.0%} of each window)") for p in self.parts]
        return "; ".join(lines)


def shares(weights: list[float]) -> list[float]:
    """Positive finite weights as shares that sum to 1. They are scaled by the largest first: summed as
    given, weights near the float's limit (1e308 each) would overflow to infinity and every share be 0."""
    largest = max(weights)
    scaled = [weight / largest for weight in weights]
    total = sum(scaled)
    return [weight / total for weight in scaled]


def parse_data_argument(text: str) -> list[tuple[Path, float]]:
    """`--data DIR` or `--data DIR:WEIGHT,DIR:WEIGHT,...` (weights need not sum to 1)."""
    parts: list[tuple[Path, float]] = []
    given = printable(text)
    for item in text.split(","):
        item = item.strip()
        path, weight = item, 1.0
        head, sep, tail = item.rpartition(":")
        if sep and head:
            try:
                weight = float(tail)
            except ValueError:
                raise UserError(f"--data {given}: '{printable(item)}': the weight after ':' is not a number") from None
            path = head
        if not path:
            raise UserError(f"--data {given}: an empty directory name")
        if not (weight > 0 and weight < float("inf")):
            raise UserError(f"--data {given}: '{printable(item)}': a weight is a positive number")
        if any(os.path.realpath(path) == os.path.realpath(seen) for seen, _ in parts):
            raise UserError(f"--data {given}: '{printable(path)}' is given twice; a corpus is mixed in once, "
                            "its weight after ':' (DIR:2 for twice its share)")
        parts.append((Path(path), weight))
    if len(parts) > 64:
        raise UserError(f"--data: {len(parts)} corpora; at most 64 are mixed")
    return parts
