"""Batches by token count (§5.1): length grouping, token budgets, shuffling by batch, sharding."""

import random

import torch

from xspec.runtime.batching import collate, micro_batches, pad, plan_epoch, shard
from xspec.runtime.vocab import BOS, EOS, PAD


def _lengths(n: int = 500, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    src = [rng.randint(3, 60) for _ in range(n)]
    return src, [max(1, s + rng.randint(-5, 5)) for s in src]


def test_micro_batches_respect_the_padded_token_cap_and_cover_every_sentence():
    src, tgt = _lengths()
    batches = micro_batches(src, tgt, max_tokens=400)
    assert sorted(i for b in batches for i in b) == list(range(len(src)))
    for b in batches:
        padded = len(b) * max(max(src[i], tgt[i] + 1) for i in b)
        assert padded <= 400 or len(b) == 1


def test_micro_batches_group_similar_lengths():
    src, tgt = _lengths()
    batches = micro_batches(src, tgt, max_tokens=400)
    spread = [max(tgt[i] for i in b) - min(tgt[i] for i in b) for b in batches]
    assert sum(spread) / len(spread) <= 2      # random batches would spread over ~50


def test_updates_reach_the_target_token_budget():
    src, tgt = _lengths()
    batches = micro_batches(src, tgt, max_tokens=400)
    plan = plan_epoch(batches, tgt, batch_tokens=2000, seed=1, epoch=0)
    sizes = [[sum(tgt[i] + 1 for i in b) for b in update] for update in plan]
    totals = [sum(s) for s in sizes]
    assert all(abs(t - 2000) <= 400 for t in totals[:-1])         # micro-batches hold <= 400 tokens
    assert 1900 < sum(totals) / len(totals) < 2100 or len(plan) < 3
    # no update could have come closer to the budget by dropping its last micro-batch
    assert all(abs(t - 2000) < abs(t - s[-1] - 2000) for t, s in zip(totals, sizes) if len(s) > 1)
    assert sorted(i for update in plan for b in update for i in b) == list(range(len(src)))


def test_epochs_shuffle_by_batch_deterministically():
    src, tgt = _lengths()
    batches = micro_batches(src, tgt, max_tokens=400)
    a = plan_epoch(batches, tgt, 2000, seed=1, epoch=0)
    assert a == plan_epoch(batches, tgt, 2000, seed=1, epoch=0)
    assert a != plan_epoch(batches, tgt, 2000, seed=1, epoch=1)
    assert {tuple(b) for u in a for b in u} == {tuple(b) for b in batches}   # batches kept whole


def test_shards_split_an_update_and_pad_with_zero_weight_passes():
    update = [[0, 1], [2], [3, 4], [5], [6]]
    r0, r1 = shard(update, 0, 2), shard(update, 1, 2)
    assert r0 == [([0, 1], True), ([3, 4], True), ([6], True)]
    assert r1 == [([2], True), ([5], True), ([0, 1], False)]
    assert shard(update, 0, 1) == [(b, True) for b in update]


def test_collate_shifts_the_target_and_masks_padding():
    batch = collate([0, 1], [[5, 6, EOS], [7, EOS]], [[8, 9], [10]])
    assert batch.src.tolist() == [[5, 6, EOS], [7, EOS, PAD]]
    assert batch.src_padding.tolist() == [[False, False, False], [False, False, True]]
    assert batch.tgt_in.tolist() == [[BOS, 8, 9], [BOS, 10, PAD]]
    assert batch.labels.tolist() == [[8, 9, EOS], [10, EOS, PAD]]
    assert batch.target_tokens == 5


def _per_row_pad(rows: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(rows), max(len(r) for r in rows)), PAD, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def _random_rows(rng: random.Random, n: int, shortest: int, longest: int, end: list[int]) -> list[list[int]]:
    return [[rng.randrange(4, 37000) for _ in range(rng.randint(shortest, longest))] + end for _ in range(n)]


def test_collate_equals_padding_row_by_row():
    rng = random.Random(3)
    for n, longest in ((1, 1), (5, 3), (64, 40), (300, 120)):
        sources = _random_rows(rng, n, 0, longest, [EOS])
        targets = _random_rows(rng, n, 0, longest, [])        # an empty target is BOS -> EOS
        indices = rng.sample(range(n), rng.randint(1, n))
        batch = collate(indices, sources, targets)
        src = _per_row_pad([sources[i] for i in indices])
        labels = _per_row_pad([targets[i] + [EOS] for i in indices])
        expected = (src, src == PAD, _per_row_pad([[BOS] + targets[i] for i in indices]), labels)
        for got, want in zip((batch.src, batch.src_padding, batch.tgt_in, batch.labels), expected):
            assert got.dtype == want.dtype and torch.equal(got, want)
        assert batch.target_tokens == int((labels != PAD).sum()) == sum(len(targets[i]) + 1 for i in indices)


def test_pad_equals_padding_row_by_row():
    rows = _random_rows(random.Random(4), 50, 1, 30, [])
    assert torch.equal(pad(rows), _per_row_pad(rows))
    assert pad([[7], [8, 9]]).tolist() == [[7, PAD], [8, 9]]
