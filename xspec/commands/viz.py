"""`xspec viz`: architecture diagrams (Figures 1 and 2), variant diffs, attention maps (Figures 3-5)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import xspec
from xspec.commands.arguments import add_set_argument, int_at_least, parse_overrides
from xspec.base.errors import UserError
from xspec.base.files import check_output_file
from xspec.base.text import shown

NAME = "viz"
HELP = "draw a spec's architecture, what a variant changed, or a trained model's attention"
DESCRIPTION = """\
Draws SPEC as the paper's Figure 1: encoder and decoder stacks side by side, each repeated stack
once with its "N×", every sublayer with its residual connection and "Add & Norm", the encoder
output feeding the decoder's attention, embeddings, positional encodings, tied weights, the output
projection and softmax. The output format follows OUTPUT's extension: .svg, .png, .pdf (these
need graphviz's `dot` program) or .dot. Without -o, the diagram goes beside what `xspec compile`
writes: out/NAME/NAME.svg for specs/NAME.xspec (out/NAME/NAME-full.svg with --depth full,
out/NAME/NAME-vs-OTHER.svg with --diff OTHER).

  --depth 1     blocks: embeddings, the repeated stacks, the output projection
  --depth 2     sublayers, the level of Figure 1 (default)
  --depth full  every op, with multi-head attention opened up as in Figure 2

--diff OTHER draws SPEC with what differs from OTHER highlighted: changed ops (attributes, shape,
inputs), added ops, removed ops, and changed layer counts.

--attention RUN_OR_CHECKPOINT draws a trained model's attention weights for --sentence (the
paper's Figures 3-5): one heatmap per attention, layer and head, tokens on the axes. The decoder
side is the model's greedy translation unless --target gives one. Layers and heads count from 1.

examples:
  xspec viz specs/base.xspec                         # writes out/base/base.svg
  xspec viz specs/base.xspec -o base.svg
  xspec viz specs/base.xspec --depth full -o base_full.png
  xspec viz specs/base.xspec --set norm_first=true -o prenorm.svg
  xspec viz specs/table3/E_learned_positions.xspec --diff specs/base.xspec -o E.svg
  xspec viz --attention runs/tiny --sentence "the cat sees the dog" -o attn.png --layer 2
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", nargs="?", help="the .xspec file to draw (not with --attention)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="where to write: .svg, .png, .pdf or .dot (attention maps: .png, .svg, .pdf); default "
                             "for a diagram: out/NAME/NAME.svg, beside `xspec compile`'s output")
    parser.add_argument("--depth", choices=("1", "2", "full"), default="2",
                        help="level of detail: 1 blocks, 2 sublayers (default), full every op")
    add_set_argument(parser)
    parser.add_argument("--diff", metavar="OTHER_SPEC", help="highlight what differs from this spec")
    parser.add_argument("--attention", metavar="RUN_OR_CHECKPOINT",
                        help="draw attention maps of a trained run or checkpoint instead of a diagram")
    parser.add_argument("--sentence", help="with --attention: the source sentence")
    parser.add_argument("--target", help="with --attention: the decoder's sentence (default: the model's translation)")
    parser.add_argument("--layer", type=int_at_least(1), help="with --attention: only this layer (from 1)")
    parser.add_argument("--head", type=int_at_least(1), help="with --attention: only this head (from 1)")


def run(args: argparse.Namespace) -> int:
    if args.attention:
        return _attention(args)
    _reject_attention_options(args)
    if not args.spec:
        raise UserError("viz: give a SPEC to draw, or --attention RUN_OR_CHECKPOINT")
    return _diagram(args)


def _diagram(args: argparse.Namespace) -> int:
    from xspec.viz import architecture_dot
    from xspec.viz.diff import Diff
    from xspec.viz.render import output_format, write_diagram

    output = Path(args.output) if args.output else default_output(args.spec, args.depth, args.diff)
    output_format(output)  # a wrong extension, or a path no file can be written at, fails before compiling
    check_output_file(output, "--output")
    overrides = parse_overrides(args.overrides)
    spec = xspec.compile(args.spec, overrides=overrides)
    other = xspec.compile(args.diff) if args.diff else None
    write_diagram(architecture_dot(spec, args.depth, other), output)
    if other is not None and Diff(spec, other).is_empty:
        print(f"{shown(args.spec)} and {shown(args.diff)} draw the same graph")
    print(f"wrote {shown(output)}")
    return 0


def default_output(spec: str, depth: str, other: str | None) -> Path:
    """out/NAME/NAME[-depth][-vs-OTHER].svg: beside `xspec compile`'s out/NAME/, one file per view."""
    name = Path(spec).stem
    suffix = {"1": "-depth1", "2": "", "full": "-full"}[depth] + (f"-vs-{Path(other).stem}" if other else "")
    return Path("out") / name / f"{name}{suffix}.svg"


def _reject_attention_options(args: argparse.Namespace) -> None:
    for flag, value in (("--sentence", args.sentence), ("--target", args.target),
                        ("--layer", args.layer), ("--head", args.head)):
        if value is not None:
            raise UserError(f"{flag} goes with --attention RUN_OR_CHECKPOINT")


def _attention(args: argparse.Namespace) -> int:
    from xspec.viz.attention import check_plot_format, collect_maps, load_trained, plot

    if args.spec or args.diff or args.overrides:
        raise UserError("--attention draws a trained model: it takes no SPEC, --diff or --set")
    if not args.sentence or not args.sentence.strip():
        raise UserError("--attention needs --sentence \"...\" (the source sentence to look at)")
    if not args.output:
        raise UserError("--attention needs -o FILE (.png, .svg or .pdf): where to draw the maps")
    output = Path(args.output)
    check_plot_format(output)
    spec, model, vocab, step = load_trained(Path(args.attention))
    maps = collect_maps(spec, model, vocab, args.sentence, args.target, args.layer, args.head)
    if spec.has_encoder and args.target is None and len(maps[-1].queries) == 1:
        print("note: the model's translation is empty (only <s> on the decoder side); "
              "give one with --target \"...\"", file=sys.stderr)
    plot(maps, output, args.head, f"{spec.name}, step {step}: attention weights for \"{args.sentence.strip()}\"")
    print(f"wrote {shown(output)}")
    return 0
