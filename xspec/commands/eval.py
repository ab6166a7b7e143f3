"""`xspec eval`: translate a test set and score it with sacreBLEU (BLEU and chrF, with signatures)."""

from __future__ import annotations

import argparse
from pathlib import Path

from xspec.commands.translate import add_decode_arguments, decode_overrides
from xspec.errors import UserError
from xspec.files import check_output_file, write_atomically

NAME = "eval"
HELP = "translate --src and score it against --ref (sacreBLEU BLEU and chrF)"
DESCRIPTION = """\
Translates the source file with beam search and prints sacreBLEU's chrF and BLEU lines, each with
its signature (BLEU last).

example:
  xspec eval runs/tiny --src test.en --ref test.de
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_decode_arguments(parser)
    parser.add_argument("--src", required=True, metavar="FILE", help="source text, one sentence a line")
    parser.add_argument("--ref", required=True, metavar="FILE", help="reference translations, aligned with --src")
    parser.add_argument("--output", "-o", metavar="FILE", help="also write the translations here")


def run(args: argparse.Namespace) -> int:
    from xspec.runtime.corpus import read_lines
    from xspec.runtime.distributed import pick_device
    from xspec.runtime.evaluate import score
    from xspec.runtime.inference import load_translator

    if args.output:
        check_output_file(Path(args.output), "--output")
    sources, references = read_lines(Path(args.src)), read_lines(Path(args.ref))
    if len(sources) != len(references):
        raise UserError(f"{args.src} has {len(sources)} lines but {args.ref} has {len(references)}")
    translator = load_translator(Path(args.model), pick_device(args.device), decode_overrides(args), args.compile)
    hypotheses = translator.with_batch_tokens(args.batch_tokens).translate(sources, progress=True)
    if args.output:
        write_atomically(Path(args.output), "".join(h + "\n" for h in hypotheses))
    scores = score(hypotheses, references)
    print(scores.chrf_line)
    print(scores.bleu_line)
    return 0
