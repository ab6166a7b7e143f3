"""`xspec average`: average a run's last N checkpoints (§6.1: 5 for base models, 20 for big)."""

from __future__ import annotations

import argparse
from pathlib import Path

from xspec.commands.arguments import int_at_least
from xspec.base.files import check_output_file
from xspec.base.text import shown

NAME = "average"
HELP = "average the last N (or the best N) checkpoints of a run into one checkpoint"
DESCRIPTION = """\
Writes the element-wise mean of RUN's last N checkpoints (default: the spec's train.average_last). The
paper decodes the base models with the average of the last 5 checkpoints (written every 10 minutes)
and the big models with the last 20.
With --best N, the mean of the N best-validated checkpoints the run kept (RUN/checkpoints/best/,
train.keep_best of them; ranked by validation loss, or BLEU with train.validate_bleu).
The average is a safetensors checkpoint whatever the file's name, and translates on its own.

examples:
  xspec average runs/base --last 5 -o runs/base/averaged.safetensors
  xspec eval runs/base/averaged.safetensors --src test.en --ref test.de
  xspec average runs/base --best 3 -o runs/base/best3.safetensors
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="a run directory")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--last", type=int_at_least(1),
                       help="how many of the latest checkpoints (default: the run's train.average_last)")
    which.add_argument("--best", type=int_at_least(1), help="how many of the best-validated checkpoints")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="the averaged checkpoint")


def run(args: argparse.Namespace) -> int:
    from xspec.runtime.average import average_run

    output = check_output_file(Path(args.output), "--output")
    chosen = average_run(Path(args.run_dir), output, last=args.last, best=args.best)
    print(f"averaged {len(chosen)} checkpoints ({chosen[0].name} ... {chosen[-1].name}) into {shown(output)}")
    return 0
