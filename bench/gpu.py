"""Training speed on one GPU: target tokens/s, model FLOPs utilisation (MFU), peak memory, compile time,
and how many graphs torch.compile builds while being timed, for the paper's base and big models.

    python bench/gpu.py                                   # base and big, bf16, --compile on, one GPU
    python bench/gpu.py --specs big --steps 50 --peak-tflops 989
    python bench/gpu.py --specs tiny --device cpu --steps 3 --warmup 1 --batch-tokens 2000   # a dry run

It runs the trainer itself (`make_trainer`, `Trainer.run`: the batcher, collation on a background
thread, fused Adam, losses read back every `train.log_every_steps`), on a synthetic corpus with WMT-like
lengths and random token ids: source lengths log-normal (median 24 subword tokens, sigma 0.66, the shape
of WMT newstest2013 EN-DE's lengths, clipped to data.max_tokens), each target its source's length times
a log-normal ratio (sigma 0.15). Updates of `train.batch_tokens` target tokens (25000, §5.1).

The first `--warmup` updates compile the step and are timed apart (compile time); then `--steps` updates
are timed. Model FLOPs count each sentence pair at its own lengths, three times the forward (forward and
backward), from the spec's own counts (`example_flops`; matrix products only, docs/stats.md); padding
is not counted, so MFU is useful work. "padded" counts what the GPU computed, padding included.
MFU is against `--peak-tflops` (989: an H100 SXM's dense bf16); on a CPU it is left out unless given.

It prints figures and checks nothing.
"""

from __future__ import annotations

import argparse
import functools
import math
import random
import tempfile
import time
from pathlib import Path

import torch

import xspec
from xspec.runtime import distributed
from xspec.runtime.corpus import EncodedPairs
from xspec.runtime.run_dir import DataFiles
from xspec.runtime.run_log import RunLog
from xspec.runtime.tasks import Corpus
from xspec.runtime.train import RunOptions, make_trainer
from xspec.runtime.vocab import EOS
from xspec.compiler.cost import example_flops

SPECS = Path(__file__).resolve().parent.parent / "specs"
H100_DENSE_BF16_TFLOPS = 989.0
FIRST_ID = EOS + 1            # the ids below are PAD, UNK, BOS and EOS


def wmt_like_corpus(pairs: int, vocab_size: int, max_tokens: int, seed: int) -> EncodedPairs:
    """Random ids at WMT-like lengths (see the module docstring); a source ends with EOS, as the trainer's."""
    rng = random.Random(seed)
    lengths = []
    for _ in range(pairs):
        src_len = min(max_tokens - 1, max(1, round(math.exp(rng.gauss(math.log(24), 0.66)))))
        lengths.append((src_len, min(max_tokens - 1, max(1, round(src_len * math.exp(rng.gauss(0.0, 0.15)))))))
    ids = iter(torch.randint(FIRST_ID, vocab_size, (sum(s + t for s, t in lengths),),
                             generator=torch.Generator().manual_seed(seed)).tolist())
    sources = [[next(ids) for _ in range(s)] + [EOS] for s, _ in lengths]
    targets = [[next(ids) for _ in range(t)] for _, t in lengths]
    return EncodedPairs(sources, targets)


