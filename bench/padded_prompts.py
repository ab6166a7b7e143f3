"""Generating many prompts of different lengths: batches padded on the left against batches of one length.

    python bench/padded_prompts.py [--prompts 64] [--new 16] [--rounds 3] [--beam 1]

A random Llama (specs/modern/llama.xspec at d_model 256, 4 layers, vocabulary 1000) continues `--prompts`
prompts of 2 to 40 words (drawn once, seed 0; a word-level vocabulary trained on them) for `--new` tokens,
greedily or with beam search (`--beam`), with the runtime's Generator, as `xspec generate` does: once with
prompts of different lengths sharing a batch (padded on the left, the runtime's choice), once with each
batch of one length (what it did before, and still does for a recurrent model). Alternating round by round
in one process; prints each side's median seconds and prompts/s, their ratio, and whether both gave the
same continuations. It checks nothing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

import xspec
from xspec.runtime.generation import Generator
from xspec.runtime.vocab import train_vocab


class OneLength(Generator):
    """The generator batching prompts of one length only, as it did before it padded them."""

    def pads_prompts(self) -> bool:
        return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--beam", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(0)
    overrides = {"d_model": 256, "d_ff": 688, "heads": 8, "kv_heads": 4, "layers": 4,
                 "decode.max_new_tokens": args.new, "decode.beam": args.beam, "decode.sample": False}
    spec = xspec.compile("specs/modern/llama.xspec", overrides=overrides)
    model = spec.build(device="cpu").eval()
    draw = random.Random(0)
    words = [f"w{i}" for i in range(600)]
    lines = [" ".join(draw.choices(words, k=draw.randint(2, 40))) for _ in range(args.prompts)]
    with tempfile.TemporaryDirectory() as folder:  # a word's piece each: a prompt's length is its words'
        vocab = train_vocab([" ".join(words)] * 4 + lines, spec.vocab_size, "word", Path(folder))
    padded = Generator(model, vocab, spec.decode, torch.device("cpu"), max_tokens=256)
    one_length = OneLength(model, vocab, spec.decode, torch.device("cpu"), max_tokens=256)
    times: dict[str, list[float]] = {"padded": [], "one length": []}
    outputs = {}
    for _ in range(args.rounds):
        for name, generator in (("padded", padded), ("one length", one_length)):
            start = time.perf_counter()
            outputs[name] = generator.generate(lines)
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(seconds) for name, seconds in times.items()}
    for name, seconds in times.items():
        print(f"{name:>10}: {medians[name]:.2f} s ({min(seconds):.2f}-{max(seconds):.2f}), "
              f"{args.prompts / medians[name]:.1f} prompts/s")
    print(f"ratio (one length / padded): {medians['one length'] / medians['padded']:.2f}x; "
          f"same continuations: {outputs['padded'] == outputs['one length']}")


if __name__ == "__main__":
    main()
