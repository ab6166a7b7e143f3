"""`xspec sweep DIR`: train every variant spec in DIR with one budget; write a Table-3-shaped report."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from xspec.commands.arguments import add_device_argument, add_set_argument, int_at_least, parse_overrides
from xspec.files import check_output_dir

NAME = "sweep"
COMPUTES = True
HELP = "train a folder of variant specs with the same budget; write a Table 3 report (Markdown, CSV, curves)"
DESCRIPTION = """\
Trains the base spec and every .xspec in DIR with the same step budget and the same overrides,
then writes REPORT/table3.md, REPORT/table3.csv and REPORT/curves.png (every run's training curves,
as `xspec plot` draws them). The table has the columns each variant changes, train steps,
dev perplexity, dev BLEU (beam search, no checkpoint averaging) and parameters, as in Table 3 of
the paper. Progress is printed per run. Runs live in OUT/runs/NAME; a finished run is not
retrained, an interrupted one resumes, so re-running the same command continues the sweep.

--width-divisor K trains every model at 1/K of its widths (d_model, d_ff, d_k, d_v), keeping each
row's ratios to the base model, for budgets far below the paper's (a CPU).

--data demo is the built-in artificial task; --data FOLDER reads FOLDER/train.SRC, train.TGT and
val.SRC, val.TGT (or valid.* / dev.*), SRC and TGT from --src-lang / --tgt-lang.

examples:
  xspec sweep specs/table3/ --steps 100000 --data wmt14-en-de/ --src-lang en --tgt-lang de
  xspec sweep specs/table3/ --steps 150 --data ../shared/data/multi30k-en-de --dev-lines 200 \\
      --width-divisor 4 --set vocab=2000 --set train.warmup_steps=100 --output runs/table3
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("variants", metavar="DIR", help="a folder of variant .xspec files (e.g. specs/table3/)")
    parser.add_argument("--base", metavar="SPEC",
                        help="the model the variants change (default: DIR/../base.xspec)")
    parser.add_argument("--steps", type=int_at_least(1), required=True, help="training steps for every model")
    parser.add_argument("--data", required=True, metavar="demo|FOLDER", help="the corpus (see above)")
    parser.add_argument("--src-lang", default="en", help="source file suffix in --data FOLDER (default: en)")
    parser.add_argument("--tgt-lang", default="de", help="target file suffix in --data FOLDER (default: de)")
    parser.add_argument("--dev-lines", type=int_at_least(1), metavar="N",
                        help="use only the first N dev sentences for perplexity and BLEU")
    parser.add_argument("--width-divisor", type=int_at_least(1), default=1, metavar="K",
                        help="train every model at 1/K of its widths (default: 1, the spec's own size)")
    add_set_argument(parser, " in every model")
    parser.add_argument("-o", "--output", "--out", metavar="DIR", default="runs/table3", dest="output",
                        help="the sweep's run directories (default: runs/table3)")
    parser.add_argument("--report", metavar="DIR", default="docs/table3",
                        help="where table3.md, table3.csv and curves.png go (default: docs/table3)")
    add_device_argument(parser)
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=False,
                        help="each run's progress bar, when stderr is a terminal (default: off)")


def command_line(args: argparse.Namespace) -> str:
    """The canonical command for this sweep, written at the top of the report."""
    parts = ["xspec", "sweep", args.variants]
    if args.base:
        parts += ["--base", args.base]
    parts += ["--steps", str(args.steps), "--data", args.data]
    if args.data != "demo":
        parts += ["--src-lang", args.src_lang, "--tgt-lang", args.tgt_lang]
    if args.dev_lines is not None:
        parts += ["--dev-lines", str(args.dev_lines)]
    if args.width_divisor != 1:
        parts += ["--width-divisor", str(args.width_divisor)]
    for item in args.overrides:
        parts += ["--set", item]
    parts += ["--output", args.output, "--report", args.report]
    if args.device is not None:
        parts += ["--device", args.device]
    if args.threads is not None:
        parts += ["--threads", str(args.threads)]
    return shlex.join(parts)


def run(args: argparse.Namespace) -> int:
    from xspec.runtime.distributed import pick_device
    from xspec.sweep import SweepConfig, find_variants, run_sweep

    check_output_dir(Path(args.output), "--output")
    check_output_dir(Path(args.report), "--report")
    variants_dir = Path(args.variants)
    base = Path(args.base) if args.base else variants_dir.resolve().parent / "base.xspec"
    config = SweepConfig(
        variants=find_variants(variants_dir, base), steps=args.steps, overrides=parse_overrides(args.overrides),
        width_divisor=args.width_divisor, data=args.data, src_lang=args.src_lang, tgt_lang=args.tgt_lang,
        dev_lines=args.dev_lines, out_dir=Path(args.output), report_dir=Path(args.report),
        command=command_line(args), device=str(pick_device(args.device)), threads=args.threads, progress=args.progress)
    rows = run_sweep(config)
    print(f"report: {config.report_dir / 'table3.md'}, {config.report_dir / 'table3.csv'}, "
          f"{config.report_dir / 'curves.png'} ({len(rows)} models)")
    return 0
