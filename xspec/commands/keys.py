"""`xspec keys`: every key of a spec's train, data and decode sections, with its type, default and meaning."""

from __future__ import annotations

import argparse

from xspec.base.errors import UserError

NAME = "keys"
HELP = "list the keys of the train, data and decode sections (type, default, meaning)"
DESCRIPTION = """\
Lists every key a spec's `train`, `data` and `decode` sections take, with its type, its default (the
paper's recipe) and its meaning. Any of them is set in the spec or on the command line:
`--set train.warmup_steps=400`.

examples:
  xspec keys
  xspec keys train
  xspec keys --markdown > docs/keys.md
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("section", nargs="?", choices=("train", "data", "decode"), help="only this section")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table (docs/keys.md)")


def run(args: argparse.Namespace) -> int:
    from xspec.keys import render_markdown, render_text, section_keys

    keys = [k for k in section_keys() if args.section is None or k.name.startswith(args.section + ".")]
    if not keys:
        raise UserError(f"no keys in section {args.section}")
    print(render_markdown(keys) if args.markdown else render_text(keys), end="")
    return 0
