"""Padding each forward pass up to one of a few lengths (train.length_buckets), so that a run's passes
take few shapes: on a CPU each new shape costs bf16 autocast kernels of its own, and torch.compile a
compilation of its own (docs/runtime.md). The lengths are chosen from the training data, as those that
pad its examples least; the padding they add is what the log reports. Padding is masked (PAD tokens
after each row, NO_LABEL labels, sources' padding marked), so the losses are those of the unpadded
passes, and an update keeps its sentences and its token count."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .batching import NO_LABEL, Batch, micro_batches
from .vocab import PAD


def fewest_padding_lengths(lengths: Sequence[int], count: int) -> tuple[int, ...]:
    """At most `count` lengths, the longest of `lengths` among them, such that padding every length up to
    the next of them adds the fewest positions (dynamic programming over the distinct lengths)."""
    values, counts = np.unique(np.asarray(lengths, dtype=np.int64), return_counts=True)
    if len(values) <= count:
        return tuple(int(v) for v in values)
    # cost[i, j]: positions added by padding values[i..j] up to values[j]
    weighted = np.concatenate([[0], np.cumsum(counts * values)])
    many = np.concatenate([[0], np.cumsum(counts)])

    def cost(first: np.ndarray, last: int) -> np.ndarray:
        return (many[last + 1] - many[first]) * values[last] - (weighted[last + 1] - weighted[first])

    n = len(values)
    best = many[1:] * values - weighted[1:]          # one length: everything padded up to values[j]
    links = []                                       # per added length: the length before values[j], or -1
    for _ in range(1, count):
        following, previous = best.copy(), np.full(n, -1, dtype=np.int64)
        for j in range(1, n):
            splits = np.arange(j)
            options = best[splits] + cost(splits + 1, j)
            at = int(np.argmin(options))
            if options[at] < following[j]:
                following[j], previous[j] = options[at], at
        best = following
        links.append(previous)
    chosen, j = [int(values[-1])], n - 1
    for previous in reversed(links):
        if previous[j] >= 0:
            j = int(previous[j])
            chosen.append(int(values[j]))
    return tuple(sorted(chosen))


@dataclass(frozen=True)
class LengthBuckets:
    """The lengths a pass's targets (and sources) are padded up to."""

    targets: tuple[int, ...]
    sources: tuple[int, ...] = ()

    @classmethod
    def chosen(cls, src_lens: Sequence[int], tgt_lens: Sequence[int], count: int) -> "LengthBuckets":
        """From the examples' lengths: a target's input is BOS + its tokens, a source its tokens with EOS."""
        has_source = any(src_lens)
        return cls(fewest_padding_lengths([t + 1 for t in tgt_lens], count),
                   fewest_padding_lengths(src_lens, count) if has_source else ())

    def padded(self, batch: Batch) -> Batch:
        """`batch` with its targets (and sources) padded up to their lengths' buckets."""
        if len(batch.inputs) == 1:
            (tokens,) = batch.inputs
            length = _up(tokens.size(1), self.targets)
            return Batch((_longer(tokens, length, PAD),), _longer(batch.labels, length, NO_LABEL),
                         batch.target_tokens)
        if len(batch.inputs) == 2:      # a masked LM's texts and their padding, labelled where masked
            tokens, padding = batch.inputs
            length = _up(tokens.size(1), self.sources)
            return Batch((_longer(tokens, length, PAD), _longer(padding, length, True)),
                         _longer(batch.labels, length, NO_LABEL), batch.target_tokens)
        src, tgt_in, src_padding = batch.inputs
        source, target = _up(src.size(1), self.sources), _up(tgt_in.size(1), self.targets)
        return Batch((_longer(src, source, PAD), _longer(tgt_in, target, PAD), _longer(src_padding, source, True)),
                     _longer(batch.labels, target, NO_LABEL), batch.target_tokens)

    def padded_lengths(self, src_lens: Sequence[int], tgt_lens: Sequence[int]) -> list[int]:
        """Each example's length in a padded pass (batching.padded_lengths), up to its buckets."""
        return [max(_up(s, self.sources) if s else 0, _up(t + 1, self.targets)) for s, t in zip(src_lens, tgt_lens)]

    def added(self, src_lens: Sequence[int], tgt_lens: Sequence[int], max_tokens: int) -> float:
        """The share the buckets add to the padded positions of the micro-batches of these examples."""
        before = after = 0
        for batch in micro_batches(list(src_lens), list(tgt_lens), max_tokens):
            source = max(src_lens[i] for i in batch)
            target = max(tgt_lens[i] for i in batch) + 1
            before += len(batch) * (source + target)
            after += len(batch) * ((_up(source, self.sources) if source else 0) + _up(target, self.targets))
        return after / before - 1 if before else 0.0

    def describe(self) -> str:
        text = f"targets {', '.join(map(str, self.targets))}"
        return text + (f"; sources {', '.join(map(str, self.sources))}" if self.sources else "")


def _longer(x: torch.Tensor, length: int, value: int | bool) -> torch.Tensor:
    """x [B, T] with `value` after each row up to `length` columns."""
    if x.size(1) >= length:
        return x
    return torch.cat([x, x.new_full((x.size(0), length - x.size(1)), value)], dim=1)


def _up(length: int, lengths: tuple[int, ...]) -> int:
    """The smallest of `lengths` at least `length`; `length` itself past the longest."""
    at = bisect_left(lengths, length)
    return lengths[at] if at < len(lengths) else length
