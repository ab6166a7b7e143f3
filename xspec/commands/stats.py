"""`xspec stats SPEC`: parameters, FLOPs, memory and the paper's Table 1 view of a spec."""

from __future__ import annotations

import argparse
import json

import xspec
from xspec.commands.arguments import add_set_argument, int_at_least, parse_overrides
from xspec.base.errors import UserError

NAME = "stats"
HELP = "parameters per block, forward FLOPs per token, training memory, and Table 1 at the spec's n and d"
DESCRIPTION = """\
Reads the compiled graph of SPEC and reports:
  - the Table 3 hyperparameters (N, d_model, d_ff, h, d_k, d_v, P_drop, eps_ls, positions);
  - parameters, in total and per block (tied weights counted once);
  - forward FLOPs per token at sequence length n (2 per multiply-add, matrix products only);
  - float32 training memory at a batch of B sentences of n tokens: weights, gradients,
    Adam's two moments, and an estimate of the activations kept for the backward pass and of the
    loss's tensors; then how `xspec train` would cut an update into passes on this machine's CPU
    memory (train.max_batch_tokens = "auto", runtime/memory_plan.py);
  - Table 1 of the paper (complexity per layer, sequential operations, maximum path length) for
    the spec's attention layers, with recurrent, convolutional (kernel k) and restricted
    self-attention (neighbourhood r) rows from the paper's formulas for comparison;
  - with --train-cost, the FLOPs of training on the spec's schedule (train.max_steps updates of
    train.batch_tokens tokens, forward and backward), beside Table 2's 3.3e18 (base) and 2.3e19 (big).

n defaults to the longest sequence the spec trains on (data.max_tokens, within the positional
encodings); B to the train section's tokens per forward pass divided by n. The training cost takes
sentences of n tokens, n defaulting to a typical sentence (25). docs/stats.md has the conventions.

examples:
  xspec stats specs/base.xspec
  xspec stats specs/table3/C_dmodel1024.xspec --length 25 --batch 64
  xspec stats specs/big.xspec --json
  xspec stats specs/base.xspec --train-cost
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="the .xspec file")
    add_set_argument(parser)
    parser.add_argument("-n", "--length", type=int_at_least(1), metavar="N",
                        help="sequence length n (source and target); for --train-cost, default 25")
    parser.add_argument("-b", "--batch", type=int_at_least(1), metavar="B",
                        help="sentences per batch, for activation memory")
    parser.add_argument("-k", "--kernel", type=int_at_least(2), default=3, metavar="K",
                        help="convolution kernel width for Table 1's comparison row (default: 3)")
    parser.add_argument("-r", "--neighbourhood", type=int_at_least(1), default=16, metavar="R",
                        help="neighbourhood size for Table 1's restricted self-attention row (default: 16)")
    parser.add_argument("--train-cost", action="store_true",
                        help="also the training FLOPs of the spec's schedule, beside the paper's Table 2")
    parser.add_argument("--steps", type=int_at_least(1), metavar="S",
                        help="updates for --train-cost (default: the spec's train.max_steps)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    # Imported here: the statistics need the compiler's graph modules, which `xspec --help` does not.
    from xspec.stats import compute
    from xspec.stats.render import render, render_train_cost
    from xspec.stats.train_cost import train_cost

    if args.steps is not None and not args.train_cost:
        raise UserError("--steps is the schedule of --train-cost; add --train-cost")
    spec = xspec.compile(args.spec, overrides=parse_overrides(args.overrides))
    stats = compute(spec, length=args.length, batch=args.batch, kernel=args.kernel,
                    neighbourhood=args.neighbourhood)
    cost = train_cost(spec, steps=args.steps, length=args.length) if args.train_cost else None
    plan = _plan_here(spec, stats.memory.length)
    if args.json:
        print(json.dumps({**stats.to_json(), "memory_plan": plan,
                          **({"train_cost": cost.to_json()} if cost else {})}, indent=2))
    else:
        print(render(stats, f"xspec train here (float32, n = {stats.memory.length}): {plan['plan']}") +
              ("\n\n" + render_train_cost(cost) if cost else ""))
    return 0


def _plan_here(spec, length: int) -> dict:
    """What `xspec train` would plan on this machine's CPU, in float32, for sequences of `length` tokens."""
    import torch

    from xspec.runtime.memory_plan import Layout, free_memory, plan_memory

    free = free_memory(torch.device("cpu"))
    try:
        plan = plan_memory(spec, Layout("cpu", 4, 1, 1), 1, length, free)
    except UserError as error:
        return {"fits": False, "plan": str(error), "free_bytes": free.bytes}
    return {"fits": plan.fits, "plan": plan.describe(), "pass_tokens": plan.cap, "estimated_peak_bytes": plan.estimate,
            "free_bytes": free.bytes}
