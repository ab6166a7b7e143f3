"""Batches by token count (§5.1: "sentence pairs were batched together by approximate sequence length.
Each training batch contained ... approximately 25000 source tokens and 25000 target tokens").

Four levels:
- a *micro-batch* is sentences of similar length, at most one of `parts` equal shares of an update in
  padded tokens (sentences x longest side);
- a *pass* is what one forward pass holds: a micro-batch, or, when that is more than fits in memory
  (`train.max_batch_tokens`, planned by runtime/memory_plan.py), each run of its sentences that does;
- a *round* of an update is `parts` micro-batches of similar padded size that the ranks sharing the
  update run side by side, one each, so that they finish together;
- an *update* is one optimizer step: whole rounds (in shuffled order) whose target tokens add up to
  about `batch_tokens`; their gradients are accumulated.

`parts` is the number of ranks sharing an update: the world size, or `train.update_parts` when the
spec sets it. The plan of an epoch depends only on (data, seed, epoch, parts), never on the number of
processes that run it: each rank takes every world_size-th micro-batch of an update (`shard`), so with
a fixed `train.update_parts` an update is the same sentences on one process or on eight, and a run
resumes at (window, update index), a window being an epoch of a corpus in memory or a slice of a
prepared one (runtime/data_order.py); a run resumed on another number of processes finishes its window
in the plan it was started with. Nor does it depend on the memory of the machine: a pass only splits a
micro-batch, so an update is the same sentences whatever `train.max_batch_tokens` is. `bench/scaling.py`
measures what this buys (docs/runtime.md).
"""

from __future__ import annotations

import itertools
import random
from array import array
from dataclasses import dataclass

import torch

from .vocab import BOS, EOS, PAD


def padded_lengths(src_lens: list[int], tgt_lens: list[int]) -> list[int]:
    """Each example's length in a padded batch: its longer side, the target with BOS (input) / EOS (labels)."""
    return [max(s, t + 1) for s, t in zip(src_lens, tgt_lens)]


def micro_batches(src_lens: list[int], tgt_lens: list[int], max_tokens: int) -> list[list[int]]:
    """Sentence indices grouped by similar length; padded size (sentences x longest side) <= max_tokens."""
    order = sorted(range(len(src_lens)), key=lambda i: (tgt_lens[i], src_lens[i]))
    return _pack(order, padded_lengths(src_lens, tgt_lens), max_tokens)


def _pack(indices: list[int], lengths: list[int], max_tokens: int) -> list[list[int]]:
    """`indices` in order, cut into runs whose padded size (sentences x longest) is at most `max_tokens`;
    a sentence longer than that alone."""
    batches, current, longest = list[list[int]](), list[int](), 0
    for i in indices:
        if current and (len(current) + 1) * max(longest, lengths[i]) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, lengths[i])
    if current:
        batches.append(current)
    return batches


