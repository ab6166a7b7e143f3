"""Hybrid models against an all-attention one of about the same size, on this machine: training tokens/s
(forward and backward of one sequence) and greedy ms per decoded token after a context, at 512, 2048 and
8192 positions, each model measured in one process, models alternating round by round.

    python bench/hybrid_speed.py [--rounds 3] [--lengths 512 2048 8192]

The models, 4 layers at d_model 256, vocabulary 8000, float32: llama.xspec (every layer attention, 8 heads
over 2 key/value heads); bamba.xspec (Mamba-2 in three layers of four: 8 heads of 64, state 64, chunks of
256); qwen3_next.xspec without experts (Gated DeltaNet in three layers of four: 4 query/key heads of 64, 8
value heads of 64, chunks of 64). A recurrent layer's decoding step reads a state of fixed size, so its
cost should not grow with the context; attention's reads every cached position. It prints figures and
asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import xspec
from xspec.runtime.cache import DecoderCache

COMMON = {"vocab": 8000, "d_model": 256, "layers": 4, "heads": 8, "kv_heads": 2, "d_ff": 688}
MODELS = {
    "llama (attention)": ("specs/modern/llama.xspec", {}),
    "bamba (Mamba-2 hybrid)": ("specs/modern/bamba.xspec", {"mamba_n_heads": 8, "mamba_d_state": 64,
                                                             "mamba_chunk_size": 256}),
    "qwen3_next (Gated DeltaNet hybrid)": ("specs/modern/qwen3_next.xspec", {
        "head_dim": 32, "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 64,
        "linear_value_head_dim": 64, "sparse_layers": [False] * 4, "shared_expert_intermediate_size": 0}),
}
STEPS = 16  # decoded tokens timed after the context


def build(path: str, overrides: dict) -> tuple[torch.nn.Module, int]:
    spec = xspec.compile(path, overrides={**COMMON, **overrides, "data.block_size": 8192})
    torch.manual_seed(0)
    return spec.build("cpu"), spec.parameters


def train_seconds(model: torch.nn.Module, length: int) -> float:
    """One forward and backward over a sequence of `length` tokens."""
    tokens = torch.randint(4, COMMON["vocab"], (1, length + 1))
    model.train()
    start = time.perf_counter()
    logits = model(tokens[:, :-1])
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed


@torch.no_grad()
def step_ms(model: torch.nn.Module, context: int) -> float:
    """Milliseconds per greedy token after a context of `context` positions (prefilled, not timed)."""
    model.eval()
    cache = DecoderCache()
    logits = model.decode(torch.randint(4, COMMON["vocab"], (1, context)), cache=cache)
    token = logits[:, -1:].argmax(-1)
    start = time.perf_counter()
    for _ in range(STEPS):
        token = model.decode(token, cache=cache)[:, -1:].argmax(-1)
    return (time.perf_counter() - start) / STEPS * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    models = {name: build(path, overrides) for name, (path, overrides) in MODELS.items()}
    for name, (_, parameters) in models.items():
        print(f"{name}: {parameters:,} parameters")
    print("\n| model | n | training tokens/s | greedy ms/token after n |\n|---|---|---|---|")
    for length in args.lengths:
        train: dict[str, list[float]] = {name: [] for name in models}
        decode: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(args.rounds):  # the models alternate within each round
            for name, (model, _) in models.items():
                train[name].append(train_seconds(model, length))
                decode[name].append(step_ms(model, length))
        for name in models:
            print(f"| {name} | {length} | {length / statistics.median(train[name]):,.0f} | "
                  f"{statistics.median(decode[name]):.2f} |")


if __name__ == "__main__":
    main()
