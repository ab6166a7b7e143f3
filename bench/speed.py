"""Training and decoding speed of an xspec model against a hand-written torch.nn.Transformer, in one process.

The two candidates alternate round by round (speeds on a shared 2-core machine drift by 20-30%, so
only ratios taken side by side mean anything; see ../shared/BASELINES.md). Run under tcmalloc:

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 python bench/speed.py [--size tiny|small|base]

Training: a batch of 128 x 32 source and target tokens, forward + label-smoothed loss + backward +
Adam step. xspec computes in the precision `--precision` asks for, as train.precision does
(runtime/precision.py: bf16 autocast needs a CPU with bf16 matrix instructions) and draws dropout's masks
as the trainer does (runtime/dropout_masks.py); nn.Transformer in float32 and, where xspec runs in bf16,
under the same autocast. Decoding: the runtime's beam search (beam 4) over
64 sentences of 24 tokens for 74 steps (EOS banned), with the model's key/value cache, in xspec's
precision.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn

import xspec
from xspec.runtime.beam_search import beam_search
from xspec.runtime.dropout_masks import dropout_masks
from xspec.runtime.precision import Precision, choose_precision
from xspec.runtime.vocab import EOS

SIZES = {  # (d_model, layers, heads, d_ff), vocab 8000 as in BASELINES.md
    "tiny": (128, 2, 4, 512),
    "small": (256, 3, 4, 1024),
    "base": (512, 6, 8, 2048),  # the paper's base model (Table 3), at this vocabulary
}


class HandWritten(nn.Module):
    """The reference: nn.Transformer with tied embeddings, sinusoidal positions, post-norm (§3)."""

    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, d_ff: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab, d_model)
        self.transformer = nn.Transformer(d_model, heads, layers, layers, d_ff, 0.1, batch_first=True)
        position = torch.arange(1024)[:, None]
        div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(1024, d_model)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(position * div), torch.cos(position * div)
        self.register_buffer("pe", pe)

    def _embed(self, tokens):
        return self.embed(tokens) * math.sqrt(self.d_model) + self.pe[: tokens.size(1)]

    def forward(self, src, tgt, src_padding):
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1))
        hidden = self.transformer(self._embed(src), self._embed(tgt), tgt_mask=causal, tgt_is_causal=True,
                                  src_key_padding_mask=src_padding, memory_key_padding_mask=src_padding)
        return hidden @ self.embed.weight.T


def train_step(model, optimizer, precision: Precision, src, tgt_in, labels, padding,
               masks: AbstractContextManager = nullcontext()) -> None:
    with precision.context(), masks:
        logits = model(src, tgt_in, padding)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), label_smoothing=0.1)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def print_profile(name: str, step, steps: int = 3, top: int = 10) -> None:
    """The operators that take most of `steps` calls of `step`, by their own CPU time, with their share."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        for _ in range(steps):
            step()
    averages = sorted(profiled.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in averages)
    print(f"  profile, {name}: {total / 1000 / steps:.1f} ms a step")
    for event in averages[:top]:
        print(f"    {event.key:48s} {event.self_cpu_time_total / total:6.1%}  {event.count // steps:5d} calls a step")


