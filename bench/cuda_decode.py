"""Decoding on a GPU against decoding on the CPU, for trained runs: the same outputs, the same scores.

    python bench/cuda_decode.py runs/tiny runs/lm            # translation and language-model runs
    python bench/cuda_decode.py runs/tiny --lines 200 --device cpu   # a dry run: the CPU against itself

For each run, its test split (RUN/data/test.*) is decoded on the CPU in float32, the reference, then on
the GPU three ways: float32 (torch's default, TF32 off), bf16 autocast (decode.precision auto on a GPU),
and bf16 with the decoder's step compiled (`--compile auto` on a GPU). A translation run is translated
with beam search and its reference pairs scored; a language model continues each test line's first
words greedily and scores the lines. Printed: lines decoded identically, BLEU (translation), and the
largest difference of a line's log-probability from the CPU's.

float32 on the GPU should agree with the CPU but for near-ties; bf16 rounds every product's inputs to
8 bits of mantissa, so some lines differ, and BLEU says whether that matters. It prints figures and
checks nothing.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import sacrebleu
import torch

import xspec
from xspec.runtime.inference import TrainedModel, score_lines, score_pairs


@dataclass
class Decoded:
    outputs: list[str]
    scores: list[float]
    seconds: float


def test_split(run: Path, lines: int) -> tuple[list[str], list[str] | None]:
    """(sources or texts, references or None) of the run's test split, the first `lines` of it."""
    data = run / "data"
    if (data / "test.src").is_file():
        sources = (data / "test.src").read_text(encoding="utf-8").splitlines()[:lines]
        references = (data / "test.tgt").read_text(encoding="utf-8").splitlines()[:lines]
        return sources, references
    return (data / "test.txt").read_text(encoding="utf-8").splitlines()[:lines], None


def load(run: Path, device: str, compiled: str) -> TrainedModel:
    """The run's model with its weights as trained: only the precision of the products differs."""
    return xspec.load(run, device=device, compile=compiled, weights="fp32")


def decode(model: TrainedModel, texts: list[str], references: list[str] | None, precision: str,
           new_tokens: int) -> Decoded:
    started = time.perf_counter()
    if references is not None:
        outputs = model.translator(precision=precision).translate(texts)
        scores = score_pairs(model.members, model.tokenizer, model.max_tokens, model.device, texts, references,
                             precision)
    else:
        prompts = [" ".join(text.split()[:3]) for text in texts]
        outputs = model.generator(precision=precision, max_new_tokens=new_tokens, sample=False,
                                  beam=1).generate(prompts)
        scores = score_lines(model.members, model.tokenizer, texts, model.device, model.max_tokens, 4000,
                             precision).log_probs
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    return Decoded(outputs, scores, time.perf_counter() - started)


def compare(run: Path, args: argparse.Namespace) -> None:
    texts, references = test_split(run, args.lines)
    kind = "translate, beam" if references is not None else f"generate {args.new_tokens} greedy,"
    print(f"{run}: {len(texts)} lines; {kind} and score")
    cpu = decode(load(run, "cpu", "off"), texts, references, "fp32", args.new_tokens)
    print(f"  {'device':<7} {'precision':<9} {'compiled':<8} {'identical':>11} {'BLEU':>6} {'max |dlogp|':>11} "
          f"{'seconds':>8}")
    ways = [("cpu", "fp32", "off", cpu)] + [(args.device, precision, compiled, None) for precision, compiled in
                                            (("fp32", "off"), ("bf16", "off"), ("bf16", "on"))]
    for device, precision, compiled, result in ways:
        if result is None:
            result = decode(load(run, device, compiled), texts, references, precision, args.new_tokens)
        same = sum(a == b for a, b in zip(result.outputs, cpu.outputs))
        bleu = (f"{sacrebleu.corpus_bleu(result.outputs, [references]).score:.2f}" if references is not None
                else "-")
        gap = max(abs(a - b) for a, b in zip(result.scores, cpu.scores))
        print(f"  {device:<7} {precision:<9} {compiled:<8} {same:>5}/{len(texts):<5} {bleu:>6} {gap:>11.2e} "
              f"{result.seconds:>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="trained run directories")
    parser.add_argument("--device", default="cuda", help="the device compared with the CPU (default: cuda)")
    parser.add_argument("--lines", type=int, default=500, help="test lines decoded (default: 500)")
    parser.add_argument("--new-tokens", type=int, default=30, help="a language model's continuation length")
    args = parser.parse_args()
    print(f"torch {torch.__version__}; {torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}")
    for run in args.runs:
        compare(run, args)


if __name__ == "__main__":
    main()
