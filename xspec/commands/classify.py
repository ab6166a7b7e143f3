"""`xspec classify`: the class of each text, by a trained classifier."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterator

from xspec.commands.arguments import int_at_least
from xspec.commands.translate import add_model_arguments, add_text_arguments, answer_texts, check_text_arguments
from xspec.base.errors import UserError
from xspec.base.text import printable, shown

NAME = "classify"
COMPUTES = True
HELP = "the class of each text (stdin, --input or --text) by a classifier"
DESCRIPTION = """\
Writes the most likely class of each text (one a line, from stdin or --input; or --text TEXT) by a
classifier's RUN: an encoder alone whose head scores the classes its training labels named (`xspec train
SPEC --set num_labels=N --train F --train-labels L`, or --init from an imported BERT), read at each text's
first position. --scores adds each class's probability, in the order of the classes' names.

Sentence pairs (a premise and its hypothesis, two questions): --text A --text-pair B classifies one pair;
--input-pair FILE gives the second text of each line's pair, the line of the same number (a line of one
without its line in the other is refused). A pair is framed as the tokenizer frames two texts (BERT's
[CLS] a [SEP] b [SEP], with token types 0, then 1), as transformers' text-classification pipeline reads
{"text": A, "text_pair": B}. A text (or pair) longer than the model's positions is classified by its start
(a pair's longer text cut), with a warning naming its line on stderr.

examples:
  xspec classify runs/sentiment --text "a fine film"
  xspec classify runs/sentiment --scores < reviews.txt > classes.tsv
  xspec classify runs/mnli --text "A man sleeps." --text-pair "Nobody is awake."
  xspec classify runs/mnli -i premises.txt --input-pair hypotheses.txt
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_text_arguments(parser, "classify", "classes")
    parser.add_argument("--text-pair", metavar="TEXT", help="with --text: the second text of its pair")
    parser.add_argument("--input-pair", metavar="FILE",
                        help="the second text of each pair, one a line, aligned with the lines of --input (or stdin)")
    parser.add_argument("--scores", action="store_true", help="each class's probability after the class")
    parser.add_argument("--window", type=int_at_least(1), default=256, help="texts classified together (default 256)")


def run(args: argparse.Namespace) -> int:
    from xspec.runtime.inference import load
    from xspec.runtime.tasks.classification import class_probabilities

    check_text_arguments(args)
    if args.text_pair is not None and args.text is None:
        raise UserError("--text-pair gives the second text of --text's pair: give --text too")
    if args.input_pair is not None and args.text is not None:
        raise UserError("--input-pair gives the second texts of the lines of --input or stdin; --text's pair takes "
                        "--text-pair")
    seconds = SecondTexts(Path(args.input_pair), Path(args.input) if args.input else None) \
        if args.input_pair is not None else None
    trained = load(Path(args.model), args.device, args.compile, args.weights)
    if trained.classes is None:
        raise UserError(f"{args.model}: not a classifier (an encoder alone whose head scores num_labels classes)")
    names = list(trained.spec.params.get("labels") or [f"LABEL_{i}" for i in range(trained.classes)])

    def answer(lines: list[str], first: int, name: str) -> Iterator[str]:
        pairs = [args.text_pair] if args.text_pair is not None else \
            seconds.of(lines, first, name) if seconds is not None else None

        def warn(index: int, tokens: int) -> None:
            cut = "its longer text cut" if pairs is not None else "classified from its start"
            print(f"{shown(name)}:{first + index}: warning: {tokens} tokens framed, more than the model's "
                  f"{trained.max_tokens} positions: {cut}", file=sys.stderr)

        for probabilities in class_probabilities(trained, lines, pairs, warn):
            best = max(range(len(names)), key=lambda c: probabilities[c])
            scores = "".join(f"\t{p:.4f}" for p in probabilities) if args.scores else ""
            yield f"{printable(names[best])}{scores}\n"

    answer_texts(args, answer)
    if seconds is not None:
        seconds.check_all_read(args.input or "<stdin>")
    return 0


class SecondTexts:
    """The second texts of pairs whose first texts are read a window of lines at a time (--input-pair FILE):
    each window's, by line number; a line of either file without its line in the other is refused, before
    any is classified where the first texts are a file (`firsts`), else once stdin reaches it."""

    def __init__(self, path: Path, firsts: Path | None) -> None:
        from xspec.runtime.corpus import read_lines
        from xspec.runtime.tasks.classification import read_pairs

        self.path, self.read = path, 0
        self.lines = read_pairs(path, read_lines(firsts), firsts) if firsts is not None else read_lines(path)

    def of(self, lines: list[str], first: int, name: str) -> list[str]:
        """The second texts of `lines`, the lines of `name` from line `first` on."""
        from xspec.runtime.tasks.classification import misaligned

        seconds = self.lines[first - 1:first - 1 + len(lines)]
        if len(seconds) < len(lines):
            raise misaligned(name, self.path, len(self.lines))
        self.read = first - 1 + len(lines)
        return seconds

    def check_all_read(self, name: str) -> None:
        """Refuses second texts past the last first text (`name`'s last line)."""
        from xspec.runtime.tasks.classification import misaligned

        if self.read < len(self.lines):
            raise misaligned(self.path, name, self.read)
