"""The order examples are trained in: windows of the corpus, each planned into updates (runtime/batching.py).

A corpus in memory is one window an epoch, its examples in their own order (the plan shuffles its
micro-batches per epoch): the plan of earlier versions. A prepared corpus (runtime/prepared) is read as
an endless sequence of examples, epoch after epoch, each epoch a pseudo-random permutation of the
examples (`Permutation`: a keyed bijection computed per position, so no permutation is ever held in
memory), cut into windows of at most WINDOW examples. Each window is planned on its own, like an
epoch of a small corpus: bucketing by length within a window keeps the padding of a whole-corpus plan
while the memory it takes stays that of one window, whatever the corpus size.

Everything depends on (seed, window number) alone, not on the number of processes: a checkpoint's
(window, update) names the same examples on any world size.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import numpy as np

from .batching import padded_lengths

if TYPE_CHECKING:
    from .length_buckets import LengthBuckets

WINDOW = 65_536                     # examples planned together (about 65 of the paper's updates)


@dataclass
class Window:
    """One window's examples: their lengths (what batching reads) and, for a streamed corpus, the global
    example id of each local one (None: the local ids are the global ones)."""

    number: int
    epoch: int                          # the epoch its first example belongs to
    src_lens: list[int]
    tgt_lens: list[int]
    ids: Optional[np.ndarray] = None
    source_of: Optional[np.ndarray] = None     # a mixture: which corpus each local example comes from
    _padded: Optional[list[int]] = field(default=None, repr=False)
    _bucketed: Optional[list[int]] = field(default=None, repr=False)

    def global_ids(self, local: list[int]) -> list[int]:
        return local if self.ids is None else self.ids[local].tolist()

    @property
    def padded(self) -> list[int]:
        """Each example's length in a padded batch."""
        if self._padded is None:
            self._padded = padded_lengths(self.src_lens, self.tgt_lens)
        return self._padded

    def padded_in(self, buckets: Optional["LengthBuckets"]) -> list[int]:
        """Each example's length in a padded pass, up to its length's bucket where there are buckets."""
        if buckets is None:
            return self.padded
        if self._bucketed is None:
            self._bucketed = buckets.padded_lengths(self.src_lens, self.tgt_lens)
        return self._bucketed


class WholeCorpusWindows:
    """For examples held in memory: window n is epoch n, every example in its own order."""

    @property
    def src_lens(self) -> list[int]:        # each subclass's own
        raise NotImplementedError

    @property
    def tgt_lens(self) -> list[int]:
        raise NotImplementedError

    def window(self, number: int, seed: int) -> Window:
        return Window(number, number, self.src_lens, self.tgt_lens)

    @property
    def longest_padded(self) -> int:
        return max(padded_lengths(self.src_lens, self.tgt_lens))


# --- a permutation of [0, n) without holding it --------------------------------------------------

_ROUNDS = 4
_MASK64 = (1 << 64) - 1


class Permutation:
    """A bijection of [0, n) keyed by (key, epoch): a balanced Feistel network over the smallest
    power-of-four domain holding n, with cycle walking (a value that lands at n or beyond is permuted
    again until it does not; the walk ends because the network is a bijection of the domain)."""

    def __init__(self, n: int, key: str, epoch: int) -> None:
        if n < 1:
            raise ValueError("a permutation of no elements")
        self.n = n
        self.half_bits = max(1, ((n - 1).bit_length() + 1) // 2)
        self.half_mask = np.uint64((1 << self.half_bits) - 1)
        digest = hashlib.sha256(f"xspec-order:{key}:{epoch}".encode()).digest()
        self.keys = [np.uint64(int.from_bytes(digest[8 * i:8 * i + 8], "little")) for i in range(_ROUNDS)]

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        values = positions.astype(np.uint64)
        out = self._network(values)
        outside = out >= self.n
        while outside.any():
            out[outside] = self._network(out[outside])
            outside = out >= self.n
        return out.astype(np.int64)

    def _network(self, values: np.ndarray) -> np.ndarray:
        bits = np.uint64(self.half_bits)
        left, right = values >> bits, values & self.half_mask
        for key in self.keys:
            left, right = right, left ^ (_mix(right ^ key) & self.half_mask)
        return (left << bits) | right


def _mix(x: np.ndarray) -> np.ndarray:
    """A 64-bit finaliser (splitmix64's): every input bit reaches every output bit."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def sequence_slice(n: int, start: int, count: int, key: str) -> tuple[np.ndarray, int]:
    """Examples [start, start + count) of the endless sequence of epochs of a corpus of n examples (epoch e
    is Permutation(n, key, e)), and the epoch of the first."""
    positions = np.arange(start, start + count, dtype=np.int64)
    epochs, within = positions // n, positions % n
    ids = np.empty(count, dtype=np.int64)
    for epoch in np.unique(epochs).tolist():
        chosen = epochs == epoch
        ids[chosen] = Permutation(n, key, epoch)(within[chosen])
    return ids, start // n