def compiled_graphs() -> tuple[int, int]:
    """(graphs compiled, graph breaks) so far in this process, from torch._dynamo's counters."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


class Flops:
    """Forward FLOPs of micro-batches: real (each pair at its own lengths) and padded (what runs)."""

    def __init__(self, spec, data: EncodedPairs) -> None:
        self.data = data
        self.pair = functools.lru_cache(maxsize=None)(
            lambda src_len, tgt_len: example_flops(spec, {"src_len": src_len, "tgt_len": tgt_len}))

    def micro_batch(self, indices: list[int]) -> tuple[int, int]:
        # The model reads the source (with its EOS) and BOS + target: both as long as the trainer feeds them.
        lengths = [(len(self.data.source[i]), len(self.data.target[i]) + 1) for i in indices]
        real = sum(self.pair(s, t) for s, t in lengths)
        longest_src, longest_tgt = max(s for s, _ in lengths), max(t for _, t in lengths)
        return real, len(indices) * self.pair(longest_src, longest_tgt)


def measure(spec_name: str, args: argparse.Namespace) -> dict:
    overrides = {"train.max_steps": args.warmup, "train.max_minutes": 10_000.0,
                 "train.checkpoint_every_minutes": 1e9, "train.validate_every_steps": 10**9}
    if args.batch_tokens is not None:
        overrides["train.batch_tokens"] = args.batch_tokens
    if args.precision is not None:
        overrides["train.precision"] = args.precision
    path = str(SPECS / f"{spec_name}.xspec")
    spec = xspec.compile(path, overrides=overrides)
    timed_spec = xspec.compile(path, overrides={**overrides, "train.max_steps": args.warmup + args.steps})
    context = distributed.setup(args.device)
    data = wmt_like_corpus(args.pairs, spec.vocab_size, min(spec.data.max_tokens, spec.max_positions or 10**9),
                           args.seed)
    with tempfile.TemporaryDirectory() as run_dir:
        options = RunOptions(Path(run_dir), DataFiles(), compile=args.compile, progress=False, evaluate=False)
        # No validation set and no checkpoint: the trainer never needs a vocabulary here.
        trainer = make_trainer(spec, Path(run_dir), context, Corpus(data, None), None, options,
                               RunLog(enabled=False))
        cuda = context.device.type == "cuda"

        started = time.perf_counter()
        trainer.run(lambda: False)                 # the warm-up updates: compilation happens here
        warmup_s = time.perf_counter() - started
        graphs_before, breaks_before = compiled_graphs()

        flops = Flops(spec, data)
        # Planned micro-batches hold a window's local ids; the corpus is indexed by global ones.
        timed = [[window.global_ids(m) for m in update]
                 for _, (window, _, _, update) in zip(range(args.steps), trainer.planned_updates())]
        real_flops, padded_flops = (3 * sum(f) for f in zip(*(flops.micro_batch(m) for u in timed for m in u)))
        tokens = sum(len(data.target[i]) + 1 for update in timed for m in update for i in m)
        if cuda:
            torch.cuda.reset_peak_memory_stats(context.device)
        trainer.spec = timed_spec                  # the same run, now allowed to go on to warmup + steps
        started = time.perf_counter()
        trainer.run(lambda: False)                 # ends with a read-back of the losses: the device is done
        seconds = time.perf_counter() - started
        graphs_after, breaks_after = compiled_graphs()
    per_update_s = seconds / args.steps
    return {
        "spec": spec_name, "parameters": spec.parameters, "precision": trainer.precision.name,
        "compiled": trainer.runner is not trainer.wrapped,
        "tokens_per_s": tokens / seconds, "tokens_per_update": tokens / args.steps,
        "update_ms": 1000 * per_update_s,
        "tflops": real_flops / seconds / 1e12, "padded_tflops": padded_flops / seconds / 1e12,
        "peak_gib": torch.cuda.max_memory_allocated(context.device) / 2**30 if cuda else None,
        "compile_s": max(0.0, warmup_s - args.warmup * per_update_s),
        "graphs_timed": graphs_after - graphs_before, "breaks_timed": breaks_after - breaks_before,
        "graphs_total": graphs_after, "device": torch.cuda.get_device_name(context.device) if cuda else "cpu",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--specs", nargs="+", default=["base", "big"], help="names in specs/ (default: base big)")
    parser.add_argument("--device", default=None, help="default: cuda if there is one, else cpu")
    parser.add_argument("--compile", choices=("on", "off"), default="on")
    parser.add_argument("--precision", choices=("auto", "bf16", "fp16", "fp32"), default=None,
                        help="train.precision (default: the spec's, auto)")
    parser.add_argument("--steps", type=int, default=30, help="timed updates")
    parser.add_argument("--warmup", type=int, default=5, help="updates before timing (compilation)")
    parser.add_argument("--batch-tokens", type=int, default=None, help="train.batch_tokens (default: the spec's)")
    parser.add_argument("--pairs", type=int, default=100_000, help="synthetic sentence pairs")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help=f"the device's peak (default on CUDA: {H100_DENSE_BF16_TFLOPS:g}, H100 dense bf16)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    print(f"{'spec':<6} {'params':>7} {'prec':>4} {'tok/s':>9} {'tok/upd':>8} {'ms/upd':>7} {'TFLOP/s':>8} "
          f"{'padded':>7} {'MFU':>6} {'peak GiB':>8} {'compile s':>9} {'graphs timed':>12} {'breaks':>6}")
    for name in args.specs:
        r = measure(name, args)
        peak = args.peak_tflops or (H100_DENSE_BF16_TFLOPS if r["device"] != "cpu" else None)
        mfu = f"{r['tflops'] / peak:.1%}" if peak else "-"
        memory = f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "-"
        print(f"{name:<6} {r['parameters'] / 1e6:>6.1f}M {r['precision']:>4} {r['tokens_per_s']:>9,.0f} "
              f"{r['tokens_per_update']:>8,.0f} {r['update_ms']:>7.1f} {r['tflops']:>8.4g} {r['padded_tflops']:>7.4g} "
              f"{mfu:>6} {memory:>8} {r['compile_s']:>9.1f} {r['graphs_timed']:>12} {r['breaks_timed']:>6}")
    print(f"device: {r['device']}; compiled: {r['compiled']}; torch {torch.__version__}; "
          f"MFU against {peak or '-'} TFLOP/s; model FLOPs = 3 x forward, real tokens only")


if __name__ == "__main__":
    main()
