"""`xspec translate`: translate text with a trained run or checkpoint (beam search, §6.1)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Callable, Iterator

from xspec.commands.arguments import add_device_argument, float_at_least, int_at_least
from xspec.base.errors import UserError, processing
from xspec.base.files import check_output_file, write_atomically
from xspec.base.text import shown

NAME = "translate"
COMPUTES = True
HELP = "translate text, one sentence a line (stdin or --input), with beam search"
DESCRIPTION = """\
Translates one sentence per line with the latest checkpoint of RUN (or the given checkpoint file,
e.g. an average written by `xspec average`). Beam search as in the paper: beam 4, length penalty
0.6, output up to input length + 50 tokens (the spec's `decode` section; the flags override it).
Translations stream: each is written (in input order) as soon as it and the lines before it are
done, so `xspec translate RUN` answers lines as they are typed, and works inside pipes.

--sample (or any of --temperature, --top-k, --top-p, --min-p) draws each translation's tokens instead,
as transformers' generate does with do_sample (an import whose generation_config.json samples does so by
default); with --beam N, beam sampling. Each line draws from a random stream of its own, seeded by
--seed and its line number (sampled back-translations: the same seed, the same text).

Several runs or checkpoints translate as an ensemble: at each step of the search, a token's
probability is the mean of the models' probabilities (a mixture, as fairseq's ensembles take it).
They must share one vocabulary (the same sentencepiece model); their architectures may differ. The
decode settings are the first run's, and the output length is capped by the smallest model's positions.

examples:
  xspec translate runs/tiny < input.en > output.de
  xspec translate runs/tiny/averaged.safetensors --input input.en --beam 1
  xspec translate runs/tiny --nbest 4 < input.en      # "LINE ||| translation ||| score" lines
  xspec translate runs/tiny --sample --top-k 10 --seed 3 < mono.de > back.en   # sampled back-translation
  xspec translate runs/tiny runs/tiny-seed2 < input.en > output.de   # an ensemble of two
  xspec translate runs/opus-mt-en-ROMANCE --tgt-lang fr < input.en   # a multilingual import's target
"""


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    """The model (one, or several as an ensemble: `args.models`) and the beam search's flags."""
    add_model_arguments(parser, ensemble=True)
    parser.add_argument("--beam", type=int_at_least(1), help="beam size (1: greedy)")
    parser.add_argument("--alpha", type=float_at_least(0),
                        help="length penalty alpha: lp(Y) = ((5 + |Y|) / 6)^alpha, or an import's |Y|^alpha")
    parser.add_argument("--max-len-b", type=int_at_least(0), help="output length limit: input length + this")
    parser.add_argument("--batch-tokens", type=int_at_least(1), default=4000,
                        help="source tokens per decoding batch (default 4000)")


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """--sample and what shapes it (translate's and generate's): with --beam, beam sampling."""
    parser.add_argument("--sample", action=argparse.BooleanOptionalAction, default=None,
                        help="sample tokens (with --beam, beam sampling; --no-sample: greedy, or beam search "
                             "with --beam)")
    parser.add_argument("--temperature", type=float_at_least(1e-6), help="divide the logits by this (sampling)")
    parser.add_argument("--top-k", type=int_at_least(1), help="sample among the K most likely tokens")
    parser.add_argument("--top-p", type=float_at_least(1e-6, 1.0),
                        help="sample among the most likely tokens whose probability reaches P (nucleus)")
    parser.add_argument("--min-p", type=float_at_least(0.0, 1.0), metavar="P",
                        help="sample among the tokens at least P times as likely as the most likely (min-p)")
    parser.add_argument("--seed", type=int_at_least(0), default=0, help="random seed for sampling (default 0)")


def sampling_settings(args: argparse.Namespace) -> dict:
    """The sampling flags' decode settings; any of them implies --sample. How --sample and --beam combine
    with the spec's is runtime/sampling.py's sampling_choice, as in Python."""
    shaping = (args.temperature, args.top_k, args.top_p, args.min_p)
    if args.sample is False and any(v is not None for v in shaping):
        raise UserError("--no-sample with --temperature, --top-k, --top-p or --min-p: those shape sampling")
    sample = args.sample if args.sample is not None else (True if any(v is not None for v in shaping) else None)
    return {"sample": sample, "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
            "min_p": args.min_p}


def add_target_language_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tgt-lang", metavar="CODE",
                        help="the target language of a multilingual model, by its tokenizer's code: Marian's "
                             ">>CODE<< before each line, or the output's first token (mBART-50's fr_XX, "
                             "M2M100's __fr__, NLLB's fra_Latn)")
    parser.add_argument("--src-lang", metavar="CODE",
                        help="the source language of a multilingual model whose tokenizer frames each source with "
                             "a language code (NLLB's deu_Latn, mBART's de_DE), in place of the one it was saved "
                             "with")


