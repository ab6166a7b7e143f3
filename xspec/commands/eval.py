"""`xspec eval`: score a trained model on held-out text: a translation model with sacreBLEU (BLEU and
chrF, with signatures), a language model by perplexity."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xspec.commands.translate import add_decode_arguments, add_target_language_argument, decode_overrides
from xspec.base.errors import UserError
from xspec.base.files import check_output_file, write_atomically
from xspec.base.text import shown

NAME = "eval"
COMPUTES = True
HELP = "score a model: translate --src against --ref (BLEU, chrF), or a language model's --text (perplexity)"
DESCRIPTION = """\
A translation model: translates --src with beam search and prints sacreBLEU's chrF and BLEU lines,
each with its signature (BLEU last).

A language model: --text FILE, one document a line (empty lines skipped); prints the perplexity, the
cross entropy in bits per token and in bits per byte (of the UTF-8 text, a newline per line: comparable
across vocabularies), and the token count. A line longer than the model's positions is scored in
windows, each without the earlier ones as context.

Several runs or checkpoints with one vocabulary are scored as an ensemble (see `xspec translate`):
translation models by BLEU of the ensemble's translations; language models by the perplexity of the
mixture ensemble decoding takes: each token's probability is the mean of the models' probabilities.

examples:
  xspec eval runs/tiny --src test.en --ref test.de
  xspec eval runs/tiny runs/tiny-seed2 --src test.en --ref test.de     # an ensemble of two
  xspec eval runs/lm --text test.txt
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_decode_arguments(parser)
    parser.add_argument("--src", metavar="FILE", help="source text, one sentence a line (translation)")
    parser.add_argument("--ref", metavar="FILE", help="reference translations, aligned with --src")
    add_target_language_argument(parser)
    parser.add_argument("--text", metavar="FILE", help="text to score, one document a line (language model)")
    parser.add_argument("-o", "--output", metavar="FILE", help="also write the translations here")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="a progress bar while translating, when stderr is a terminal (default: on)")


def run(args: argparse.Namespace) -> int:
    from xspec.runtime.inference import load_ensemble

    if args.text is not None and (args.src or args.ref or args.output):
        raise UserError("--text scores a language model's text; --src, --ref and --output are for translation")
    if args.text is None and not (args.src and args.ref):
        raise UserError("which text? --src FILE --ref FILE for a translation model, --text FILE for a "
                        "language model")
    if args.output:
        check_output_file(Path(args.output), "--output")
    trained = load_ensemble([Path(m) for m in args.models], args.device, args.compile, args.weights)
    name = " + ".join(args.models)
    if args.text is not None:
        return _perplexity(trained, name, Path(args.text), args.batch_tokens)
    if trained.is_language_model:
        raise UserError(f"{name}: a language model; score its text with --text FILE")
    return _bleu(trained, args)


def _bleu(trained, args: argparse.Namespace) -> int:
    from xspec.runtime.corpus import read_lines
    from xspec.runtime.evaluate import score

    sources, references = read_lines(Path(args.src)), read_lines(Path(args.ref))
    if len(sources) != len(references):
        raise UserError(f"{args.src} has {len(sources)} lines but {args.ref} has {len(references)}")
    translator = trained.translator(args.batch_tokens, args.tgt_lang, **decode_overrides(args))
    hypotheses = translator.translate(sources, progress=args.progress and sys.stderr.isatty())
    if args.output:
        write_atomically(Path(args.output), "".join(h + "\n" for h in hypotheses))
    scores = score(hypotheses, references)
    print(scores.chrf_line)
    print(scores.bleu_line)
    return 0


def _perplexity(trained, name: str, path: Path, batch_tokens: int) -> int:
    from xspec.runtime.documents import lines_named, read_documents

    if not trained.is_language_model:
        raise UserError(f"{name}: a translation model; score it with --src FILE --ref FILE")
    documents = read_documents(path)
    with lines_named(documents):
        scores = trained.score_lines(documents.lines, batch_tokens)
    print(f"{shown(path)}: perplexity {scores.perplexity:.3f}, {scores.bits_per_token:.4f} bits per token, "
          f"{scores.bits_per_byte:.4f} bits per byte ({len(documents.lines):,} lines, "
          f"{sum(scores.tokens):,} tokens)")
    return 0
