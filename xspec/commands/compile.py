"""`xspec compile SPEC`: validate a spec, report its parameters and shapes, write the model."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import xspec
from xspec.commands.arguments import add_set_argument, parse_overrides
from xspec.base.files import check_output_dir, check_output_file, write_atomically
from xspec.summary import render_table
from xspec.base.text import shown

NAME = "compile"
HELP = "parse, validate and lower a spec; report parameters and shapes; write the model"
DESCRIPTION = """\
Parse, resolve, build the graph, validate and lower SPEC to a PyTorch module.

Prints a summary (parameters per block and in total, output shapes), and writes
OUTDIR/model.py (the generated module, which imports torch and the op library,
xspec.nn; with --standalone, it copies the library classes it uses and depends on
torch alone), OUTDIR/graph.json (the op graph) and OUTDIR/spec.xspec (the resolved
spec, imports inlined).

examples:
  xspec compile specs/base.xspec
  xspec compile specs/base.xspec --set heads=16 --set train.warmup_steps=8000
  xspec compile specs/big.xspec --emit python > big_model.py
  xspec compile specs/modern/llama.xspec --emit python --standalone > llama.py
  xspec compile specs/tiny.xspec --json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="the .xspec file")
    add_set_argument(parser)
    parser.add_argument("-o", "--output", "--out", metavar="OUTDIR", dest="output",
                        help="where to write model.py, graph.json and spec.xspec (default: out/<spec name>)")
    parser.add_argument("--emit", choices=("summary", "python", "graph"), default="summary",
                        help="what to print: the summary (default), the generated Python, or the graph as JSON")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--standalone", action="store_true",
                        help="write (and print) a model.py that copies the op library's classes it uses "
                             "instead of importing them from xspec.nn: it depends on torch alone")


# What `xspec compile` writes into its output folder.
FILES = ("model.py", "graph.json", "spec.xspec")


def run(args: argparse.Namespace) -> int:
    spec = xspec.compile(args.spec, overrides=parse_overrides(args.overrides))
    out = Path(args.output) if args.output else Path("out") / Path(args.spec).stem
    check_output_dir(out, "--output")
    for name in FILES:  # every file writable before any is written: never a partial set
        check_output_file(out / name, "--output")
    python = spec.standalone_source if args.standalone else spec.python_source
    written = [write_atomically(out / name, text)
               for name, text in zip(FILES, (python, spec.graph_json(), spec.resolved_source))]
    if spec.warnings:
        print(spec.warnings, file=sys.stderr)
    summary = spec.summary()
    if args.json:
        summary["written"] = [str(p) for p in written]
        print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=2))
    elif args.emit == "python":
        print(python, end="")
    elif args.emit == "graph":
        print(spec.graph_json())
    else:
        print(f"{spec.name} ({shown(spec.path)}): valid")
        print()
        print(render_table(summary))
        print()
        print("inputs:  " + ", ".join(f"{k} {v}" for k, v in summary["inputs"].items()))
        print("outputs: " + ", ".join(f"{k} {v}" for k, v in summary["outputs"].items()))
        print("wrote:   " + ", ".join(str(p) for p in written))
    return 0
