"""`xspec sweep DIR`: train every variant spec in DIR with one budget; write a Table-3-shaped report."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from xspec.commands.arguments import add_device_argument, add_set_argument, int_at_least, parse_overrides
from xspec.base.errors import UserError
from xspec.base.files import check_output_dir

# Kept here rather than imported from xspec.sweep: importing the command must stay cheap (xspec/cli.py).
DEFAULT_SEEDS = 3

NAME = "sweep"
COMPUTES = True
HELP = ("train a folder of variant specs with the same budget; write a Table 3 report with noise-band verdicts "
        "(Markdown, CSV, curves)")
DESCRIPTION = """\
Trains the base spec and every .xspec in DIR with the same step budget and the same overrides,
then writes REPORT/table3.md, REPORT/table3.csv and REPORT/curves.png (every run's training curves,
as `xspec plot` draws them). The table has the columns each variant changes, train steps,
dev perplexity, dev BLEU (beam search, no checkpoint averaging) and parameters, as in Table 3 of
the paper. Progress is printed per run. Runs live in OUT/runs/NAME; a finished run is not
retrained, an interrupted one resumes, so re-running the same command continues the sweep.

Effects are told from noise (Table 3, §6.2): the base model trains with --seeds N seeds (default 3;
the k-th in OUT/runs/base-seedK, with train.seed one more per seed), and its spread, mean ± 2 sample
standard deviations, is the noise band. Each row's difference from base's mean is "above noise" or
"within noise", and set beside the paper's direction of effect for that row: agrees, disagrees or
cannot tell. --seeds-all trains every row with N seeds (N times the cost).

A table from models that did not learn is no result: a run learned when its dev perplexity is at
most the square root of the dev targets' unigram perplexity (half the cross entropy) and its dev
BLEU at least 5. Rows that did not learn are marked so and not judged. When a base run did not
learn, the variants are not trained (--keep-going trains them anyway: their rows are then marked),
the report says so at the top and has no verdicts, and the command exits with status 1 after
writing it.

--width-divisor K trains every model at 1/K of its widths (d_model, d_ff, d_k, d_v), keeping each
row's ratios to the base model, for budgets far below the paper's (a CPU).

--data demo is the built-in artificial task; --data FOLDER reads FOLDER/train.SRC, train.TGT and
val.SRC, val.TGT (or valid.* / dev.*), SRC and TGT from --src-lang / --tgt-lang.

examples:
  bench/table3.sh          # Multi30k at half width, a scale at which the models learn (resumable)
  xspec sweep specs/table3/ --steps 100000 --data wmt14-en-de/ --src-lang en --tgt-lang de
  # a quick look at the pipeline end to end; these models do not learn (exit status 1)
  xspec sweep specs/table3/ --steps 150 --data ../shared/data/multi30k-en-de --dev-lines 200 \\
      --width-divisor 4 --seeds 2 --keep-going --set vocab=2000 --set train.warmup_steps=100 \\
      --output runs/table3-quick --report runs/table3-quick/report
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
    parser.add_argument("--seeds", type=int_at_least(1), default=DEFAULT_SEEDS, metavar="N",
                        help=f"seeds of the base model; their spread is the noise band (default: {DEFAULT_SEEDS})")
    parser.add_argument("--seeds-all", action="store_true",
                        help="train every row with --seeds seeds, not only base (N times the cost)")
    parser.add_argument("--keep-going", action="store_true",
                        help="train the variants even after a base run that did not learn (default: stop there, "
                             "since nothing could be compared with base)")
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
    parts += ["--seeds", str(args.seeds)] + (["--seeds-all"] if args.seeds_all else [])
    parts += ["--keep-going"] if args.keep_going else []
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
    from xspec.sweep.rows import SweepConfig
    from xspec.sweep.runner import find_variants, run_sweep
    from xspec.sweep.verdicts import base_problem

    check_output_dir(Path(args.output), "--output")
    check_output_dir(Path(args.report), "--report")
    variants_dir = Path(args.variants)
    base = Path(args.base) if args.base else variants_dir.resolve().parent / "base.xspec"
    config = SweepConfig(
        variants=find_variants(variants_dir, base), steps=args.steps, overrides=parse_overrides(args.overrides),
        width_divisor=args.width_divisor, data=args.data, src_lang=args.src_lang, tgt_lang=args.tgt_lang,
        dev_lines=args.dev_lines, out_dir=Path(args.output), report_dir=Path(args.report),
        command=command_line(args), device=str(pick_device(args.device)), threads=args.threads, progress=args.progress,
        seeds=args.seeds, seeds_all=args.seeds_all, keep_going=args.keep_going)
    rows = run_sweep(config)
    report = config.report_dir / "table3.md"
    print(f"report: {report}, {config.report_dir / 'table3.csv'}, {config.report_dir / 'curves.png'} "
          f"({len(rows)} models)")
    problem = base_problem(rows)
    if problem is not None:
        # After the report: a script running the sweep must notice that its table is no result.
        raise UserError(f"{problem}; {report} marks it and has no verdicts: train longer (--steps) or wider "
                        "(a smaller --width-divisor)")
    return 0
