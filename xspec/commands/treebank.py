"""`xspec treebank`: the constituency-parsing experiment (§6.3, Table 4): `prepare` a Penn Treebank into
sentence/tree pairs for `xspec train`, `score` a model's output with labelled bracket F1 (docs/parsing.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from xspec.commands.arguments import add_debug_argument, int_at_least
from xspec.base.files import check_output_dir, check_output_file

NAME = "treebank"
HELP = "constituency parsing (§6.3): prepare a Penn Treebank for training, score parses with bracket F1"
DESCRIPTION = """\
Parsing as translation, as in the paper's §6.3 (after Vinyals, Kaiser et al. 2014): the source is
the sentence's words, the target its tree as a bracket sequence with every part-of-speech tag written
XX, e.g. `(S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S`.

  prepare TREES --fileids FILE -o DIR [--vocab-size N]
      TREES has one bracketed tree a line, FILE the treebank file of each (wsj_0001.mrg, ...). Writes
      DIR/{train,valid,test}.{words,trees,gold}: sentences, linearised trees, normalised gold trees
      (empty elements removed, function tags stripped), split by file (--split); and
      DIR/sentencepiece.model, the vocabulary for `xspec train --vocab`, each tree symbol one piece.
  score --gold GOLD --hyp OUTPUT [-o TREES]
      De-linearises each line of OUTPUT over the words of the gold tree on the same line (always a
      tree: unbalanced brackets and wrong leaf counts are repaired and counted), then prints labelled
      bracket recall, precision and F1 with EVALB's COLLINS.prm conventions, for all sentences and
      for those of at most 40 words; the last line has F1.

examples:
  D=../shared/data/ptb-sample-nltk
  xspec treebank prepare $D/wsj_0001-0199.trees.oneline.txt --fileids $D/wsj_0001-0199.trees.fileids.txt -o ptb
  xspec train specs/parsing.xspec --train-src ptb/train.words --train-tgt ptb/train.trees \\
      --valid-src ptb/valid.words --valid-tgt ptb/valid.trees --vocab ptb/sentencepiece.model \\
      --no-test -o runs/parsing
  xspec translate runs/parsing -i ptb/test.words -o test.hyp
  xspec treebank score --gold ptb/test.gold --hyp test.hyp -o test.parsed
  bench/parsing.sh        # all of the above, a CPU-sized model
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from xspec.parsing.split import SCHEMES, describe

    modes = parser.add_subparsers(dest="mode", metavar="MODE", required=True)
    prepare = modes.add_parser("prepare", help="a treebank to DIR/{train,valid,test}.{words,trees,gold}",
                               description="Splits TREES by file id and writes, per split, the sentences "
                                           "(.words), the linearised trees (.trees) and the normalised gold "
                                           "trees (.gold), line-aligned.")
    add_debug_argument(prepare)
    prepare.add_argument("trees", metavar="TREES", help="bracketed trees, one a line")
    prepare.add_argument("--fileids", required=True, metavar="FILE",
                         help="the treebank file of each tree (wsj_0001.mrg, ...), one a line, aligned with TREES")
    prepare.add_argument("-o", "--output", required=True, metavar="DIR", help="the folder to write the splits to")
    prepare.add_argument("--vocab-size", type=int_at_least(8), default=16000, metavar="N",
                         help="pieces of DIR/sentencepiece.model, the shared BPE vocabulary of the training "
                              "split, every tree symbol one piece (default 16000, the paper's for WSJ)")
    prepare.add_argument("--split", choices=tuple(SCHEMES), default="sample",
                         help=f"sample: {describe('sample')} (NLTK's WSJ sample, the default); wsj: sections "
                              "02-21, 22, 23 of the full treebank")
    score = modes.add_parser("score", help="labelled bracket F1 of a model's output against gold trees",
                             description="Prints EVALB-style labelled bracket recall, precision and F1 "
                                         "(COLLINS.prm conventions); the last line has F1.")
    add_debug_argument(score)
    score.add_argument("--gold", required=True, metavar="FILE",
                       help="gold trees, bracketed, one a line (prepare's test.gold, or the treebank's lines)")
    score.add_argument("--hyp", required=True, metavar="FILE",
                       help="the model's output: linearised trees, one a line, aligned with --gold")
    score.add_argument("-o", "--output", metavar="FILE",
                       help="also write the de-linearised trees here, bracketed, with the gold tags (for evalb)")
    score.add_argument("--json", action="store_true", help="print one JSON object instead of the report")



def run(args: argparse.Namespace) -> int:
    return _prepare(args) if args.mode == "prepare" else _score(args)


def _prepare(args: argparse.Namespace) -> int:
    from xspec.parsing.prepare import prepare
    from xspec.parsing.split import describe

    output = check_output_dir(Path(args.output), "--output")
    done = prepare(Path(args.trees), Path(args.fileids), output, args.split, args.vocab_size)
    counts = ", ".join(f"{name} {count} sentences ({done.words[name]} words)" for name, count in done.counts.items())
    print(f"split by file ({describe(args.split)}): {counts}")
    if done.outside or done.empty:
        print(f"left out: {done.outside} trees from files outside the splits, {done.empty} trees with no words")
    print(f"vocabulary: {done.pieces} pieces (BPE over both sides of the training split), each of the "
          f"{done.symbols} tree symbols one piece")
    print(f"wrote {len(done.files)} files to {output}/")
    return 0


def _score(args: argparse.Namespace) -> int:
    from xspec.base.files import write_atomically
    from xspec.parsing.score_files import as_json, report, score_files
    from xspec.parsing.tree import to_bracketed

    output = check_output_file(Path(args.output), "--output") if args.output else None
    scored = score_files(Path(args.gold), Path(args.hyp))
    if output is not None:
        write_atomically(output, "".join(to_bracketed(tree) + "\n" for tree in scored.trees))
    print(json.dumps(as_json(scored), indent=2) if args.json else report(scored), end="\n" if args.json else "")
    return 0
