"""The k largest scores of each row, runtime/top_k.py's chunked selection against torch.topk, on rows as
wide as vocabularies (bench/decode.py's 8000, Llama's 32000, opus-mt-en-de's 58101, Qwen's 151936): beam
search takes the best 2 x beam of each hypothesis's row, sampling the top k.

    python bench/top_k.py [--rows 256] [--rounds 5]

Prints microseconds a call of each (alternating in one process, medians) and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from xspec.runtime.top_k import top_k


def timed(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=256, help="hypotheses a step scores (64 sentences x beam 4)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"{args.rows} rows, threads {torch.get_num_threads()}; microseconds a call, median of {args.rounds} rounds")
    for width in (8000, 32000, 58101, 151936):
        scores = torch.randn(args.rows, width)
        for k in (8, 50):
            calls = max(3, 2_000_000 // width)
            times: dict[str, list[float]] = {"torch.topk": [], "top_k": []}
            for _ in range(args.rounds):
                times["torch.topk"].append(timed(lambda: scores.topk(k, dim=-1), calls))
                times["top_k"].append(timed(lambda: top_k(scores, k), calls))
            theirs, ours = (statistics.median(times[name]) for name in ("torch.topk", "top_k"))
            print(f"  width {width:6d}, k {k:2d}: torch.topk {theirs:8.0f}  top_k {ours:8.0f}  ({theirs / ours:.2f}x)")


if __name__ == "__main__":
    main()
