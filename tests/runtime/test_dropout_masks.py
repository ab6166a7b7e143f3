"""Dropout's masks on a CPU drawn from uniform numbers (runtime/dropout_masks.py): torch's distribution, kept
elements scaled by 1 / (1 - p), the same masks for the same seed, and torch's own dropout elsewhere."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from xspec.runtime.dropout_masks import UniformDropoutMasks, uniform_dropout_masks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_element_is_dropped_with_probability_p_and_the_kept_are_scaled(dtype):
    x = (torch.rand(1000, 1000) + 1.0).to(dtype).requires_grad_()
    torch.manual_seed(3)
    with UniformDropoutMasks():
        y = nn.Dropout(0.1)(x)
    assert y.dtype == dtype
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.9) < 0.002          # 1,000,000 draws: sd 0.0003
    torch.testing.assert_close(y[kept], (x[kept].float() / 0.9).to(dtype))
    y.float().sum().backward()
    torch.testing.assert_close(x.grad, (kept.float() / 0.9).to(dtype))
    torch.manual_seed(3)
    with UniformDropoutMasks():
        again = F.dropout(x.detach(), p=0.1, training=True)
    assert torch.equal(again, y.detach())                         # a seed gives the same masks
    torch.manual_seed(3)
    assert not torch.equal(F.dropout(x.detach(), 0.1, True), y.detach())   # another draw than torch's sampler


def test_what_is_not_training_dropout_on_a_cpu_is_torchs_own():
    x = torch.randn(64, 64)
    with UniformDropoutMasks():
        assert torch.equal(F.dropout(x, 0.3, training=False), x)
        assert torch.equal(F.dropout(x, 0.0, training=True), x)
        assert torch.equal(F.dropout(x, 1.0, training=True), torch.zeros_like(x))
        model = nn.Sequential(nn.Dropout(0.5)).eval()
        assert torch.equal(model(x), x)
        inplace = x.clone()
        F.dropout(inplace, 0.5, training=True, inplace=True)     # torch's: in place, as asked
        assert ((inplace == 0) | (inplace == 2 * x)).all() and (inplace == 0).any()
        assert torch.equal(torch.relu(x), x.clamp(min=0))         # other functions pass through


def test_the_trainer_draws_so_on_a_cpu_only():
    assert isinstance(uniform_dropout_masks(torch.device("cpu")), UniformDropoutMasks)
    assert isinstance(uniform_dropout_masks(torch.device("cuda")), nullcontext)
