"""`xspec import`: a Hugging Face save_pretrained directory as an xspec run directory."""

from __future__ import annotations

import argparse
import shlex
import textwrap
from pathlib import Path

from xspec.commands.arguments import add_device_argument
from xspec.base.errors import UserError
from xspec.base.text import shown
from xspec.hf.families import FAMILIES

NAME = "import"
COMPUTES = True
HELP = "import a Hugging Face checkpoint directory (config.json + safetensors) as a run directory"
DESCRIPTION = f"""\
Reads DIR, a directory that transformers' save_pretrained wrote (config.json, model.safetensors or
shards listed by model.safetensors.index.json, tokenizer.json or tokenizer.model), for the model types
of specs/modern/'s families:
{textwrap.fill(", ".join(FAMILIES), 106, initial_indent="  ", subsequent_indent="  ")}.
Writes OUTPUT, a run directory every command takes (show, viz, stats, generate, eval --text, export,
train --init):

  OUTPUT/model.xspec     the family's spec extended with the checkpoint's values, each `set` commented
                         with the config.json key it came from
  OUTPUT/spec.xspec      the same as one self-contained text
  OUTPUT/checkpoints/    the weights under the spec's names (safetensors), with the tokenizer
  OUTPUT/import.json     the source, what was mapped, what was set aside and why, the verification

Every config.json attribute is mapped, set aside as not changing the architecture (docs/import.md gives
each one's reason), or refused by name. Only safetensors are read (a pytorch_model.bin is refused); no
code from the checkpoint runs; every tensor's shape and dtype is checked before it is read, and its
values must be finite. With transformers installed (pip install 'xspec[hf]'), the import is
verified: the imported model and the checkpoint's own class compute logits on one random batch reaching
past the sliding window and the rotary scaling's original positions, and the import fails if they differ
(max |logit difference| and KL are printed). Without transformers the import says it is not verified.
Chat templates are not imported. OUTPUT appears complete or not at all, and an existing OUTPUT is only
replaced with --force.

examples:
  xspec import ~/models/Qwen3-0.6B -o runs/qwen3-0.6b
  xspec import ~/models/Llama-3.2-1B -o runs/llama --no-verify
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="DIR", help="a save_pretrained directory")
    parser.add_argument("-o", "--output", required=True, metavar="OUTPUT", help="the run directory to write")
    parser.add_argument("--force", action="store_true", help="replace OUTPUT if it exists")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip comparing the import's logits with transformers' (when it is installed)")
    add_device_argument(parser, "; where the verification runs both models, one after the other")


def run(args: argparse.Namespace) -> int:
    from xspec.hf.importer import import_checkpoint

    imported = import_checkpoint(Path(args.source), Path(args.output), force=args.force, verify=not args.no_verify,
                                 device=args.device)
    if args.no_verify:
        print("not verified (--no-verify)")
    spec, tokenizer = imported.spec, imported.tokenizer
    chat = ", its chat template" if tokenizer.chat is not None else ""
    print(f"imported {imported.mapped.model_type} as {spec.name} (extends specs/modern/{imported.mapped.spec}.xspec): "
          f"{spec.parameters:,} parameters, tokenizer {tokenizer.kind}{chat}, into {shown(imported.out)}")
    out = shown(shlex.quote(str(imported.out)))
    if spec.classes is not None:
        use = f"xspec classify {out} --text \"...\""
    elif not spec.has_decoder:
        use = f"xspec fill {out} --text \"... {shown(_mask_token(tokenizer))} ...\""
    elif imported.spec.has_encoder:
        use = f"xspec translate {out} < source.txt"
    else:
        use = f"xspec generate {out}" + (" --chat" if tokenizer.chat is not None else "") + " --prompt \"...\""
    print(f"next: xspec show {out}; xspec viz {out}; {use}")
    return 0


def _mask_token(tokenizer) -> str:
    """The tokenizer's mask token, for the example of `xspec fill` (BERT's where it names none)."""
    try:
        return tokenizer.mask()[0]
    except UserError:
        return "[MASK]"
