"""runtime/top_k.py's chunked selection gives torch.topk's values and columns."""

from __future__ import annotations

import pytest
import torch

from xspec.runtime.top_k import top_k


@pytest.mark.parametrize("width", [8000, 1000, 151936, 50257])      # 50257: a part chunk left over
@pytest.mark.parametrize("k", [1, 8, 50])
def test_the_k_largest_of_each_row_are_torch_topk_s(width, k):
    torch.manual_seed(width + k)
    scores = torch.randn(6, width)
    scores[1, : width // 2] = float("-inf")     # a vocabulary half banned
    scores[2, 17] = float("nan")                 # torch.topk takes a NaN for the largest
    scores[3] = float("-inf")
    scores[3, [5, width - 1]] = 2.0              # fewer finite scores than k: ties of -inf make up the rest
    values, columns = top_k(scores, k)
    expected = scores.topk(k, dim=-1)
    torch.testing.assert_close(values, expected.values, equal_nan=True)
    untied = [0, 1, 2, 4, 5]
    assert torch.equal(columns[untied], expected.indices[untied])
    assert set(columns[3, :2].tolist()) <= {5, width - 1}      # tied, in either order; then -inf ones
    assert torch.equal(scores[3].gather(0, columns[3]), values[3])
    for row in columns:
        assert len(set(row.tolist())) == k       # each column once


def test_a_row_of_a_column_view_is_read_as_it_is():
    scores = torch.randn(4, 16000)[:, :8000]     # the vocabulary's part of a wider output
    assert torch.equal(top_k(scores, 8)[1], scores.topk(8, dim=-1).indices)
