"""Fine-tuning an imported Llama: xspec's training step against transformers' `LlamaForCausalLM`, in one process.

    python bench/finetune_lm.py [--size 30m|120m] [--rounds 5] [--precision fp32|bf16] [--profile]

The checkpoint is bench/decode_lm.py's (a random Llama written by transformers, imported by `xspec import`).
Each step is a batch of 8 sequences of 128 tokens: forward, cross entropy, backward and an Adam update in
float32 (`--precision bf16`: xspec's forward under bf16 autocast, as `train.precision = "bf16"` trains;
transformers' stays float32, as its Trainer's default). xspec's is the trainer's own (runtime/step.py's
model-plus-loss, fused Adam from runtime/schedule.py); transformers' is `model(input_ids, labels=...)` and
`torch.optim.Adam`, as its Trainer leaves them. The two alternate round by round; it prints target tokens/s
(medians) and, with --profile, the operators that take each step's time. It checks nothing (transformers is
needed).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import xspec
from decode_lm import SIZES, write_checkpoint
from speed import print_profile
from xspec.runtime.precision import choose_precision
from xspec.runtime.schedule import make_optimizer
from xspec.runtime.step import TrainingStep

BATCH, LENGTH, STEPS = 8, 128, 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="30m")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="then profile 3 steps of each")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="xspec's step's precision")
    args = parser.parse_args()
    from transformers import LlamaForCausalLM

    with tempfile.TemporaryDirectory() as temporary:
        source, run = Path(temporary) / "hf", Path(temporary) / "run"
        write_checkpoint(source, args.size)
        subprocess.run([sys.executable, "-m", "xspec", "import", str(source), "-o", str(run), "--no-verify"],
                       check=True, stdout=subprocess.DEVNULL)
        hf = LlamaForCausalLM.from_pretrained(source).train()
        trained = xspec.load(run, device="cpu", weights="fp32")
    ours = TrainingStep(trained.model.train(), label_smoothing=0.0)
    ours_adam = make_optimizer(ours.parameters(), trained.spec.train)
    for group in ours_adam.param_groups:  # the trainer's schedule sets it; here both take one small rate
        group["lr"] = 1e-5
    theirs_adam = torch.optim.Adam(hf.parameters(), lr=1e-5)
    torch.manual_seed(1)
    tokens = torch.randint(4, SIZES[args.size]["vocab_size"], (BATCH, LENGTH + 1))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]

    precision = choose_precision(torch.device("cpu"), args.precision)

    def ours_step() -> None:
        with precision.context():
            loss = ours(labels, inputs)
        loss.backward()
        ours_adam.step()
        ours_adam.zero_grad(set_to_none=True)

    def theirs_step() -> None:
        hf(input_ids=tokens, labels=tokens).loss.backward()  # transformers shifts the labels itself
        theirs_adam.step()
        theirs_adam.zero_grad(set_to_none=True)

    candidates = {"transformers": theirs_step, "xspec": ours_step}
    for step in candidates.values():  # warm-up
        step()
    speeds: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(args.rounds):
        for name, step in candidates.items():
            start = time.perf_counter()
            for _ in range(STEPS):
                step()
            speeds[name].append(STEPS * BATCH * LENGTH / (time.perf_counter() - start))
    median = {name: statistics.median(values) for name, values in speeds.items()}
    print(f"{args.size}: fine-tuning steps of {BATCH} x {LENGTH} tokens, xspec {precision.name}, transformers fp32, "
          f"{torch.get_num_threads()} threads; "
          f"target tokens/s (median of {args.rounds} rounds of {STEPS} steps)")
    for name, values in speeds.items():
        print(f"  {name:14s} {median[name]:8,.0f}   rounds: {', '.join(f'{v:,.0f}' for v in values)}")
    print(f"  xspec / transformers = {median['xspec'] / median['transformers']:.2f}")
    if args.profile:
        for name, step in candidates.items():
            print_profile(name, step)


if __name__ == "__main__":
    main()
