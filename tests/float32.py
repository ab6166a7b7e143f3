"""Comparing float32 results computed two ways (another implementation, a cache, torch.compile).

The two differ by rounding, and the rounding of an element near zero is that of the large values it was
computed from, not its own: an absolute tolerance of 1e-5 is 80 ulps at 1.0 but barely one at 100, and
a relative one alone fails on elements that cancel to nearly zero. So each element may differ by `rel`
of the expected tensor's largest magnitude (and of its own), whatever the CPU's kernels sum in which order.
"""

from __future__ import annotations

import torch


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rel: float = 1e-5) -> None:
    scale = expected.detach().abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=rel, atol=rel * scale)
