"""`xspec export`: a trained model's graphs, with its vocabulary, for deployment without xspec."""

from __future__ import annotations

import argparse
from pathlib import Path

from xspec.commands.arguments import add_device_argument

NAME = "export"
COMPUTES = True
HELP = "export a trained model's graphs (torch.export or ONNX) with its vocabulary"
FORMATS = ("exported-program", "onnx")
DESCRIPTION = """\
Exports the latest checkpoint of RUN (or the given checkpoint file) as graphs that run without xspec:
torch.export programs (.pt2, torch.export.load) or ONNX (.onnx, e.g. onnxruntime). --output is a
directory holding

  export.json          the manifest: each graph's file, inputs and outputs in order, the dimensions
                       that vary and their bounds, the cache's shapes, the special token ids
  sentencepiece.model  the vocabulary (text <-> token ids)
  encoder.pt2          a translation model's encoder: source tokens and padding mask -> the memory,
                       and the keys and values of it each decoder layer attends to
  decoder.pt2          one decoding step: one new token per row and the key/value cache so far ->
                       the next token's logits and the cache grown by one position

Batch size and lengths are dynamic, up to the model's positions. The directory appears complete or
not at all; an earlier export there is replaced. docs/export.md shows how to run the graphs.

examples:
  xspec export runs/tiny -o exported/tiny
  xspec export runs/lm --format onnx -o exported/lm-onnx     # needs: pip install 'xspec[onnx]'
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="RUN_OR_CHECKPOINT", help="a run directory or a checkpoint file")
    parser.add_argument("--format", choices=FORMATS, default=FORMATS[0],
                        help="exported-program: torch.export .pt2 files (default); onnx: .onnx files")
    parser.add_argument("-o", "--output", required=True, metavar="DIR",
                        help="the directory to write (created; an earlier export there is replaced)")
    add_device_argument(parser, "; an exported program runs on the device it was exported on")


def run(args: argparse.Namespace) -> int:
    from xspec.runtime.export import check_destination, check_onnx_installed, export_model
    from xspec.runtime.inference import load

    output = check_destination(Path(args.output))
    if args.format == "onnx":
        check_onnx_installed()
    trained = load(Path(args.model), args.device)
    files = export_model(trained, args.format, output)
    kind = "language model" if trained.is_language_model else "translation model"
    print(f"exported {trained.spec.name} ({kind}, {trained.path.name}) to {output}: {', '.join(files)}")
    return 0
