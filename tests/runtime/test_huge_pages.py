"""A decoding model's weights copied into one mapping advised for huge pages (runtime/huge_pages.py)."""

from __future__ import annotations

import copy
import gc
import sys

import pytest
import torch
import torch.nn as nn

from xspec.runtime import huge_pages
from xspec.runtime.huge_pages import HUGE_PAGE, huge_pages_offered, place_on_huge_pages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")


@pytest.fixture
def offered(tmp_path, monkeypatch):
    """The kernel's setting, as this test writes it."""
    setting = tmp_path / "enabled"
    monkeypatch.setattr(huge_pages, "SETTING", setting)
    return setting


@pytest.mark.parametrize("text, expected", [("always [madvise] never\n", True), ("[always] madvise never\n", True),
                                            ("always madvise [never]\n", False), ("", False)])
def test_huge_pages_are_used_where_the_kernel_offers_them(offered, text, expected):
    offered.write_text(text)
    assert huge_pages_offered() is expected


def test_no_setting_means_no_huge_pages(offered):
    assert not offered.exists() and not huge_pages_offered()


class _Fused(nn.Module):
    """Two weights that are views of one matrix: they must stay one storage."""

    def __init__(self) -> None:
        super().__init__()
        whole = torch.randn(64, 32)
        self.first, self.second = nn.Parameter(whole[:32]), nn.Parameter(whole[32:])


def test_weights_move_into_one_aligned_mapping_keeping_values_ties_and_views(offered, monkeypatch):
    offered.write_text("always [madvise] never\n")
    monkeypatch.setattr(huge_pages, "LEAST_BYTES", 0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(1000, 512), nn.Linear(512, 1000), _Fused())
    model[1].weight = model[0].weight                   # tied: one parameter in two places
    model[0].register_buffer("table", torch.randn(300, 512))
    tokens = torch.tensor([[3, 5, 999]])
    before = model[1](model[0](tokens)).detach()
    fused = {name: p.data_ptr() for name, p in model[2].named_parameters()}
    state = {name: t.clone() for name, t in model.state_dict().items()}

    arena = place_on_huge_pages(model)
    assert arena is not None
    start = torch.frombuffer(arena, dtype=torch.uint8).data_ptr()
    moved = [model[0].weight, model[1].bias, model[0].table]
    first = min(t.data_ptr() for t in moved)
    assert first % HUGE_PAGE == 0 and first - start < HUGE_PAGE
    assert all(start <= t.data_ptr() < start + len(arena) for t in moved)
    assert model[1].weight is model[0].weight and model[0].weight.requires_grad
    assert {name: p.data_ptr() for name, p in model[2].named_parameters()} == fused   # views of one matrix stay
    assert list(model.state_dict()) == list(state)
    assert all(torch.equal(t, state[name]) for name, t in model.state_dict().items())

    del arena, start
    gc.collect()                                         # the tensors keep their mapping alive
    after = model[1](model[0](tokens))
    torch.testing.assert_close(after, before, rtol=0, atol=1e-6)
    torch.testing.assert_close(copy.deepcopy(model)[1](model[0](tokens)), before, rtol=0, atol=1e-6)
    after.sum().backward()                               # and they still train
    assert model[0].weight.grad is not None and model[0].weight.grad.shape == (1000, 512)


def test_nothing_moves_without_huge_pages_or_for_few_weights(offered, monkeypatch):
    model = nn.Sequential(nn.Linear(64, 64))
    pointer = model[0].weight.data_ptr()
    offered.write_text("always madvise [never]\n")
    monkeypatch.setattr(huge_pages, "LEAST_BYTES", 0)
    assert place_on_huge_pages(model) is None
    offered.write_text("always [madvise] never\n")
    monkeypatch.setattr(huge_pages, "LEAST_BYTES", 1 << 20)     # 16 KiB of weights: not worth a copy
    assert place_on_huge_pages(model) is None and model[0].weight.data_ptr() == pointer


def test_a_mapping_refused_leaves_the_weights_where_they_are(offered, monkeypatch):
    """Where the kernel refuses the mapping (a memory limit), the model decodes from its own memory."""
    offered.write_text("always [madvise] never\n")
    monkeypatch.setattr(huge_pages, "LEAST_BYTES", 0)

    def refused(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(huge_pages.mmap, "mmap", refused)
    model = nn.Sequential(nn.Linear(64, 64))
    pointer = model[0].weight.data_ptr()
    assert place_on_huge_pages(model) is None and model[0].weight.data_ptr() == pointer