def add_model_arguments(parser: argparse.ArgumentParser, ensemble: bool = False) -> None:
    """RUN_OR_CHECKPOINT, --device, --compile and --weights: what every command that loads a trained model takes.
    `ensemble`: one or more (`args.models`, a list) instead of one (`args.model`)."""
    if ensemble:
        parser.add_argument("models", metavar="RUN_OR_CHECKPOINT", nargs="+",
                            help="a run directory or a checkpoint file; several decode as an ensemble")
    else:
        parser.add_argument("model", metavar="RUN_OR_CHECKPOINT", help="a run directory or a checkpoint file")
    add_device_argument(parser)
    parser.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                        help="torch.compile the decoder step (auto: on for CUDA, off on CPU)")
    parser.add_argument("--weights", choices=("auto", "fp32", "bf16", "int8"),
                        help="keep the linear layers' weights as trained (auto, fp32), in bf16 or in int8 (one "
                             "scale per output channel): fewer bytes per decoded token (default: decode.weights)")


def decode_overrides(args: argparse.Namespace, nbest: int | None = None) -> dict:
    return {"beam": args.beam, "length_penalty": args.alpha, "max_len_b": args.max_len_b, "nbest": nbest}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_decode_arguments(parser)
    add_sampling_arguments(parser)
    parser.add_argument("-i", "--input", metavar="FILE", help="source text (default: stdin)")
    parser.add_argument("-o", "--output", metavar="FILE", help="where to write translations (default: stdout)")
    parser.add_argument("--nbest", type=int_at_least(1),
                        help="write the N best translations of each line, with scores")
    parser.add_argument("--window", type=int_at_least(1), default=1000,
                        help="lines read ahead and sorted by length for batching (default 1000); a line "
                             "typed alone is translated at once")
    add_target_language_argument(parser)


def run(args: argparse.Namespace) -> int:
    from xspec.runtime.inference import load_ensemble

    if args.output:
        check_output_file(Path(args.output), "--output")
    # Load the model first: a missing run is reported before waiting on standard input.
    trained = load_ensemble([Path(m) for m in args.models], args.device, args.compile, args.weights)
    translator = trained.translator(args.batch_tokens, args.tgt_lang, args.src_lang, args.seed,
                                    **decode_overrides(args, args.nbest), **sampling_settings(args))

    def translate(window: list[str], first: int, name: str) -> Iterator[str]:
        def warn(index: int, tokens: int) -> None:
            print(f"{shown(name)}:{first + index}: warning: {tokens} tokens, more than the model's "
                  f"{translator.max_tokens} positions: translated from its first {translator.max_tokens - 1}",
                  file=sys.stderr)

        line = first
        for done in translator.stream(window, warn, first=first - 1):
            yield "".join(_format(hyps, line + i, translator, args.nbest) for i, hyps in enumerate(done))
            line += len(done)

    answer_lines(args.input, args.output, args.window, translate)
    return 0


def answer_lines(input_file: str | None, output: str | None, window: int,
                 answer: Callable[[list[str], int, str], Iterator[str]]) -> None:
    """Reads lines from `input_file` (default: stdin) in windows of `window` lines, or fewer when no more
    have arrived yet; `answer(lines, line number of the first, file name)` yields text to write as soon
    as it is ready: to stdout, flushed, or to `output` (written atomically at the end)."""
    from xspec.base.files import open_regular_file
    from xspec.runtime.line_stream import LineStream

    name = input_file or "<stdin>"
    written: list[str] = []
    first = 1  # the line number of the window's first line
    opened = open_regular_file(Path(input_file)) if input_file else contextlib.nullcontext(sys.stdin.buffer)
    with opened as source:
        lines = LineStream(source, name)
        while lines_read := lines.take(window):
            last = first + len(lines_read) - 1
            with processing(f"{name}:{first}" if last == first else f"{name}:{first}-{last}"):
                for out in answer(lines_read, first, name):
                    if output:
                        written.append(out)
                    else:
                        sys.stdout.write(out)
                        sys.stdout.flush()
            first += len(lines_read)
    if output:
        write_atomically(Path(output), "".join(written))


def add_text_arguments(parser: argparse.ArgumentParser, doing: str, written: str) -> None:
    """--text TEXT, or lines of --input (default: stdin); --output: what a command that answers each text
    line by line takes (`doing` to the text, `written` the answers)."""
    parser.add_argument("--text", metavar="TEXT", help=f"{doing} this text (instead of lines of stdin / --input)")
    parser.add_argument("-i", "--input", metavar="FILE", help="texts, one a line (default: stdin)")
    parser.add_argument("-o", "--output", metavar="FILE", help=f"where to write the {written} (default: stdout)")


def check_text_arguments(args: argparse.Namespace) -> None:
    if args.text is not None and args.input:
        raise UserError("--text or --input, not both")
    if args.output:
        check_output_file(Path(args.output), "--output")


def answer_texts(args: argparse.Namespace, answer: Callable[[list[str], int, str], Iterator[str]]) -> None:
    """`answer` (as answer_lines takes it) for --text's one text, or for the lines of --input or stdin."""
    if args.text is None:
        answer_lines(args.input, args.output, args.window, answer)
        return
    text = "".join(answer([args.text], 1, "--text"))
    if args.output:
        write_atomically(Path(args.output), text)
    else:
        print(text, end="")


def _format(hyps, line: int, translator, nbest: int | None) -> str:
    """A line's translation; with --nbest, a `INDEX ||| translation ||| score` line per hypothesis
    (INDEX counts lines from 0)."""
    if not nbest:
        return (translator.vocab.decode(hyps[0].tokens) if hyps else "") + "\n"
    return "".join(f"{line - 1} ||| {translator.vocab.decode(h.tokens)} ||| {h.score:.4f}\n" for h in hyps)
