"""`xspec generate`: continue prompts with a trained language model (sampling, greedy or beam search)."""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from xspec.commands.arguments import float_at_least, int_at_least
from xspec.commands.translate import add_model_arguments, add_sampling_arguments, answer_lines, sampling_settings
from xspec.base.errors import UserError
from xspec.base.files import check_output_file, write_atomically
from xspec.base.text import printable

NAME = "generate"
COMPUTES = True
HELP = "continue prompts with a language model (stdin, --input or --prompt)"
DESCRIPTION = """\
Continues each prompt (one a line, from stdin or --input; or --prompt TEXT) with the latest checkpoint
of a language model's RUN (or the given checkpoint file), and writes one continuation a line, in input
order, each as soon as it is done (a single prompt token by token). An empty prompt starts a document.
Several runs or checkpoints with one vocabulary continue as an ensemble: each token is chosen from the
mean of the models' probabilities (see `xspec translate`), by beam search or sampling alike.

How tokens are chosen (the spec's `decode` section, which an import writes from the checkpoint's
generation_config.json; the flags override it): greedy (--no-sample or --beam 1), beam search
(--beam N), sampling (--sample, or any of --temperature, --top-k, --top-p), or beam sampling (those with
--beam N: each step's candidates drawn, as transformers' do_sample with num_beams); --repetition-penalty makes
tokens already seen less likely in each (as transformers' generate applies it). Each prompt draws from a
random stream of its own, seeded by --seed and its line number: the same seed gives the same text. An
imported checkpoint's prompts are encoded as its own tokenizer encodes a text (its BOS where it adds
one), and a continuation ends at any of its end-of-sequence ids. With --chat, each prompt is a user's
message (after --system's) in the checkpoint's chat template, rendered as transformers renders it, in
jinja2's immutable sandbox: a template that reads a file or reaches Python's internals is refused.

examples:
  xspec generate runs/lm --prompt "the cat" --max-new-tokens 30
  xspec generate runs/lm --sample --top-p 0.9 --temperature 0.8 --seed 7 < prompts.txt
  xspec generate runs/lm --beam 4 --input prompts.txt --output continuations.txt
  xspec generate runs/lm runs/lm-seed2 --prompt "the cat"              # an ensemble of two
  xspec generate runs/qwen3 --chat --system "Answer briefly." --prompt "What is a transformer?"
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, ensemble=True)
    parser.add_argument("--prompt", metavar="TEXT", help="continue this text (instead of lines of stdin / --input)")
    parser.add_argument("-i", "--input", metavar="FILE", help="prompts, one a line (default: stdin)")
    parser.add_argument("-o", "--output", metavar="FILE", help="where to write continuations (default: stdout)")
    parser.add_argument("--max-new-tokens", type=int_at_least(1), help="tokens to add at most")
    add_sampling_arguments(parser)
    parser.add_argument("--beam", type=int_at_least(1), help="beam size for beam search (1: greedy)")
    parser.add_argument("--alpha", type=float_at_least(0), help="beam search length penalty alpha")
    parser.add_argument("--repetition-penalty", type=float_at_least(1e-6), metavar="P",
                        help="divide the logits of tokens already in the prompt or continuation by P where "
                             "positive, multiply them where negative (transformers' repetition_penalty; 1: none)")
    parser.add_argument("--echo", action="store_true", help="write each prompt before its continuation")
    parser.add_argument("--chat", action="store_true",
                        help="each prompt is a user's message in the checkpoint's chat template (an import's "
                             "tokenizer_config.json chat_template or chat_template.jinja); the continuation is "
                             "the assistant's reply")
    parser.add_argument("--system", metavar="TEXT", help="with --chat: a system message before each prompt")
    parser.add_argument("--batch-tokens", type=int_at_least(1), default=4000,
                        help="prompt tokens per batch (default 4000)")
    parser.add_argument("--window", type=int_at_least(1), default=1000,
                        help="prompts read ahead and grouped by length (default 1000)")


def settings(args: argparse.Namespace) -> dict:
    """The decode section's values the flags give; the sampling flags imply --sample."""
    return {**sampling_settings(args), "beam": args.beam, "length_penalty": args.alpha,
            "max_new_tokens": args.max_new_tokens, "repetition_penalty": args.repetition_penalty}


def run(args: argparse.Namespace) -> int:
    from xspec.runtime.inference import load_ensemble

    if args.prompt is not None and args.input:
        raise UserError("--prompt or --input, not both")
    if args.output:
        check_output_file(Path(args.output), "--output")
    chosen = settings(args)
    if args.system is not None and not args.chat:
        raise UserError("--system is a chat's system message: give --chat with it")
    trained = load_ensemble([Path(m) for m in args.models], args.device, args.compile, args.weights)
    generator = trained.generator(args.batch_tokens, args.seed, chat=args.chat, system=args.system, **chosen)
    decode = trained.tokenizer.decode

    def warning(name: str, line: int):
        def warn(index: int, tokens: int) -> None:
            print(f"{name}:{line + index}: warning: a prompt of {tokens} tokens leaves no room in the model's "
                  f"{generator.max_tokens} positions: continued from its last {generator.max_tokens - 2}",
                  file=sys.stderr)
        return warn

    def continue_lines(window: list[str], first: int, name: str) -> Iterator[str]:
        line = first
        with _lines_named(name, first):
            for done in generator.stream(window, warning(name, first), first=first - 1):
                yield "".join(_format(window[line - first + i], decode(ids), args.echo)
                              for i, ids in enumerate(done))
                line += len(done)

    if args.prompt is None:
        answer_lines(args.input, args.output, args.window, continue_lines)
    elif args.output:
        write_atomically(Path(args.output), "".join(continue_lines([args.prompt], 1, "--prompt")))
    else:
        with _lines_named("--prompt", 1):
            _stream_tokens(generator, args.prompt, args.echo, warning("--prompt", 1))
    if generator.drafts.proposed:
        print(generator.drafts, file=sys.stderr)
    return 0


@contextmanager
def _lines_named(name: str, first: int) -> Iterator[None]:
    """A prompt the tokenizer cannot encode named by its file and line (`prompts.txt:12`), not its place in
    the window of lines read (runtime/tokenizer.py's TokenizingError)."""
    from xspec.runtime.tokenizer import TokenizingError

    try:
        yield
    except TokenizingError as error:
        raise error.at(f"{printable(name)}:{first + error.index}") from None


def _stream_tokens(generator, prompt: str, echo: bool, warn) -> None:
    """One prompt's continuation written to stdout as its tokens come (with beam search: when done)."""
    shown = ""
    if echo and prompt:
        sys.stdout.write(prompt + " ")

    def show(ids: list[int]) -> None:
        nonlocal shown
        text = generator.vocab.decode(ids)
        if text.startswith(shown):       # a new piece may change how the text before it reads: wait for it
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text

    for done in generator.stream([prompt], warn, on_tokens=show):
        final = generator.vocab.decode(done[0])
        sys.stdout.write((final[len(shown):] if final.startswith(shown) else "\n" + final) + "\n")
    sys.stdout.flush()


def _format(prompt: str, continuation: str, echo: bool) -> str:
    return (f"{prompt} {continuation}" if echo and prompt else continuation) + "\n"
