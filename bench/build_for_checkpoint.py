"""What building a model to load a checkpoint into costs: constructed and initialized on the device (as
before models were built on the meta device), against `spec.build(init=False)`, which gives the tensors
memory once and initializes nothing but the buffers modules derive. Both then load the same state dict.

    python bench/build_for_checkpoint.py                       # a 200M-parameter Llama
    python bench/build_for_checkpoint.py --d-model 2048 --layers 16 --rounds 3

Prints the seconds of each way per round (the two alternate in one process) and the median ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import xspec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    heads = args.d_model // 64
    spec = xspec.compile("specs/modern/llama.xspec", overrides={
        "d_model": args.d_model, "layers": args.layers, "heads": heads, "kv_heads": max(1, heads // 4),
        "d_ff": args.d_model * 8 // 3 // 64 * 64, "vocab": args.vocab})
    state = {name: tensor.clone() for name, tensor in spec.build("cpu").state_dict().items()}
    model_class = spec.model_class()
    print(f"llama, {spec.parameters:,} parameters ({args.d_model} wide, {args.layers} layers)")

    def constructed() -> float:
        start = time.perf_counter()
        with torch.device("cpu"):
            model = model_class()
        model.load_state_dict(state)
        return time.perf_counter() - start

    def built_empty() -> float:
        start = time.perf_counter()
        model = spec.build("cpu", init=False)
        model.load_state_dict(state)
        return time.perf_counter() - start

    ratios = []
    for round_ in range(args.rounds):
        a, b = constructed(), built_empty()
        ratios.append(a / b)
        print(f"round {round_ + 1}: constructed and initialized {a:.2f} s, built for the checkpoint {b:.2f} s")
    print(f"median: building for a checkpoint is {statistics.median(ratios):.1f}x faster")


if __name__ == "__main__":
    main()
