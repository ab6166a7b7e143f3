"""`xspec data`: corpora made ready for training once, read without loading them (docs/data.md)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from xspec.commands.arguments import add_debug_argument, int_at_least
from xspec.base.errors import UserError
from xspec.base.files import check_output_dir, open_regular_file
from xspec.base.text import printable, shown

NAME = "data"
HELP = "prepare text into token shards that xspec train reads without loading them (--data DIR)"
DESCRIPTION = """\
  prepare TEXT... -o DIR                       a language model's documents, one a line (or record)
  prepare --src FILE --tgt FILE -o DIR         a translation corpus, two files aligned line by line
                                               (record by record)
  show DIR                                     what a prepared directory holds, checked

prepare reads its input as a stream (memory bounded whatever its size), trains the vocabulary on a
sample of at most --vocab-sample lines (or takes --vocab), tokenizes on every core and writes DIR:
token shards (uint16 where the vocabulary fits, else uint32), the documents' or sentence pairs'
boundaries, the vocabulary and manifest.json (sources with sizes and hashes, counts, what was skipped,
the command). DIR appears only when complete. `xspec train SPEC --data DIR` then trains on it in
memory that does not grow with the corpus, and resumes with exactly the batches an uninterrupted run
would have seen.

input formats, by the file's name (for TEXT, --src and --tgt alike):
  *.jsonl, *.ndjson,    JSON Lines: one object a line, the text in its --field (default "text");
  *.json                a .json file of lines, as Hugging Face datasets' to_json writes it
  *.parquet             Parquet: the string column --field, read a record batch at a time
  .gz or .zst after     a gzip- or zstandard-compressed file of lines (x.jsonl.zst, x.txt.gz)
  anything else         plain text, one document (or sentence) a line
Empty lines, lines longer than --max-line-bytes, lines not UTF-8, and (JSON Lines, Parquet) lines not
JSON, not an object, or without a string --field are skipped, counted, and the first few named by file
and line (Parquet: row). A file that is not its format (not gzip, truncated, not Parquet, a column that
is not text) is an error naming it.

