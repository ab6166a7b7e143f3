"""`xspec translate`: translate text with a trained run or checkpoint (beam search, §6.1)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xspec.commands.arguments import float_at_least, int_at_least
from xspec.errors import UserError
from xspec.files import check_output_file, write_atomically

NAME = "translate"
HELP = "translate text, one sentence a line (stdin or --input), with beam search"
DESCRIPTION = """\
Translates one sentence per line with the latest checkpoint of RUN (or the given checkpoint file,
e.g. an average written by `xspec average`). Beam search as in the paper: beam 4, length penalty
0.6, output up to input length + 50 tokens (the spec's `decode` section; the flags override it).

examples:
  xspec translate runs/tiny < input.en > output.de
  xspec translate runs/tiny/averaged.safetensors --input input.en --beam 1
  xspec translate runs/tiny --nbest 4 < input.en      # "LINE ||| translation ||| score" lines
"""


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="RUN_OR_CHECKPOINT", help="a run directory or a checkpoint file")
    parser.add_argument("--beam", type=int_at_least(1), help="beam size (1: greedy)")
    parser.add_argument("--alpha", type=float_at_least(0), help="length penalty alpha, lp(Y) = ((5 + |Y|) / 6)^alpha")
    parser.add_argument("--max-len-b", type=int_at_least(0), help="output length limit: input length + this")
    parser.add_argument("--batch-tokens", type=int_at_least(1), default=4000,
                        help="source tokens per decoding batch (default 4000)")
    parser.add_argument("--device", help="cpu, cuda, ... (default: CUDA when available)")


def decode_overrides(args: argparse.Namespace, nbest: int | None = None) -> dict:
    chosen = {"beam": args.beam, "length_penalty": args.alpha, "max_len_b": args.max_len_b, "nbest": nbest}
    return {k: v for k, v in chosen.items() if v is not None}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_decode_arguments(parser)
    parser.add_argument("--input", "-i", metavar="FILE", help="source text (default: stdin)")
    parser.add_argument("--output", "-o", metavar="FILE", help="where to write translations (default: stdout)")
    parser.add_argument("--nbest", type=int_at_least(1),
                        help="write the N best translations of each line, with scores")


def _read_stdin() -> list[str]:
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise UserError(f"<stdin>:{line}: invalid UTF-8") from None
    return text.removesuffix("\n").split("\n") if text else []


def run(args: argparse.Namespace) -> int:
    from xspec.runtime.corpus import read_lines
    from xspec.runtime.distributed import pick_device
    from xspec.runtime.inference import load_translator

    if args.output:
        check_output_file(Path(args.output), "--output")
    # Load the model first: a missing run is reported before waiting on standard input.
    translator = load_translator(Path(args.model), pick_device(args.device), decode_overrides(args, args.nbest))
    lines = read_lines(Path(args.input)) if args.input else _read_stdin()
    translator = translator.with_batch_tokens(args.batch_tokens)
    if args.nbest:
        results = translator.nbest(lines)
        out = "".join(f"{i} ||| {translator.vocab.decode(h.tokens)} ||| {h.score:.4f}\n"
                      for i, hyps in enumerate(results) for h in hyps)
    else:
        out = "".join(t + "\n" for t in translator.translate(lines))
    if args.output:
        write_atomically(Path(args.output), out)
    else:
        sys.stdout.write(out)
    return 0
