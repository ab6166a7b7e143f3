"""`xspec export`: a trained model's graphs, with its vocabulary, for deployment without xspec."""

from __future__ import annotations

import argparse
from pathlib import Path

from xspec.base.text import shown
from xspec.commands.arguments import add_device_argument, byte_size

NAME = "export"
COMPUTES = True
HELP = "export a trained model's graphs (torch.export or ONNX), or as a Hugging Face checkpoint"
FORMATS = ("exported-program", "onnx", "hf")
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
not at all; an earlier export there is replaced, but a directory holding anything else (files
an export did not write, or added since) is refused, never emptied. docs/export.md shows how to run the graphs.

--format hf writes a directory transformers' from_pretrained loads (config.json, model.safetensors, the
tokenizer) for a run whose spec is one of the Hugging Face families of specs/modern/ (an import, a
fine-tuned import, or a run trained from a family's spec); a spec that computes something no family
does is refused, naming the first op where it differs from the closest family (docs/import.md).

examples:
  xspec export runs/tiny -o exported/tiny
  xspec export runs/lm --format onnx -o exported/lm-onnx     # needs: pip install 'xspec[onnx]'
  xspec export runs/qwen3-tuned --format hf -o exported/qwen3-tuned
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="RUN_OR_CHECKPOINT", help="a run directory or a checkpoint file")
    parser.add_argument("--format", choices=FORMATS, default=FORMATS[0],
                        help="exported-program: torch.export .pt2 files (default); onnx: .onnx files; hf: a "
                             "Hugging Face checkpoint directory")
    parser.add_argument("-o", "--output", required=True, metavar="DIR",
                        help="the directory to write (created; an earlier export there is replaced, never a "
                             "directory holding anything xspec did not write)")
    parser.add_argument("--max-shard-size", type=byte_size(1000, 10**13), metavar="SIZE",
                        help="--format hf: the largest weights file (default 5GB, as transformers writes; larger "
                             "models get several files and model.safetensors.index.json)")
    add_device_argument(parser, "; an exported program runs on the device it was exported on")


def run(args: argparse.Namespace) -> int:
    from xspec.runtime.export import check_destination, check_onnx_installed, export_model
    from xspec.runtime.inference import load

    if args.format == "hf":
        return _export_hf(args)
    if args.max_shard_size is not None:
        from xspec.base.errors import UserError

        raise UserError("--max-shard-size sizes the weights files of --format hf; the other formats write one file")
    output = check_destination(Path(args.output))
    if args.format == "onnx":
        check_onnx_installed()
    trained = load(Path(args.model), args.device, weights="fp32")  # written as trained
    files = export_model(trained, args.format, output)
    kind = "language model" if trained.is_language_model else "translation model"
    print(f"exported {trained.spec.name} ({kind}, {shown(trained.path.name)}) to {shown(output)}: {', '.join(files)}")
    return 0


def _export_hf(args: argparse.Namespace) -> int:
    from xspec.base.output_dir import check_replaceable, write_directory
    from xspec.hf.export import export_hf
    from xspec.runtime.export import WRITER
    from xspec.runtime.inference import load

    output = check_replaceable(Path(args.output), "--output", "export")
    trained = load(Path(args.model), "cpu", weights="fp32")  # written as trained
    written: list[str] = []
    write_directory(output, lambda staging: written.extend(export_hf(trained, staging, args.max_shard_size, print)),
                    WRITER)
    print(f"exported {shown(trained.spec.name)} ({shown(trained.path.name)}) as a Hugging Face checkpoint to "
          f"{shown(output)}: {', '.join(written)}")
    return 0