examples:
  xspec data prepare corpus/*.txt -o data/web --vocab-size 32000
  xspec data prepare crawl/*.jsonl.zst -o data/crawl --field content
  xspec data prepare --src train.en --tgt train.de -o data/wmt --vocab-size 37000
  xspec train specs/lm.xspec --data data/web --valid valid.txt -o runs/lm
  xspec train specs/lm.xspec --data data/web:0.7,data/books:0.3 --valid valid.txt
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    modes = parser.add_subparsers(dest="mode", metavar="MODE", required=True)
    prepare = modes.add_parser("prepare", help="text files into a prepared data directory",
                               description="Text, JSON Lines (.jsonl, .ndjson; .gz or .zst compressed too) or "
                                           "Parquet files (a language model's documents, or --src/--tgt: a "
                                           "translation corpus) into a prepared data directory.")
    add_debug_argument(prepare)
    prepare.add_argument("text", nargs="*", metavar="TEXT",
                         help="language model: files of documents, one a line (or JSON Lines record, or Parquet row)")
    prepare.add_argument("--src", metavar="FILE", help="translation: source sentences, one a line (or record)")
    prepare.add_argument("--tgt", metavar="FILE", help="translation: target sentences, aligned with --src")
    prepare.add_argument("--field", metavar="NAME",
                         help="JSON Lines: the field holding the text; Parquet: the column (default: text)")
    prepare.add_argument("-o", "--output", required=True, metavar="DIR", help="the folder to write (must not exist)")
    prepare.add_argument("--vocab", metavar="FILE", help="a sentencepiece model to use instead of training one")
    prepare.add_argument("--vocab-size", type=int_at_least(8), default=37000, metavar="N",
                         help="pieces of the vocabulary trained (default 37000, the paper's; `xspec train --data` "
                              "sizes the model's embedding to it)")
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
    from xspec.runtime.prepared.sources import check_input, input_format

    if (args.src is None) != (args.tgt is None):
        raise UserError("--src and --tgt go together (only one was given)")
    if args.src is not None and args.text:
        raise UserError(f"{shown(args.text[0])}: give either text files (a language model's documents) or --src and "
                        "--tgt (a translation corpus), not both")
    if args.src is None and not args.text:
        raise UserError("what to prepare? text files (a language model's documents) or --src FILE --tgt FILE")
    inputs = [Path(p) for p in ([args.src, args.tgt] if args.src is not None else args.text)]
    for path in inputs:
        check_input(path)           # a regular file (not a folder, a FIFO, a dangling link), of a format read here
    if args.field is not None and all(input_format(path)[0] == "text" for path in inputs):
        raise UserError(f"--field {shown(args.field)}: names the text's field of JSON Lines (.jsonl, .ndjson, .json) "
                        f"or Parquet inputs; {shown(str(inputs[0]))} is read as plain text, a document a line")
    if args.vocab:
        open_regular_file(Path(args.vocab)).close()
    out = check_output_dir(Path(args.output), "-o")
    options = PrepareOptions(vocab_size=args.vocab_size, vocab_model=args.vocab_model,
                             vocab_file=Path(args.vocab) if args.vocab else None, vocab_sample=args.vocab_sample,
                             max_line_bytes=args.max_line_bytes, field=args.field or "text",
                             workers=args.workers or os.cpu_count() or 1, progress=args.progress,
                             command=shlex.join(["xspec", *sys.argv[1:]]))
    if args.src is not None:
        prepare_parallel(inputs[0], inputs[1], out, options)
    else:
        prepare_text(inputs, out, options)
    return 0


def _show(args: argparse.Namespace) -> int:
    from xspec.runtime.prepared.format import NEWER_SKIPS, open_prepared
    from xspec.runtime.prepared.lines import KINDS

    prepared = open_prepared(Path(args.directory))
    manifest = prepared.manifest
    if args.json:
        # json.dumps, not pydantic's writer, which refuses a lone surrogate ("\ud800" is JSON, so a manifest's
        # string may hold one): _printable_json writes it as the escape it came as
        print(_printable_json(json.dumps(manifest.model_dump(mode="json"), indent=2, ensure_ascii=False)))
        return 0
    unit = "documents" if manifest.kind == "text" else "sentence pairs"
    print(f"{shown(prepared.path)}: {manifest.kind}, {manifest.examples:,} {unit}, format version {manifest.version} "
          "(checked: sizes, hashes, boundaries, token ids)")
    for name, count in manifest.tokens.items():
        print(f"  {name}: {count:,} tokens ({manifest.dtype}, {len(manifest.streams[name])} shard"
              f"{'s' if len(manifest.streams[name]) != 1 else ''}), longest {manifest.longest[name]:,}")
    print(f"  vocabulary: {prepared.pieces:,} pieces, {printable(manifest.vocabulary.origin)}")
    skipped = manifest.skipped
    newer = "".join(f", {getattr(skipped, kind):,} {KINDS[kind]}" for kind in NEWER_SKIPS if getattr(skipped, kind))
    print(f"  skipped: {skipped.empty:,} empty, {skipped.too_long:,} too long, {skipped.invalid_utf8:,} invalid UTF-8"
          f"{newer}")
    for place in skipped.where:
        print(f"    {printable(place)}")
    for source in manifest.sources:
        print(f"  source: {printable(source.path)} ({source.bytes:,} bytes, sha256 {source.sha256[:12]}...)")
    print(f"  command: {printable(manifest.command)}")
    return 0


def _printable_json(text: str) -> str:
    """JSON with every character a terminal could obey (they stand only inside its strings) written as its
    \\u escape: the same JSON value."""
    return "".join(c if c.isprintable() or c == "\n" else _json_escape(c) for c in text)


def _json_escape(c: str) -> str:
    units = c.encode("utf-16-be", "surrogatepass")
    return "".join(f"\\u{int.from_bytes(units[i:i + 2], 'big'):04x}" for i in range(0, len(units), 2))
