"""Dropout's masks on a CPU from a counter-based hash (runtime/dropout_masks.py): the hash is lowbias32, each
element is kept with probability 1 - p independently of its neighbours and of other calls, the kept are scaled
by 1 / (1 - p), a seed gives the same masks, and what is not training dropout on a CPU is torch's own."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import xspec
from xspec.nn.attention import WrittenOutAttention
from xspec.runtime.dropout_masks import CHUNK, HashedDropout, draws_masks, dropout_masks, mix


def lowbias32(x: int) -> int:
    """The hash as published, on unsigned 32-bit integers."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_the_hash_of_int32_tensors_is_lowbias32_of_their_unsigned_bits():
    values = [0, 1, 2, 12345, 2**31 - 1, -1, -5, -(2**31)]
    hashed = mix(torch.tensor(values, dtype=torch.int32)).tolist()
    assert [h & 0xFFFFFFFF for h in hashed] == [lowbias32(v & 0xFFFFFFFF) for v in values]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_element_is_dropped_with_probability_p_and_the_kept_are_scaled(dtype):
    x = (torch.rand(1000, 1000) + 1.0).to(dtype).requires_grad_()
    torch.manual_seed(3)
    with HashedDropout():
        y = nn.Dropout(0.1)(x)
    assert y.dtype == dtype
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.9) < 0.002          # 1,000,000 draws: sd 0.0003
    torch.testing.assert_close(y[kept], (x[kept].float() / 0.9).to(dtype))
    y.float().sum().backward()
    torch.testing.assert_close(x.grad, (kept.float() / 0.9).to(dtype))
    torch.manual_seed(3)
    with HashedDropout():
        again = F.dropout(x.detach(), p=0.1, training=True)
    assert torch.equal(again, y.detach())                         # a seed gives the same masks


def test_masks_are_independent_across_elements_and_calls():
    dropout, shape = HashedDropout(), torch.Size([1000, 1000])
    torch.manual_seed(0)
    first, second = dropout.kept(shape, 0.3).flatten().float(), dropout.kept(shape, 0.3).flatten().float()
    assert abs(first.mean().item() - 0.7) < 0.002
    assert abs((first == second).float().mean().item() - (0.7**2 + 0.3**2)) < 0.002    # independent calls
    for lag in (1, 2, 1000):                                       # neighbours, and the next row
        assert abs(torch.corrcoef(torch.stack([first[:-lag], first[lag:]]))[0, 1].item()) < 0.005
    assert abs(torch.corrcoef(torch.stack([first, second]))[0, 1].item()) < 0.005
    assert dropout.kept(torch.Size([10, 10]), 0.3).shape == (10, 10)
    assert not dropout.kept(torch.Size([1000]), 1.0 - 2.0**-40).any()     # its threshold fits an int32


def test_a_tensor_of_several_chunks_is_masked_alike_in_each():
    dropout = HashedDropout()
    torch.manual_seed(0)
    kept = dropout.kept(torch.Size([3, CHUNK]), 0.5).float()       # a chunk a row
    assert all(abs(row.mean().item() - 0.5) < 0.003 for row in kept)
    for a, b in ((0, 1), (1, 2)):                                  # not the same pattern again
        assert abs(torch.corrcoef(kept[[a, b]])[0, 1].item()) < 0.005
    torch.manual_seed(0)
    assert torch.equal(dropout.kept(torch.Size([CHUNK + 7]), 0.5).float()[:CHUNK], kept[0])


def test_what_is_not_training_dropout_on_a_cpu_is_torchs_own():
    x = torch.randn(64, 64)
    with HashedDropout():
        assert torch.equal(F.dropout(x, 0.3, training=False), x)
        assert torch.equal(F.dropout(x, 0.0, training=True), x)
        assert torch.equal(F.dropout(x, 1.0, training=True), torch.zeros_like(x))
        assert torch.equal(nn.Sequential(nn.Dropout(0.5)).eval()(x), x)
        inplace = x.clone()
        F.dropout(inplace, 0.5, training=True, inplace=True)     # torch's: in place, as asked
        assert ((inplace == 0) | (inplace == 2 * x)).all() and (inplace == 0).any()
        assert torch.equal(torch.relu(x), x.clamp(min=0))         # other functions pass through


def test_the_trainer_hashes_masks_on_a_cpu_only_and_for_a_model_that_drops_something():
    dropping = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1))
    assert isinstance(dropout_masks(torch.device("cpu"), dropping), HashedDropout)
    assert isinstance(dropout_masks(torch.device("cuda"), dropping), nullcontext)
    for still in (nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0)), WrittenOutAttention(softcap=30.0)):
        assert isinstance(dropout_masks(torch.device("cpu"), still), nullcontext)
    assert isinstance(dropout_masks(torch.device("cpu"), WrittenOutAttention(dropout=0.1)), HashedDropout)
    for path, drops in (("specs/tiny.xspec", True), ("specs/modern/llama.xspec", False)):
        assert draws_masks(xspec.compile(path).build("cpu")) is drops