class NoEos(nn.Module):
    """Bans EOS so that every sentence decodes for the full length (a fixed amount of work)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def encode(self, *args):
        return self.model.encode(*args)

    def decode(self, *args, **kwargs):
        logits = self.model.decode(*args, **kwargs)
        logits[..., EOS] = float("-inf")
        return logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="tiny")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="training steps per round and candidate")
    parser.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                        help="xspec's precision, chosen as train.precision chooses it")
    parser.add_argument("--compile", action="store_true",
                        help="also time a torch.compile'd copy of the xspec model (and its compile time)")
    parser.add_argument("--profile", action="store_true",
                        help="then profile 3 training steps of each candidate: the operators taking most time")
    args = parser.parse_args()
    d_model, layers, heads, d_ff = SIZES[args.size]
    torch.manual_seed(0)
    spec = xspec.compile("specs/base.xspec", overrides={"vocab": 8000, "d_model": d_model, "layers": layers,
                                                        "heads": heads, "d_ff": d_ff})
    chosen = choose_precision(torch.device("cpu"), args.precision, training=True)
    fp32 = Precision("cpu", None)
    print(f"xspec computes in {chosen.describe()}")
    candidates = {"xspec": spec.build(device="cpu"), "nn.Transformer": HandWritten(8000, d_model, layers, heads, d_ff)}
    precisions = {"xspec": chosen, "nn.Transformer": fp32}
    if chosen.dtype is not None:
        torch.manual_seed(0)
        candidates["nn.Transformer bf16"] = HandWritten(8000, d_model, layers, heads, d_ff)
        precisions["nn.Transformer bf16"] = chosen
    if args.compile:
        candidates["xspec compiled"] = torch.compile(spec.build(device="cpu"))
        precisions["xspec compiled"] = chosen
    masks = {k: dropout_masks(torch.device("cpu"), m) if k.startswith("xspec") else nullcontext()
             for k, m in candidates.items()}
    optimizers = {k: torch.optim.Adam(m.parameters(), betas=(0.9, 0.98), eps=1e-9) for k, m in candidates.items()}
    src, tgt = torch.randint(4, 8000, (128, 32)), torch.randint(4, 8000, (128, 33))
    padding = torch.zeros(128, 32, dtype=torch.bool)
    speeds: dict[str, list[float]] = {k: [] for k in candidates}
    for name, model in candidates.items():       # warm-up (and compilation)
        start = time.perf_counter()
        train_step(model, optimizers[name], precisions[name], src, tgt[:, :-1], tgt[:, 1:], padding, masks[name])
        train_step(model, optimizers[name], precisions[name], src, tgt[:, :-1], tgt[:, 1:], padding, masks[name])
        print(f"  {name}: first two steps {time.perf_counter() - start:.1f} s")
    for _ in range(args.rounds):
        for name, model in candidates.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                train_step(model, optimizers[name], precisions[name], src, tgt[:, :-1], tgt[:, 1:], padding,
                           masks[name])
            speeds[name].append(args.steps * 128 * 32 / (time.perf_counter() - start))
    median = {k: statistics.median(v) for k, v in speeds.items()}
    print(f"{args.size}: training, target tokens/s (median of {args.rounds} rounds, {torch.get_num_threads()} threads)")
    for name, value in median.items():
        print(f"  {name:15s} {value:8,.0f}   rounds: {', '.join(f'{v:,.0f}' for v in speeds[name])}")
    print(f"  xspec ({chosen.name}) / nn.Transformer (fp32) = {median['xspec'] / median['nn.Transformer']:.2f}")
    if "nn.Transformer bf16" in median:
        print(f"  xspec ({chosen.name}) / nn.Transformer (bf16) = "
              f"{median['xspec'] / median['nn.Transformer bf16']:.2f}")
    if args.profile:
        for name, model in candidates.items():
            print_profile(name, lambda: train_step(model, optimizers[name], precisions[name], src, tgt[:, :-1],
                                                   tgt[:, 1:], padding, masks[name]))
    if args.compile:
        print(f"  compiled / eager xspec = {median['xspec compiled'] / median['xspec']:.2f}")

    model = NoEos(candidates["xspec"].eval())
    sources = torch.randint(4, 8000, (64, 24))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        with torch.no_grad(), chosen.context():
            beam_search(model, sources, torch.zeros_like(sources, dtype=torch.bool), beam=4, alpha=0.6,
                        max_len_a=0.0, max_len_b=74)
        times.append(time.perf_counter() - start)
    print(f"{args.size}: xspec beam search ({chosen.name}), beam 4, 64 sentences x 74 steps: "
          f"{64 / statistics.median(times):.1f} sentences/s (median of 3)")


if __name__ == "__main__":
    main()
