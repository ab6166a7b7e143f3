"""`xspec plot RUN [RUN ...]`: training curves of one or more runs, overlaid, in one image."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from xspec.base.files import check_output_file
from xspec.base.text import shown

NAME = "plot"
HELP = "draw the training curves of one or more runs (loss, perplexity, BLEU, learning rate)"
DESCRIPTION = """\
Draws what each RUN's metrics.jsonl logged during training, one colour per run, each panel against
training steps (or, with --x time, wall time since the run's first record):

  training loss          smoothed by an exponential moving average; the raw values are drawn faint
  validation perplexity  exp(valid_loss), on a log scale
  validation BLEU        when some run validated BLEU during training
  learning rate

The legend names each run by its folder (with enough of its path to tell two runs of the same name
apart). The image format follows FILE's extension: .png, .svg, .pdf (or another matplotlib writes).
A run still training can be drawn at any time: the figure shows the steps logged so far.

examples:
  xspec plot runs/tiny -o curves.png
  xspec plot runs/base runs/big -o compare.svg --title "base vs big"
  xspec plot runs/table3/runs/* -o table3.png --x time
"""

_SIZE = re.compile(r"(\d+)[x×](\d+)")
_SIZE_RANGE = (200, 10_000)     # pixels: smaller is unreadable, larger is no longer a picture


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", metavar="RUN", nargs="+", help="run directories (what `xspec train` writes)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="the image: .png, .svg, .pdf, ...")
    parser.add_argument("--x", choices=("steps", "time"), default="steps",
                        help="the horizontal axis: training steps (default) or wall time")
    parser.add_argument("--title", metavar="TEXT", help="a title above the panels")
    parser.add_argument("--size", type=image_size, default=(1200, 800), metavar="WIDTHxHEIGHT",
                        help="the image's size in pixels (default 1200x800; at 100 dpi for .svg and .pdf)")


def image_size(text: str) -> tuple[int, int]:
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT in pixels, e.g. 1200x800, got {text!r}")
    width, height = int(match[1]), int(match[2])
    least, most = _SIZE_RANGE
    if not (least <= width <= most and least <= height <= most):
        raise argparse.ArgumentTypeError(f"width and height must be {least} to {most:,} pixels, got {text!r}")
    return width, height


image_size.__name__ = "size"    # argparse names the type in its own messages


def run(args: argparse.Namespace) -> int:
    from xspec.plot import check_image_format, plot_runs

    output = check_output_file(Path(args.output), "--output")
    check_image_format(output)
    curves = plot_runs([Path(d) for d in args.run_dirs], output, x=args.x, title=args.title, size=args.size)
    for run in curves:
        if run.untimed:
            print(f"note: {run.label}: {run.untimed} records logged without a time are left out of --x time",
                  file=sys.stderr)
    drawn = ", ".join(f"{run.label} (to step {run.last_step})" for run in curves)
    print(f"wrote {shown(output)}: {drawn}")
    return 0
