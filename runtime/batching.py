"""Batches by token count (§5.1: "sentence pairs were batched together by approximate sequence length.
Each training batch contained ... approximately 25000 source tokens and 25000 target tokens").

Two levels:
- a *micro-batch* is one forward pass: sentences of similar length, at most `max_batch_tokens`
  tokens once padded (what fits in memory);
- an *update* is one optimizer step: micro-batches (in shuffled order) whose target tokens add up to
  about `batch_tokens`; their gradients are accumulated.

The plan of an epoch depends only on (data, seed, epoch), never on the number of processes: with
several ranks, each takes every world_size-th micro-batch of an update. So an update is the same
sentences whether it runs on one process or eight, and a run resumes at (epoch, update index).
"""

from __future__ import annotations

import itertools
import random
from array import array
from dataclasses import dataclass

import torch

from xspec.runtime.vocab import BOS, EOS, PAD


def micro_batches(src_lens: list[int], tgt_lens: list[int], max_tokens: int) -> list[list[int]]:
    """Sentence indices grouped by similar length; padded size (sentences x longest side) <= max_tokens."""
    order = sorted(range(len(src_lens)), key=lambda i: (tgt_lens[i], src_lens[i]))
    batches, current, longest = [], [], 0
    for i in order:
        length = max(src_lens[i], tgt_lens[i] + 1)         # the target gets BOS (input) / EOS (labels)
        if current and (len(current) + 1) * max(longest, length) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, length)
    if current:
        batches.append(current)
    return batches


def plan_epoch(batches: list[list[int]], tgt_lens: list[int], batch_tokens: int,
               seed: int, epoch: int) -> list[list[list[int]]]:
    """Updates of one epoch: micro-batches shuffled (by batch, not by sentence), then grouped so that
    each update's target tokens (with EOS) come as close to `batch_tokens` as whole micro-batches allow."""
    order = list(range(len(batches)))
    random.Random(seed * 100_003 + epoch).shuffle(order)
    updates, current, tokens = [], [], 0
    for b in order:
        size = sum(tgt_lens[i] + 1 for i in batches[b])
        if current and abs(tokens + size - batch_tokens) >= abs(tokens - batch_tokens):
            updates.append(current)             # adding this micro-batch would overshoot more than stopping
            current, tokens = [], 0
        current.append(batches[b])
        tokens += size
    if current:
        updates.append(current)
    return updates


def shard(update: list[list[int]], rank: int, world_size: int) -> list[tuple[list[int], bool]]:
    """This rank's micro-batches of an update, as (indices, counts). Every rank makes the same number
    of passes (DDP synchronises on the last one); a rank short of micro-batches repeats one with
    `counts=False`, i.e. with zero weight in the loss."""
    mine = update[rank::world_size]
    passes = -(-len(update) // world_size)
    filler = [(update[0], False)] * (passes - len(mine))
    return [(b, True) for b in mine] + filler


@dataclass
class Batch:
    src: torch.Tensor           # [B, S] source ids ending with EOS, PAD after
    src_padding: torch.Tensor   # [B, S] True at padding
    tgt_in: torch.Tensor        # [B, T] BOS + target (decoder input)
    labels: torch.Tensor        # [B, T] target + EOS, PAD where there is no token (ignored by the loss)
    target_tokens: int

    def to(self, device: torch.device) -> "Batch":
        return Batch(self.src.to(device, non_blocking=True), self.src_padding.to(device, non_blocking=True),
                     self.tgt_in.to(device, non_blocking=True), self.labels.to(device, non_blocking=True),
                     self.target_tokens)


# Rows become tensors in one piece: one flat tensor of every id, scattered into a PAD-filled tensor
# through a mask of the positions each row fills (a tensor per row took ~10x longer at 25000 tokens).

def _flat(rows: list[list[int]]) -> torch.Tensor:
    """Every id of `rows`, in order, as one int64 tensor."""
    ids = array("q")
    ids.fromlist(list(itertools.chain.from_iterable(rows)))
    return torch.frombuffer(ids, dtype=torch.long) if ids else torch.zeros(0, dtype=torch.long)


def _lengths(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor([len(r) for r in rows], dtype=torch.long)


def _place(out: torch.Tensor, flat: torch.Tensor, lengths: torch.Tensor) -> None:
    """Writes row i's `lengths[i]` ids (consecutive in `flat`) at the start of out's row i."""
    out.masked_scatter_(torch.arange(out.size(1)) < lengths[:, None], flat)


def pad(rows: list[list[int]]) -> torch.Tensor:
    """[len(rows), longest] int64, each row's ids then PAD."""
    lengths = _lengths(rows)
    out = torch.full((len(rows), int(lengths.max())), PAD, dtype=torch.long)
    _place(out, _flat(rows), lengths)
    return out


def collate(indices: list[int], sources: list[list[int]], targets: list[list[int]]) -> Batch:
    """One micro-batch as tensors (see Batch); the targets' ids are flattened once for tgt_in and labels."""
    src = pad([sources[i] for i in indices])
    rows = [targets[i] for i in indices]
    lengths, flat = _lengths(rows), _flat(rows)
    tgt_in = torch.full((len(rows), int(lengths.max()) + 1), PAD, dtype=torch.long)
    labels = torch.full_like(tgt_in, PAD)
    tgt_in[:, 0] = BOS
    _place(tgt_in[:, 1:], flat, lengths)
    _place(labels, flat, lengths)
    labels[torch.arange(len(rows)), lengths] = EOS
    return Batch(src, src == PAD, tgt_in, labels, int((labels != PAD).sum()))
