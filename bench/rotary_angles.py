"""What keeping rotary angles saves a decoding step: the library's RotaryEmbedding, which makes the cos and
sin of every position once and slices them, against the same module computing them in every forward (a
Llama's decoder makes them once a forward for all its layers), on a Llama decoding greedily with its cache.

    python bench/rotary_angles.py                     # 8 layers, 512 wide, batch 1 and 4
    python bench/rotary_angles.py --rounds 7 --steps 96

Prints ms per step of each (alternating in one process, medians) and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import xspec
from xspec.nn import RotaryEmbedding
from xspec.runtime.cache import DecoderCache


def per_call(self: RotaryEmbedding, x: torch.Tensor, cache: DecoderCache | None = None) -> torch.Tensor:
    """The angles [B, T, 2 * dim] of this call's positions, computed anew (no row is padded here)."""
    start = cache.length if cache is not None else 0
    position = torch.arange(start, start + x.size(1), device=x.device, dtype=torch.float32)
    angles = torch.outer(position, self.inverse_frequency).repeat(1, 2)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).expand(x.size(0), -1, -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=48)
    args = parser.parse_args()
    spec = xspec.compile("specs/modern/llama.xspec", overrides={
        "d_model": 512, "layers": 8, "heads": 8, "kv_heads": 4, "d_ff": 1376, "vocab": 8000})
    torch.manual_seed(0)
    model = spec.build("cpu").eval()
    kept = RotaryEmbedding.forward

    def step_ms(batch: int) -> float:
        with torch.no_grad():
            cache = DecoderCache()
            model.decode(torch.randint(4, 8000, (batch, 32)), cache=cache)
            token = torch.randint(4, 8000, (batch, 1))
            start = time.perf_counter()
            for _ in range(args.steps):
                model.decode(token, cache=cache)
            return (time.perf_counter() - start) / args.steps * 1000

    for batch in (1, 4):
        computed, sliced = [], []
        for _ in range(args.rounds):
            RotaryEmbedding.forward = per_call  # type: ignore[method-assign]
            computed.append(step_ms(batch))
            RotaryEmbedding.forward = kept  # type: ignore[method-assign]
            sliced.append(step_ms(batch))
        a, b = statistics.median(computed), statistics.median(sliced)
        print(f"batch {batch}: angles per call {a:.2f} ms a step, kept {b:.2f} ms: {a / b:.2f}x")


if __name__ == "__main__":
    main()
