"""`xspec fill`: a masked language model's most likely tokens at each mask of a text."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Iterator

from xspec.commands.arguments import int_at_least
from xspec.commands.translate import add_model_arguments, add_text_arguments, answer_texts, check_text_arguments
from xspec.base.text import printable

NAME = "fill"
COMPUTES = True
HELP = "fill the masks ([MASK], <mask>) of texts with a masked language model's most likely tokens"
DESCRIPTION = """\
For each text (one a line, from stdin or --input; or --text TEXT), the K most likely tokens at each of
its masks (the tokenizer's mask token: BERT's [MASK], RoBERTa's <mask>) by a masked language model's
RUN (BERT, RoBERTa, imported or trained), as transformers' fill-mask pipeline gives them: the text
encoded as the checkpoint's tokenizer encodes one, each candidate with its probability and the text it
makes. A text with several masks gives each mask's candidates, the other masks kept in the texts.

Each candidate is a line "PROBABILITY<TAB>TOKEN<TAB>TEXT" (a text's masks after one another, an empty
line after each text); --json writes one JSON list a text instead, the pipeline's dictionaries (score,
token, token_str, sequence), a list of them per mask.

examples:
  xspec fill runs/bert-base-uncased --text "the capital of france is [MASK]."
  xspec fill runs/roberta --top-k 10 --json < masked.txt > candidates.jsonl
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_text_arguments(parser, "fill the masks of", "candidates")
    parser.add_argument("--top-k", type=int_at_least(1), default=5, help="candidates per mask (default 5)")
    parser.add_argument("--json", action="store_true", help="one JSON list a text: the pipeline's dictionaries")
    parser.add_argument("--window", type=int_at_least(1), default=64, help="texts filled together (default 64)")


def run(args: argparse.Namespace) -> int:
    from xspec.runtime.fill import TextError, fill_masks
    from xspec.runtime.inference import load

    check_text_arguments(args)
    trained = load(Path(args.model), args.device, args.compile, args.weights)

    def answer(lines: list[str], first: int, name: str) -> Iterator[str]:
        try:
            filled = fill_masks(trained, lines, args.top_k)
        except TextError as error:      # named by its file and line
            raise error.at(f"{name}:{first + error.index}") from None
        for masks in filled:
            yield _formatted(masks, args.json)

    answer_texts(args, answer)
    return 0


def _formatted(masks, as_json: bool) -> str:
    if as_json:
        rows = [[candidate.as_dict() for candidate in mask] for mask in masks]
        return json.dumps(rows[0] if len(rows) == 1 else rows, ensure_ascii=False) + "\n"
    lines = [f"{candidate.score:.4f}\t{printable(candidate.token_str)}\t{printable(candidate.sequence)}"
             for mask in masks for candidate in mask]
    return "\n".join(lines) + "\n\n"
