"""`xspec data`: corpora made ready for training once, read without loading them (docs/data.md)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from xspec.commands.arguments import add_debug_argument, int_at_least
from xspec.base.errors import UserError
from xspec.base.files import check_output_dir

NAME = "data"
HELP = "prepare text into token shards that xspec train reads without loading them (--data DIR)"
DESCRIPTION = """\
  prepare TEXT... -o DIR                       a language model's documents, one a line
  prepare --src FILE --tgt FILE -o DIR         a translation corpus, two line-aligned files
  show DIR                                     what a prepared directory holds, checked

prepare reads its input as a stream (memory bounded whatever its size), trains the vocabulary on a
sample of at most --vocab-sample lines (or takes --vocab), tokenizes on every core and writes DIR:
token shards (uint16 where the vocabulary fits, else uint32), the documents' or sentence pairs'
boundaries, the vocabulary and manifest.json (sources with sizes and hashes, counts, what was skipped,
the command). DIR appears only when complete. `xspec train SPEC --data DIR` then trains on it in
memory that does not grow with the corpus, and resumes with exactly the batches an uninterrupted run
would have seen.

examples:
  xspec data prepare corpus/*.txt -o data/web --vocab-size 32000
  xspec data prepare --src train.en --tgt train.de -o data/wmt --vocab-size 37000
  xspec train specs/lm.xspec --data data/web --valid valid.txt -o runs/lm
  xspec train specs/lm.xspec --data data/web:0.7,data/books:0.3 --valid valid.txt
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    modes = parser.add_subparsers(dest="mode", metavar="MODE", required=True)
    prepare = modes.add_parser("prepare", help="text files into a prepared data directory",
                               description="Text files (a language model's documents, or --src/--tgt: a "
                                           "translation corpus) into a prepared data directory.")
    add_debug_argument(prepare)
    prepare.add_argument("text", nargs="*", metavar="TEXT", help="language model: text files, one document a line")
    prepare.add_argument("--src", metavar="FILE", help="translation: source sentences, one a line")
    prepare.add_argument("--tgt", metavar="FILE", help="translation: target sentences, aligned with --src")
    prepare.add_argument("-o", "--output", required=True, metavar="DIR", help="the folder to write (must not exist)")
    prepare.add_argument("--vocab", metavar="FILE", help="a sentencepiece model to use instead of training one")
    prepare.add_argument("--vocab-size", type=int_at_least(8), default=37000, metavar="N",
                         help="pieces of the vocabulary trained (default 37000, the paper's; a spec's "
                              "data.vocab_size must be at most its embedding's rows)")
    prepare.add_argument("--vocab-model", choices=("bpe", "unigram"), default="bpe",
                         help="the sentencepiece algorithm (default bpe, the paper's)")
    prepare.add_argument("--vocab-sample", type=int_at_least(1), default=1_000_000, metavar="LINES",
                         help="lines the vocabulary is trained on at most, a uniform sample (default 1000000)")
    prepare.add_argument("--max-line-bytes", type=int_at_least(1, 1 << 30), default=1 << 20, metavar="BYTES",
                         help="longer lines are skipped and reported (default 1048576)")
    prepare.add_argument("--workers", type=int_at_least(1, 1024), default=None, metavar="N",
                         help="tokenizing processes (default: one per core)")
    prepare.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                         help="a progress bar when stderr is a terminal (default: on)")
    show = modes.add_parser("show", help="what a prepared directory holds, checked",
                            description="Checks DIR (sizes, hashes, boundaries, token ids) and prints its manifest.")
    add_debug_argument(show)
    show.add_argument("directory", metavar="DIR")
    show.add_argument("--json", action="store_true", help="print the manifest as JSON")



def run(args: argparse.Namespace) -> int:
    return _prepare(args) if args.mode == "prepare" else _show(args)


def _prepare(args: argparse.Namespace) -> int:
    from xspec.runtime.prepared.prepare import PrepareOptions, prepare_parallel, prepare_text

    if (args.src is None) != (args.tgt is None):
        raise UserError("--src and --tgt go together (only one was given)")
    if args.src is not None and args.text:
        raise UserError(f"{args.text[0]}: give either text files (a language model's documents) or --src and "
                        "--tgt (a translation corpus), not both")
    if args.src is None and not args.text:
        raise UserError("what to prepare? text files (a language model's documents) or --src FILE --tgt FILE")
    inputs = [Path(p) for p in ([args.src, args.tgt] if args.src is not None else args.text)]
    for path in inputs:
        if not path.is_file():
            raise UserError(f"{path}: no such file" if not path.exists() else f"{path}: not a regular file")
    out = check_output_dir(Path(args.output), "-o")
    options = PrepareOptions(vocab_size=args.vocab_size, vocab_model=args.vocab_model,
                             vocab_file=Path(args.vocab) if args.vocab else None, vocab_sample=args.vocab_sample,
                             max_line_bytes=args.max_line_bytes, workers=args.workers or os.cpu_count() or 1,
                             progress=args.progress, command=shlex.join(["xspec", *sys.argv[1:]]))
    if args.src is not None:
        prepare_parallel(inputs[0], inputs[1], out, options)
    else:
        prepare_text(inputs, out, options)
    return 0


def _show(args: argparse.Namespace) -> int:
    from xspec.runtime.prepared.format import open_prepared

    prepared = open_prepared(Path(args.directory))
    manifest = prepared.manifest
    if args.json:
        print(manifest.model_dump_json(indent=2))
        return 0
    unit = "documents" if manifest.kind == "text" else "sentence pairs"
    print(f"{prepared.path}: {manifest.kind}, {manifest.examples:,} {unit}, format version {manifest.version} "
          "(checked: sizes, hashes, boundaries, token ids)")
    for name, count in manifest.tokens.items():
        print(f"  {name}: {count:,} tokens ({manifest.dtype}, {len(manifest.streams[name])} shard"
              f"{'s' if len(manifest.streams[name]) != 1 else ''}), longest {manifest.longest[name]:,}")
    print(f"  vocabulary: {manifest.vocabulary.pieces:,} pieces, {manifest.vocabulary.origin}")
    skipped = manifest.skipped
    print(f"  skipped: {skipped.empty:,} empty, {skipped.too_long:,} too long, {skipped.invalid_utf8:,} invalid UTF-8")
    for place in skipped.where:
        print(f"    {place}")
    for source in manifest.sources:
        print(f"  source: {source.path} ({source.bytes:,} bytes, sha256 {source.sha256[:12]}...)")
    print(f"  command: {manifest.command}")
    return 0
