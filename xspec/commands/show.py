"""`xspec show RUN`: one page on a run: spec, data, progress, why it stopped, best and test figures, commands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NAME = "show"
HELP = "describe a run: spec, data, steps, why it stopped, best validation, test scores, what to run next"
DESCRIPTION = """\
Reads a run directory (what `xspec train` writes) and prints: the spec and its size, the data files,
how far training went and how long it took, why it stopped, the last and the best validation, the
test scores, the checkpoints kept, and the commands that resume, translate (or generate), evaluate,
average and plot it. Nothing is loaded onto a device.

examples:
  xspec show runs/tiny-20261123-101500
  xspec show runs/base --json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="a run directory")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from xspec.hf.summary import import_summary, is_import
    from xspec.hf.summary import render as render_import
    from xspec.run_summary import render, summarize

    run_dir = Path(args.run_dir)
    if is_import(run_dir) and not (run_dir / "run.json").exists():   # an import, not yet trained further
        found = import_summary(run_dir)
        print(json.dumps(found, indent=2) if args.json else render_import(found), end="\n" if args.json else "")
        return 0
    summary = summarize(Path(args.run_dir))
    print(json.dumps(summary.to_json(), indent=2) if args.json else render(summary), end="\n" if args.json else "")
    return 0