def micro_batch_cap(batch_tokens: int, parts: int) -> int:
    """Padded tokens per micro-batch: one of `parts` equal shares of an update."""
    if parts < 1:
        raise ValueError(f"an update is shared by at least one rank, got parts={parts}")
    return max(1, batch_tokens // parts)


def plan_epoch(batches: list[list[int]], tgt_lens: list[int], batch_tokens: int, seed: int, epoch: int,
               parts: int = 1, *, src_lens: list[int] | None = None) -> list[list[list[int]]]:
    """Updates of one epoch; every update holds a multiple of `parts` micro-batches (parts x k, k >= 1,
    k chosen so an update's target tokens come near batch_tokens), the micro-batches of one update of
    similar size so that `parts` ranks, each taking every parts-th one (shard), finish together.

    The grouping, chosen by measurement (bench/scaling.py, 25000-token updates, WMT-like lengths):
    micro-batches sorted by padded size (ties in an order shuffled per epoch) and cut into rounds of
    `parts` consecutive ones; rounds shuffled, then taken in turn while they bring an update closer
    to `batch_tokens`. Sorted rounds kept 90.9 / 92.8 / 93.1% of the ranks' work useful at 2 / 4 / 8
    ranks, against 89.1 / 91.3 / 91.3% for rounds of micro-batches in random order, whose per-rank
    tokens also varied more (worst update: a rank idle). The size is sentences x longest target; with
    `src_lens` it adds the longest source, what a rank actually pays: 91.7 / 95.2 / 97.2%. Updates
    stay mixed: micro-batches fill the same cap whatever their sentences' length, so one size joins
    many lengths (target lengths within an update: std 16.5 at 8 ranks, 23 in the corpus, 1.2 when an
    update was one micro-batch).

    Every sentence is in exactly one update. When the number of micro-batches is not a multiple of
    `parts`, those with the most sentences are halved until it is (at most parts - 1 halvings; a half
    pads to no more than the whole). Only with fewer sentences than the next multiple of `parts`
    (a tiny corpus, or too few sentences beside ones each longer than the cap) does one round stay
    short; it ends its update, where the ranks past its end run a filler pass (`shard`).

    With parts=1 this is the plan of earlier versions (micro-batches shuffled, then grouped greedily):
    the same micro-batches make the same updates.
    """
    rng = random.Random(seed * 100_003 + epoch)
    if parts == 1:
        rounds = [[b] for b in batches]
    else:
        rounds = _rounds(_split_to_multiple(batches, parts), tgt_lens, src_lens, parts, rng)
    rng.shuffle(rounds)
    return [_interleave(update) for update in _fill_updates(rounds, tgt_lens, batch_tokens)]


def _split_to_multiple(batches: list[list[int]], parts: int) -> list[list[int]]:
    """The micro-batches, the widest halved until their number is a multiple of `parts` (or no
    micro-batch has two sentences left)."""
    batches = list(batches)
    while len(batches) % parts:
        widest = max(range(len(batches)), key=lambda b: len(batches[b]))
        if len(batches[widest]) < 2:
            break
        half = len(batches[widest]) // 2
        batches[widest:widest + 1] = [batches[widest][:half], batches[widest][half:]]
    return batches


def _padded_size(batch: list[int], tgt_lens: list[int], src_lens: list[int] | None) -> int:
    """What a micro-batch costs a rank: sentences x (longest target + BOS/EOS, + longest source when
    the source lengths are known)."""
    longest = max(tgt_lens[i] for i in batch) + 1
    if src_lens is not None:
        longest += max(src_lens[i] for i in batch)
    return len(batch) * longest


def _rounds(batches: list[list[int]], tgt_lens: list[int], src_lens: list[int] | None, parts: int,
            rng: random.Random) -> list[list[list[int]]]:
    """Groups of `parts` micro-batches of similar padded size, each largest first; a short group
    (see plan_epoch) holds the smallest."""
    order = list(range(len(batches)))
    rng.shuffle(order)                      # micro-batches of equal size meet other partners each epoch
    order.sort(key=lambda b: _padded_size(batches[b], tgt_lens, src_lens), reverse=True)
    return [[batches[b] for b in order[i:i + parts]] for i in range(0, len(order), parts)]


def _fill_updates(rounds: list[list[list[int]]], tgt_lens: list[int], batch_tokens: int) -> list[list[list[list[int]]]]:
    """Consecutive rounds grouped so that each update's target tokens (with EOS) come as close to
    `batch_tokens` as whole rounds allow."""
    updates, current, tokens = list[list[list[list[int]]]](), list[list[list[int]]](), 0
    for group in rounds:
        size = sum(tgt_lens[i] + 1 for b in group for i in b)
        if current and abs(tokens + size - batch_tokens) >= abs(tokens - batch_tokens):
            updates.append(current)             # adding this round would overshoot more than stopping
            current, tokens = [], 0
        current.append(group)
        tokens += size
    if current:
        updates.append(current)
    return updates


def _interleave(rounds: list[list[list[int]]]) -> list[list[int]]:
    """An update's micro-batches, round after round, so that `shard` gives rank r the r-th micro-batch
    of every round. Every other round runs smallest first, so no rank takes the largest of each; a short
    round goes last, where it leaves the others' alignment alone."""
    ordered = sorted(rounds, key=len, reverse=True)          # stable: only a short round moves
    return [b for j, group in enumerate(ordered) for b in (group if j % 2 == 0 else group[::-1])]


def shard(update: list[list[int]], rank: int, world_size: int) -> list[tuple[list[int], bool]]:
    """This rank's micro-batches of an update, as (indices, counts). Every rank makes the same number
    of them (DDP synchronises on the last pass); a rank short of micro-batches repeats one with
    `counts=False`, i.e. with zero weight in the loss. A plan made with parts = world_size needs no
    filler (but for the short round plan_epoch describes)."""
    mine = update[rank::world_size]
    each = -(-len(update) // world_size)
    filler = [(update[0], False)] * (each - len(mine))
    return [(b, True) for b in mine] + filler


def rank_passes(update: list[list[int]], rank: int, world_size: int, lengths: list[int],
                cap: int) -> list[tuple[list[int], bool]]:
    """This rank's forward passes of an update, as (indices, counts): its micro-batches (`shard`), each cut
    into runs of consecutive sentences of at most `cap` padded tokens (`lengths`: padded_lengths). Every
    rank makes as many passes as the rank that needs most, since DDP and FSDP synchronise the ranks at
    each pass: a rank with fewer halves its widest passes, or, with none left to halve, runs one-sentence
    fillers with zero weight."""
    def cut(r: int) -> list[tuple[list[int], bool]]:
        return [(run, True) for indices, counts in shard(update, r, world_size) if counts
                for run in _pack(indices, lengths, cap)]

    mine = cut(rank)
    needed = max(len(cut(r)) if r != rank else len(mine) for r in range(world_size))
    while len(mine) < needed:
        halvable = [j for j, (run, _) in enumerate(mine) if len(run) > 1]
        if not halvable:
            mine += [([update[0][0]], False)] * (needed - len(mine))
            break
        j = max(halvable, key=lambda k: len(mine[k][0]) * max(lengths[i] for i in mine[k][0]))
        run = mine[j][0]
        mine[j:j + 1] = [(run[:len(run) // 2], True), (run[len(run) // 2:], True)]
    return mine


# The label of a position that predicts nothing (padding): cross entropy's ignore index, never a token id.
# (Not PAD: an imported checkpoint's own tokenizer may use id 0 for a real token, e.g. Llama 3's "!".)
NO_LABEL = -100


@dataclass
class Batch:
    """One forward pass: the model's arguments and the labels its logits are scored against."""

    inputs: tuple[torch.Tensor, ...]  # translation: src [B, S], tgt_in [B, T], src_padding [B, S]; LM: tokens [B, T]
    labels: torch.Tensor              # [B, T] the token each position predicts, NO_LABEL where none (no loss)
    target_tokens: int                # labels that are not NO_LABEL

    def to(self, device: torch.device) -> "Batch":
        return Batch(tuple(x.to(device, non_blocking=True) for x in self.inputs),
                     self.labels.to(device, non_blocking=True), self.target_tokens)


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


def pad_with_mask(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(pad(rows), [len(rows), longest] True past each row's length): the padding mask follows each row's
    length, as the padding id may be one of its real tokens."""
    tokens = pad(rows)
    return tokens, torch.arange(tokens.size(1))[None, :] >= _lengths(rows)[:, None]


def collate(indices: list[int], sources: list[list[int]], targets: list[list[int]], start: int = BOS,
            end: int = EOS) -> Batch:
    """A translation micro-batch: inputs (src ending in EOS, BOS + target, src padding mask), labels
    target + EOS; an imported checkpoint's outputs start and end with its own tokens (`start`, `end`). The
    padding mask follows each source's length: the padding id may be one of its real tokens."""
    src, padding = pad_with_mask([sources[i] for i in indices])
    tgt_in, labels = _shifted([targets[i] for i in indices], start, end)
    return Batch((src, tgt_in, padding), labels, int((labels != NO_LABEL).sum()))


def collate_sequences(indices: list[int], sequences: list[list[int]]) -> Batch:
    """A language-model micro-batch of whole sequences (each at least 2 tokens): inputs are each sequence
    but its last token, labels each but its first (every position predicts the next token)."""
    rows = [sequences[i] for i in indices]
    tgt_in, labels = _shifted([r[1:-1] for r in rows], [r[0] for r in rows], [r[-1] for r in rows])
    return Batch((tgt_in,), labels, int((labels != NO_LABEL).sum()))


def _shifted(rows: list[list[int]], first: int | list[int], last: int | list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels), [B, longest + 1]: inputs first + row, PAD after; labels row + last, NO_LABEL after; `first` and
    `last` are one token for every row or one per row. The rows' ids are flattened once for both."""
    lengths, flat = _lengths(rows), _flat(rows)
    inputs = torch.full((len(rows), int(lengths.max()) + 1), PAD, dtype=torch.long)
    labels = torch.full_like(inputs, NO_LABEL)
    inputs[:, 0] = torch.as_tensor(first, dtype=torch.long)
    _place(inputs[:, 1:], flat, lengths)
    _place(labels, flat, lengths)
    labels[torch.arange(len(rows)), lengths] = torch.as_tensor(last, dtype=torch.long)
    return inputs, labels
