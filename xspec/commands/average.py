"""`xspec average`: average a run's last N checkpoints (§6.1: 5 for base models, 20 for big)."""

from __future__ import annotations

import argparse
from pathlib import Path

from xspec.commands.arguments import int_at_least
from xspec.files import check_output_file

NAME = "average"
HELP = "average the last N checkpoints of a run into one checkpoint"
DESCRIPTION = """\
Writes the element-wise mean of RUN's last N checkpoints. The paper decodes the base models with
the average of the last 5 checkpoints (written every 10 minutes) and the big models with the last 20.
The average is a safetensors checkpoint whatever the file's name, and translates on its own.

example:
  xspec average runs/base --last 5 -o runs/base/averaged.safetensors
  xspec eval runs/base/averaged.safetensors --src test.en --ref test.de
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="a run directory")
    parser.add_argument("--last", type=int_at_least(1), default=5,
                        help="how many of the latest checkpoints (default 5)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="the averaged checkpoint")


def run(args: argparse.Namespace) -> int:
    from xspec.runtime.average import average_run

    output = check_output_file(Path(args.output), "--output")
    chosen = average_run(Path(args.run_dir), args.last, output)
    print(f"averaged {len(chosen)} checkpoints ({chosen[0].name} ... {chosen[-1].name}) into {output}")
    return 0
