"""train.length_buckets: passes padded up to a few lengths chosen from the data, the fewest positions added;
the losses and gradients are the unpadded passes', for translation and language models alike."""

import itertools
import random

import pytest
import torch

import xspec
from float32 import assert_close
from xspec.runtime.batching import NO_LABEL, collate, collate_sequences, micro_batches
from xspec.runtime.data_order import Window
from xspec.runtime.length_buckets import LengthBuckets, fewest_padding_lengths
from xspec.runtime.step import TrainingStep
from xspec.runtime.vocab import PAD


@pytest.mark.parametrize("seed", range(40))
def test_the_lengths_chosen_pad_least(seed):
    """Against every choice of lengths, by brute force."""
    draw = random.Random(seed)
    lengths = [draw.randint(1, 40) for _ in range(draw.randint(1, 30))]
    count = draw.randint(1, 5)
    chosen = fewest_padding_lengths(lengths, count)

    def added(buckets):
        return sum(min(b for b in buckets if b >= n) - n for n in lengths)

    distinct = sorted(set(lengths))
    best = min(added({*others, max(lengths)}) for k in range(count)
               for others in itertools.combinations(distinct[:-1], k))
    assert len(chosen) <= count and max(lengths) in chosen and added(chosen) == best


def test_every_length_is_a_bucket_when_there_are_few():
    assert fewest_padding_lengths([5, 3, 5, 9], 4) == (3, 5, 9)
    assert fewest_padding_lengths([3, 3, 5, 9, 9, 10], 2) == (5, 10)


def _sentences(seed: int, count: int, vocab: int) -> list[list[int]]:
    draw = random.Random(seed)
    return [[draw.randint(4, vocab - 1) for _ in range(draw.randint(2, 17))] for _ in range(count)]


def _loss_and_grads(step: TrainingStep, batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    step.zero_grad()
    loss = step(batch.labels, *batch.inputs)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in step.parameters() if p.grad is not None]


@pytest.mark.parametrize("spec_path", ["specs/tiny.xspec", "specs/lm.xspec"])
def test_a_padded_pass_has_the_unpadded_loss_and_gradients(spec_path):
    torch.manual_seed(0)
    spec = xspec.compile(spec_path, overrides={"vocab": 60, "layers": 1, "dropout": 0, "d_model": 32, "d_ff": 64,
                                                "heads": 2})
    step = TrainingStep(spec.build("cpu"), label_smoothing=0.1)
    targets = _sentences(1, 12, 60)
    if spec.has_encoder:
        sources = [s + [3] for s in _sentences(2, 12, 60)]          # a source ends with EOS
        batch = collate(list(range(12)), sources, targets)
        buckets = LengthBuckets((batch.labels.size(1) + 7, 99), (batch.inputs[0].size(1) + 5, 99))
    else:
        batch = collate_sequences(list(range(12)), [[3, *t, 3] for t in targets])
        buckets = LengthBuckets((batch.labels.size(1) - 3, batch.labels.size(1) + 7, 99))
    padded = buckets.padded(batch)
    assert padded.inputs[-1 if not spec.has_encoder else 1].size(1) == batch.labels.size(1) + 7
    if spec.has_encoder:
        assert padded.inputs[0].size(1) == batch.inputs[0].size(1) + 5
        assert padded.inputs[2][:, -5:].all() and (padded.inputs[0][:, -5:] == PAD).all()
    assert (padded.labels[:, -7:] == NO_LABEL).all() and padded.target_tokens == batch.target_tokens
    loss, grads = _loss_and_grads(step, batch)
    padded_loss, padded_grads = _loss_and_grads(step, padded)
    assert_close(padded_loss, loss, rel=1e-5)
    scale = max(float(g.abs().max()) for g in grads)        # some gradients are nearly zero: one scale for all
    for mine, theirs in zip(padded_grads, grads):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5 * scale)


def test_a_pass_is_cut_by_the_bucketed_lengths_and_the_padding_added_is_counted():
    src, tgt = [4, 9, 9, 15], [3, 8, 9, 14]
    buckets = LengthBuckets.chosen(src, tgt, 2)
    assert buckets.targets == (10, 15) and buckets.sources == (9, 15)
    window = Window(0, 0, src, tgt)
    assert window.padded == [4, 9, 10, 15] and window.padded_in(buckets) == [10, 10, 10, 15]
    assert window.padded_in(None) is window.padded
    # micro-batches of one example each: (4 + 4) -> (9 + 10), the others already at a bucket
    before = sum(s + t + 1 for s, t in zip(src, tgt))
    after = (9 + 10) + (9 + 10) + (9 + 10) + (15 + 15)
    assert len(micro_batches(src, tgt, 1)) == 4
    assert buckets.added(src, tgt, 1) == pytest.approx(after / before - 1)


def test_a_run_with_buckets_says_them_and_their_padding(tmp_path, capsys):
    from xspec.cli import main

    assert main(["train", "specs/tiny.xspec", "-o", str(tmp_path / "run"), "--no-progress", "--no-tensorboard",
                 "--no-test", "--set", "train.length_buckets=4", "--set", "train.max_steps=1"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("length buckets"))
    assert line.startswith("length buckets (train.length_buckets = 4): targets ")
    assert "; sources " in line and "to the padded positions of the first epoch's micro-batches" in line
