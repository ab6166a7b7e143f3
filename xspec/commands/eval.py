"""`xspec eval`: score a trained model on held-out text: a translation model with sacreBLEU (BLEU and
chrF, with signatures), a language model by perplexity."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xspec.commands.translate import add_decode_arguments, add_target_language_argument, decode_overrides
from xspec.base.errors import UserError
from xspec.base.files import check_output_file, write_atomically
from xspec.base.text import printable, shown

NAME = "eval"
COMPUTES = True
HELP = ("score a model: translate --src against --ref (BLEU, chrF), or a language model's --text (perplexity; a "
        "masked language model's: masked tokens' loss and accuracy)")
DESCRIPTION = """\
A translation model: translates --src with beam search and prints sacreBLEU's chrF and BLEU lines,
each with its signature (BLEU last).

A masked language model (BERT's): --text FILE, one text a line, each masked as its training masks one
(15% of its tokens, 80% of them to the mask token, 10% to a random one, with the run's seed); prints the
masked tokens' loss and accuracy (the share predicted right).

A classifier (an encoder alone scoring num_labels classes): --text FILE --labels FILE, a text and its class
a line; prints the accuracy and the macro F1 (the mean over classes of F1). A sentence-pair classifier's
pairs add --text-pair FILE, the second text of each, the line of the same number as its first.

A language model: --text FILE, one document a line (empty lines skipped); prints the perplexity, the
cross entropy in bits per token and in bits per byte (of the UTF-8 text, a newline per line: comparable
across vocabularies), and the token count. A line longer than the model's positions is scored in
windows, each without the earlier ones as context.

Several runs or checkpoints with one vocabulary are scored as an ensemble (see `xspec translate`):
translation models by BLEU of the ensemble's translations; language models by the perplexity of the
mixture ensemble decoding takes: each token's probability is the mean of the models' probabilities.

examples:
  xspec eval runs/tiny --src test.en --ref test.de
  xspec eval runs/tiny runs/tiny-seed2 --src test.en --ref test.de     # an ensemble of two
  xspec eval runs/lm --text test.txt
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_decode_arguments(parser)
    parser.add_argument("--src", metavar="FILE", help="source text, one sentence a line (translation)")
    parser.add_argument("--ref", metavar="FILE", help="reference translations, aligned with --src")
    add_target_language_argument(parser)
    parser.add_argument("--text", metavar="FILE", help="text to score, one document a line (language model)")
    parser.add_argument("--labels", metavar="FILE", help="a classifier's: the class of each line of --text")
    parser.add_argument("--text-pair", metavar="FILE",
                        help="a sentence-pair classifier's: the second text of each pair, aligned with --text")
    parser.add_argument("-o", "--output", metavar="FILE", help="also write the translations here")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="a progress bar while translating, when stderr is a terminal (default: on)")


def run(args: argparse.Namespace) -> int:
    from xspec.runtime.inference import load_ensemble

    if args.text is not None and (args.src or args.ref or args.output):
        raise UserError("--text scores a language model's text; --src, --ref and --output are for translation")
    if args.text is None and not (args.src and args.ref):
        raise UserError("which text? --src FILE --ref FILE for a translation model, --text FILE for a "
                        "language model or a masked language model")
    if args.output:
        check_output_file(Path(args.output), "--output")
    if args.text is not None:
        from xspec.runtime.prepared.sources import plain_text

        plain_text(Path(args.text), "--text", "write each record's text on a line of its own first")
    trained = load_ensemble([Path(m) for m in args.models], args.device, args.compile, args.weights)
    name = " + ".join(args.models)
    if trained.classes is not None:
        if len(args.models) > 1:
            raise UserError(f"{name}: classifiers are scored one at a time, not as an ensemble")
        if args.text is None or args.labels is None:
            raise UserError(f"{name}: a classifier: score it with --text FILE --labels FILE (accuracy, macro F1)")
        pair = Path(args.text_pair) if args.text_pair is not None else None
        return _classified(trained, Path(args.text), Path(args.labels), pair, args.batch_tokens)
    for flag, given in (("--labels", args.labels), ("--text-pair", args.text_pair)):
        if given is not None:
            raise UserError(f"{flag} gives a classifier's {'classes' if flag == '--labels' else 'pairs'}; {name} is "
                            "no classifier")
    if trained.is_masked_lm:
        if len(args.models) > 1:
            raise UserError(f"{name}: masked language models are scored one at a time, not as an ensemble")
        if args.text is None:
            raise UserError(f"{name}: a masked language model: score it with --text FILE (masked tokens' loss "
                            "and accuracy)")
        return _masked(trained, Path(args.text), args.batch_tokens)
    if args.text is not None:
        return _perplexity(trained, name, Path(args.text), args.batch_tokens)
    if trained.is_language_model:
        raise UserError(f"{name}: a language model; score its text with --text FILE")
    return _bleu(trained, args)


def _bleu(trained, args: argparse.Namespace) -> int:
    from xspec.runtime.corpus import read_lines
    from xspec.runtime.evaluate import score

    sources, references = read_lines(Path(args.src)), read_lines(Path(args.ref))
    if len(sources) != len(references):
        raise UserError(f"{args.src} has {len(sources)} lines but {args.ref} has {len(references)}")
    if not any(line.strip() for line in references):
        raise UserError(f"{shown(args.ref)}: no reference to score against (every line is empty)")
    translator = trained.translator(args.batch_tokens, args.tgt_lang, args.src_lang, **decode_overrides(args))
    hypotheses = translator.translate(sources, progress=args.progress and sys.stderr.isatty())
    if args.output:
        write_atomically(Path(args.output), "".join(h + "\n" for h in hypotheses))
    scores = score(hypotheses, references)
    print(scores.chrf_line)
    print(scores.bleu_line)
    return 0


def _classified(trained, texts: Path, labels: Path, pair: Path | None, batch_tokens: int) -> int:
    """A classifier's accuracy and macro F1 on the texts (or the pairs, with `pair`'s second texts) and their
    labels (the run's own label names)."""
    from xspec.runtime.run_dir import Split
    from xspec.runtime.tasks.classification import Classification, class_scores, predictions, read_labelled

    task = Classification(trained.spec)
    split = read_labelled(Split(texts, labels, pair), "test")
    unknown = next((i for i, label in enumerate(split.labels) if label not in task.names), None)
    if unknown is not None:
        raise UserError(f"{shown(labels)}:{unknown + 1}: \"{printable(split.labels[unknown])}\" is none of the model's "
                        f"classes ({printable(', '.join(task.names))})")
    text = task.classified(split, trained.tokenizer, truncate=True)
    if not len(text):
        raise UserError(f"{shown(texts)}: no text to classify")
    _said_truncated(texts, text.too_long, len(text), trained.spec)
    scores = class_scores(predictions(trained.model, text, trained.device, batch_tokens), text.classes)
    print(f"{shown(texts)}: accuracy {100 * scores.accuracy:.2f}%, macro F1 {scores.macro_f1:.4f} "
          f"({scores.texts:,} {'texts' if pair is None else 'pairs'})")
    return 0


def _masked(trained, path: Path, batch_tokens: int) -> int:
    """A masked language model's loss and accuracy over the text's tokens, masked as its training masks a
    split (with its run's seed: the same positions as the run's own test figures on the same file)."""
    from xspec.runtime.documents import read_documents
    from xspec.runtime.masking import masked_scores
    from xspec.runtime.tasks.masked_lm import MaskedLanguageModelling

    documents = read_documents(path)
    text = MaskedLanguageModelling(trained.spec).masked_text(documents, trained.tokenizer, truncate=True)
    _said_truncated(path, text.too_long, len(text), trained.spec)
    scores = masked_scores(trained.model, text, trained.device, batch_tokens)
    print(f"{shown(path)}: masked-token loss {scores.loss:.4f} nats (perplexity {scores.perplexity:.3f}), accuracy "
          f"{100 * scores.accuracy:.2f}% ({len(documents.lines):,} lines, {scores.tokens:,} masked tokens)")
    return 0


def _said_truncated(path: Path, too_long: int, texts: int, spec) -> None:
    """A line on stderr where texts were longer than the model's positions: only their first are scored."""
    from xspec.runtime.tasks import max_sequence_tokens

    if too_long:
        print(f"xspec: {shown(path)}: {too_long:,} of {texts:,} texts are longer than the model's "
              f"{max_sequence_tokens(spec):,} positions; only their first are scored", file=sys.stderr)


def _perplexity(trained, name: str, path: Path, batch_tokens: int) -> int:
    from xspec.runtime.documents import lines_named, read_documents

    if not trained.is_language_model:
        raise UserError(f"{name}: a translation model; score it with --src FILE --ref FILE")
    documents = read_documents(path)
    with lines_named(documents):
        scores = trained.score_lines(documents.lines, batch_tokens)
    print(f"{shown(path)}: perplexity {scores.perplexity:.3f}, {scores.bits_per_token:.4f} bits per token, "
          f"{scores.bits_per_byte:.4f} bits per byte ({len(documents.lines):,} lines, "
          f"{sum(scores.tokens):,} tokens)")
    return 0
