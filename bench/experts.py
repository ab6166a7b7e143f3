"""A mixture of experts' training step and decoding step on the CPU, two comparisons in one process
(alternating rounds, medians):

- the two ops the imported families' specs write (`router` then `experts`: transformers' `mlp.gate` and
  `mlp.experts`, the routing passed as weights per expert, gate and up in one `gate_up_proj`) against the
  one `moe` op's module of the same weights;
- the experts' products on the CPU as the library computes them (each expert's matrix from `unbind`)
  against indexing the bank per expert (`weight[e]`, as before), whose backward fills a zero gradient of
  the whole bank for every expert.

    python bench/experts.py                      # d 256, 8 experts, top 2, d_ff 512, 16 x 64 tokens
    python bench/experts.py --rounds 21 --experts 16

Prints each side's ms and the ratio (above 1: the first named is slower).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from xspec.nn import Experts, GroupedExperts, MixtureOfExperts, Router, SwiGLU, TopKRouter


def indexed(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The experts' products with each expert's matrix indexed out of the bank."""
    parts = x.split(counts.tolist())
    return torch.cat([part @ weight[e].transpose(0, 1) for e, part in enumerate(parts)])


def timed(step: Callable[[], None], repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - start) / repeats * 1000


def paired(first: Callable[[], None], second: Callable[[], None], rounds: int, repeats: int) -> tuple[float, float]:
    """Medians of each side's ms, the sides alternating which goes first."""
    a, b = [], []
    for r in range(rounds):
        if r % 2 == 0:
            a.append(timed(first, repeats))
            b.append(timed(second, repeats))
        else:
            b.append(timed(second, repeats))
            a.append(timed(first, repeats))
    return statistics.median(a), statistics.median(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--d-ff", type=int, default=512)
    args = parser.parse_args()
    d, experts, top_k, d_ff = args.d_model, args.experts, args.top_k, args.d_ff
    torch.manual_seed(0)
    one = MixtureOfExperts(d, experts, d_ff, Router(d, experts, top_k, bias=False, normalize=True), SwiGLU())
    router, bank = TopKRouter(d, experts, top_k, bias=False, normalize=True), Experts(d, experts, d_ff, top_k, SwiGLU())
    with torch.no_grad():
        router.weight.copy_(one.router.weight)
        bank.gate_up_proj.copy_(torch.cat([one.gate, one.up], dim=1))
        bank.down_proj.copy_(one.down)
    x = torch.randn(16, 64, d)
    torch.testing.assert_close(bank(x, router(x)), one(x), rtol=1e-4, atol=1e-5)

    def train(mixture: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def step() -> None:
            mixture(x.clone().requires_grad_()).square().mean().backward()
        return step

    def decode(mixture: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        @torch.no_grad()
        def step() -> None:
            mixture(x[:, -1:])
        return step

    two = lambda h: bank(h, router(h))  # noqa: E731
    print(f"{torch.get_num_threads()} threads; d {d}, {experts} experts, top {top_k}, d_ff {d_ff}, 16 x 64 tokens")
    for name, kind, repeats in (("training step", train, 10), ("decoding step (16 tokens)", decode, 200)):
        ms_two, ms_one = paired(kind(two), kind(one), args.rounds, repeats)
        print(f"{name}: router + experts {ms_two:.2f} ms, moe {ms_one:.2f} ms, ratio {ms_two / ms_one:.2f}")
    library = GroupedExperts.grouped_linear
    ms_indexed, ms_unbound = paired(with_products(indexed, train(one)), with_products(library, train(one)),
                                    args.rounds, 10)
    print(f"training step of moe, products indexed {ms_indexed:.2f} ms, unbound {ms_unbound:.2f} ms, "
          f"ratio {ms_indexed / ms_unbound:.2f}")


def with_products(products: Callable[..., torch.Tensor], step: Callable[[], None]) -> Callable[[], None]:
    """`step` with the mixtures' products computed by `products`, the library's restored after."""
    def run() -> None:
        library = GroupedExperts.__dict__["grouped_linear"]
        GroupedExperts.grouped_linear = staticmethod(products)  # type: ignore[method-assign]
        try:
            step()
        finally:
            GroupedExperts.grouped_linear = library  # type: ignore[method-assign]
    return run


if __name__ == "__main__":
    main()
