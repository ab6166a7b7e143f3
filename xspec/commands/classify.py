"""`xspec classify`: the class of each text, by a trained classifier."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Iterator

from xspec.commands.arguments import int_at_least
from xspec.commands.translate import add_model_arguments, add_text_arguments, answer_texts, check_text_arguments
from xspec.base.errors import UserError
from xspec.base.text import printable

NAME = "classify"
COMPUTES = True
HELP = "the class of each text (stdin, --input or --text) by a classifier"
DESCRIPTION = """\
Writes the most likely class of each text (one a line, from stdin or --input; or --text TEXT) by a
classifier's RUN: an encoder alone whose head scores the classes its training labels named (`xspec train
SPEC --set num_labels=N --train F --train-labels L`, or --init from an imported BERT), read at each text's
first position. --scores adds each class's probability, in the order of the classes' names.

examples:
  xspec classify runs/sentiment --text "a fine film"
  xspec classify runs/sentiment --scores < reviews.txt > classes.tsv
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_text_arguments(parser, "classify", "classes")
    parser.add_argument("--scores", action="store_true", help="each class's probability after the class")
    parser.add_argument("--window", type=int_at_least(1), default=256, help="texts classified together (default 256)")


def run(args: argparse.Namespace) -> int:
    from xspec.runtime.inference import load
    from xspec.runtime.tasks.classification import class_probabilities

    check_text_arguments(args)
    trained = load(Path(args.model), args.device, args.compile, args.weights)
    if trained.classes is None:
        raise UserError(f"{args.model}: not a classifier (an encoder alone whose head scores num_labels classes)")
    names = list(trained.spec.params.get("labels") or [f"LABEL_{i}" for i in range(trained.classes)])

    def answer(lines: list[str], first: int, name: str) -> Iterator[str]:
        for probabilities in class_probabilities(trained, lines):
            best = max(range(len(names)), key=lambda c: probabilities[c])
            scores = "".join(f"\t{p:.4f}" for p in probabilities) if args.scores else ""
            yield f"{printable(names[best])}{scores}\n"

    answer_texts(args, answer)
    return 0
