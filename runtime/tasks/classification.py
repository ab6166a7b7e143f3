"""Sentence classification: a text file and a label file of as many lines (`--train F --train-labels L`), one
text and its class a line; an encoder alone whose head scores `num_labels` classes at each position, read at
the first ([CLS]'s, as BERT's pooler reads it). The classes are the training labels, sorted, which the run's
spec keeps (`labels`); at the end, accuracy and macro F1 on the test split.

Sentence pairs (MNLI's premise and hypothesis, QQP's two questions) add a third file of as many lines, each the
second text of the pair whose first is the text file's line of the same number (`--train-pair P`). A pair is
framed as the tokenizer's pair template frames two texts (BERT's [CLS] a [SEP] b [SEP]; xspec's own
vocabulary's a EOS b EOS), and a model whose encoder reads token types is given each position's (the first
text's 0, the second's 1, as the template types them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch

from xspec.base.errors import UserError
from xspec.base.text import printable, shown
from ..batching import NO_LABEL, Batch, micro_batches, pad, pad_with_mask
from ..corpus import Framed, framed, read_lines
from ..data_order import WholeCorpusWindows
from ..distributed import Context
from ..documents import lines_named, Documents
from ..prepared.format import PreparedDir
from ..run_dir import DataFiles, Split
from ..vocab import Tokenizer
from . import Corpus, Outcome, SplitReader, max_sequence_tokens


@dataclass
class LabelledText:
    """A split's texts and their labels, as read (each text stripped, each label stripped); for sentence
    pairs, the second text of each (`pairs`, read from `pairs_path`)."""

    texts: list[str]
    labels: list[str]
    path: Path
    labels_path: Path
    pairs: Optional[list[str]] = None
    pairs_path: Optional[Path] = None


def read_labelled(split: Split, name: str) -> LabelledText:
    """The split's text file and its label file (and its pair file), line for line; an empty text or label is
    named by its line."""
    if split.tgt is None:
        raise UserError(f"{split.src}: a classifier trains on a text file and a label file per split (--{name} FILE "
                        f"--{name}-labels FILE)")
    texts, labels = read_lines(split.src), read_lines(split.tgt)
    if len(texts) != len(labels):
        raise UserError(f"{shown(split.src)} has {len(texts)} lines but {shown(split.tgt)} has {len(labels)}: one "
                        "label a text")
    files = [(split.src, texts, "text"), (split.tgt, labels, "label")]
    pairs = None
    if split.pair is not None:
        pairs = read_pairs(split.pair, texts, split.src)
        files.append((split.pair, pairs, "second text"))
    for path, lines, what in files:
        empty = next((i for i, line in enumerate(lines) if not line.strip()), None)
        if empty is not None:
            raise UserError(f"{shown(path)}:{empty + 1}: an empty {what}")
    return LabelledText([t.strip() for t in texts], [label.strip() for label in labels], split.src, split.tgt,
                        [t.strip() for t in pairs] if pairs is not None else None, split.pair)


def read_pairs(path: Path, texts: list[str], texts_path: Path | str) -> list[str]:
    """The second texts of `texts`' pairs, line for line: a line of one without its line in the other is named."""
    pairs = read_lines(path)
    if len(pairs) > len(texts):
        raise misaligned(path, texts_path, len(texts))
    if len(pairs) < len(texts):
        raise misaligned(texts_path, path, len(pairs))
    return pairs


def misaligned(longer: Path | str, shorter: Path | str, lines: int) -> UserError:
    """The refusal of a pair's text whose other text is missing: `longer`'s line after the `lines` of `shorter`."""
    return UserError(f"{shown(longer)}:{lines + 1}: no line {lines + 1} in {shown(shorter)}, which has {lines}: a "
                     "pair's two texts are the lines of the same number")


@dataclass
class ClassifiedText(WholeCorpusWindows):
    """Texts framed by the tokenizer, each with its class: a batch's inputs (texts, padding, and each
    position's token type where the model reads them), its labels the class at each text's first position
    (NO_LABEL elsewhere). Batching reads a text's length as a source's and its one prediction as a target of
    one token."""

    sequences: list[list[int]]
    classes: list[int]
    too_long: int = 0
    truncated: bool = False
    types: Optional[list[list[int]]] = None

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def src_lens(self) -> list[int]:
        return [len(s) for s in self.sequences]

    @property
    def tgt_lens(self) -> list[int]:
        return [0] * len(self.sequences)

    def collate(self, indices: list[int]) -> Batch:
        tokens, padding = pad_with_mask([self.sequences[i] for i in indices])
        labels = torch.full(tokens.shape, NO_LABEL, dtype=torch.long)
        labels[:, 0] = torch.tensor([self.classes[i] for i in indices])
        types = (pad([self.types[i] for i in indices]),) if self.types is not None else ()
        return Batch((tokens, padding, *types), labels, len(indices))

    def summary(self, name: str) -> str:
        counts = [self.classes.count(c) for c in sorted(set(self.classes))]
        parts = [f"{name}: {len(self)} texts, {sum(self.src_lens):,} tokens, {len(counts)} classes "
                 f"(from {min(counts)} to {max(counts)} texts each)"]
        if self.too_long:
            parts.append(f"{self.too_long} too long {'truncated' if self.truncated else 'skipped'}")
        return ", ".join(parts)


@dataclass(frozen=True)
class ClassScores:
    accuracy: float
    macro_f1: float         # the mean over classes of 2 PR / (P + R), a class never predicted nor true left out
    texts: int


def class_scores(predicted: list[int], true: list[int]) -> ClassScores:
    right = sum(p == t for p, t in zip(predicted, true))
    f1s = []
    for c in sorted(set(true) | set(predicted)):
        hits = sum(p == t == c for p, t in zip(predicted, true))
        guessed, actual = predicted.count(c), true.count(c)
        f1s.append(2 * hits / (guessed + actual) if guessed + actual else 0.0)
    return ClassScores(right / max(len(true), 1), sum(f1s) / max(len(f1s), 1), len(true))


def probabilities(model: torch.nn.Module, text: ClassifiedText, device: torch.device,
                  batch_tokens: int = 4000) -> list[list[float]]:
    """Each text's probability of each class, in order."""
    found: dict[int, list[float]] = {}
    model.eval()
    with torch.no_grad():
        for indices in micro_batches(text.src_lens, text.tgt_lens, batch_tokens):
            batch = text.collate(indices).to(device)
            found.update(zip(indices, model(*batch.inputs)[:, 0].float().softmax(-1).tolist()))
    return [found[i] for i in range(len(text))]


def predictions(model: torch.nn.Module, text: ClassifiedText, device: torch.device,
                batch_tokens: int = 4000) -> list[int]:
    """The most likely class of each text, in order."""
    return [max(range(len(p)), key=p.__getitem__) for p in probabilities(model, text, device, batch_tokens)]


def class_probabilities(trained, texts: list[str], pairs: Optional[list[str]] = None,
                        on_too_long: Optional[Callable[[int, int], None]] = None) -> list[list[float]]:
    """Each text's (or, with `pairs`, each pair's) probability of each class (a classifier loaded by
    xspec.load), framed as the tokenizer frames a text (or a pair) and cut to the model's positions (keeping
    the framing's end; a pair's longer text first); each one cut first reported to `on_too_long(index,
    tokens)`."""
    tokenizer = trained.tokenizer
    types = None
    if pairs is None:
        kept = framed(tokenizer.encode_sources(texts), trained.max_tokens, True, len(tokenizer.framing()[1]),
                      frozenset())
    else:
        kept, types = framed_pairs(tokenizer, tokenizer.encode(texts), tokenizer.encode(pairs), trained.max_tokens,
                                   True, trained.spec.token_types)
    if on_too_long is not None:
        for index, tokens in kept.longer:
            on_too_long(index, tokens)
    return probabilities(trained.model, ClassifiedText(kept.texts, [0] * len(kept.texts), types=types),
                         trained.device)


def framed_pairs(vocab: Tokenizer, firsts: list[list[int]], seconds: list[list[int]], size: int, truncate: bool,
                 token_types: Optional[int]) -> tuple[Framed, Optional[list[list[int]]]]:
    """The encoded pairs framed as the tokenizer's pair template frames two texts, in at most `size` positions
    (a longer pair cut, its longer text first, where `truncate`; else left out), with each position's token
    type where the model reads them (`token_types`: how many it has; None: it reads none)."""
    template = vocab.pair_template()
    if token_types is not None and template.types > token_types:
        raise UserError(f"the tokenizer gives a pair's tokens {template.types} types (0 to {template.types - 1}), "
                        f"but the model's token type embedding has {token_types} (type_vocab_size)")
    out, types = Framed([], []), []
    for index, (first, second) in enumerate(zip(firsts, seconds)):
        if len(first) + len(second) + template.specials > size:
            out.longer.append((index, len(first) + len(second) + template.specials))
            if not truncate:
                continue
        ids, kinds = template.frame(first, second, size)
        out.texts.append(ids)
        out.indices.append(index)
        types.append(kinds)
    return out, types if token_types is not None else None


class Classification(SplitReader):
    kind = "classifier"
    prepared_kind = "text"
    texts: dict[str, LabelledText]

    def __init__(self, spec) -> None:
        super().__init__()
        self.spec = spec
        self.names: list[str] = list(spec.params.get("labels") or [])

    def demo_files(self, run_dir: Path) -> DataFiles:
        raise UserError(f"{self.spec.name}: a classifier has no built-in demo task: give --train FILE --train-labels "
                        "FILE (and --valid, --test with their labels)")

    def decoded(self, dirs: list[PreparedDir]):
        raise UserError("--data: a classifier reads a text file and a label file per split; prepared directories "
                        "hold language models' and translation models' data")

    def read_plain(self, name: str, split: Split) -> LabelledText:
        return read_labelled(split, name)

    def read(self, data: DataFiles) -> list[str]:
        if "labels" not in self.spec.params:
            raise UserError(f"{self.spec.name}: a classifier's spec keeps its classes' names: declare "
                            "`param labels = []` (its run sets them from the training labels)")
        notes = super().read(data)
        found = sorted(set(self.texts["train"].labels))
        classes = self.spec.classes
        if self.names and self.names != found:
            raise UserError(f"{self.texts['train'].path}: its labels ({_listed(found)}) are not the spec's labels "
                            f"({_listed(self.names)})")
        if len(found) != classes:
            fix = f": --set num_labels={len(found)}" if "num_labels" in self.spec.params else ""
            raise UserError(f"the training labels name {len(found)} class{'es' if len(found) != 1 else ''} "
                            f"({_listed(found)}), but the spec's classifier scores {classes}{fix}")
        self.names = found
        for split in self.texts.values():
            unknown = next((i for i, label in enumerate(split.labels) if label not in found), None)
            if unknown is not None:
                raise UserError(f"{shown(split.labels_path)}:{unknown + 1}: \"{printable(split.labels[unknown])}\" is "
                                f"no training label ({_listed(found)})")
        return notes

    def settings(self) -> dict:
        return {"labels": self.names}

    def vocab_text(self) -> Iterable[str]:
        train = self.texts["train"]
        return train.texts + (train.pairs or [])

    def prepared_vocab(self) -> Optional[tuple[Path, bytes]]:
        return None

    def classified(self, split: LabelledText, vocab: Tokenizer, truncate: bool) -> ClassifiedText:
        size, types = max_sequence_tokens(self.spec), None
        if split.pairs is None:
            with lines_named(Documents(split.texts, split.path)):
                encoded = vocab.encode_sources(split.texts)
            kept = framed(encoded, size, truncate, len(vocab.framing()[1]), frozenset())
        else:
            assert split.pairs_path is not None
            with lines_named(Documents(split.texts, split.path)):
                firsts = vocab.encode(split.texts)
            with lines_named(Documents(split.pairs, split.pairs_path)):
                seconds = vocab.encode(split.pairs)
            kept, types = framed_pairs(vocab, firsts, seconds, size, truncate, self.spec.token_types)
        classes = [self.names.index(split.labels[i]) for i in kept.indices]
        return ClassifiedText(kept.texts, classes, kept.too_long, truncate, types)

    def encode(self, vocab: Tokenizer, truncate: bool, vocab_path: str = "") -> Corpus:
        train = self.classified(self.texts["train"], vocab, truncate)
        if not len(train):
            what = "pair" if self.texts["train"].pairs is not None else "text"
            raise UserError(f"{self.texts['train'].path}: every {what} is longer than the model's "
                            f"{max_sequence_tokens(self.spec)} positions; raise data.max_tokens or pass --truncate")
        valid = self.classified(self.texts["valid"], vocab, truncate=True) if "valid" in self.texts else None
        return Corpus(train, valid)

    def evaluate(self, model: torch.nn.Module, vocab: Tokenizer, context: Context, run_dir: Path,
                 progress: bool) -> Optional[Outcome]:
        """Accuracy and macro F1 on the test split (or the validation split when there is none, said so)."""
        test = self.texts.get("test", self.texts.get("valid"))
        if test is None:
            return None
        split = "test" if "test" in self.texts else "validation"
        text = self.classified(test, vocab, truncate=True)
        scores = class_scores(predictions(model, text, context.device), text.classes)
        metrics = {f"{split}_accuracy": round(scores.accuracy, 5), f"{split}_macro_f1": round(scores.macro_f1, 5),
                   "scored_on": split}
        return Outcome(metrics, [f"{split}: accuracy {100 * scores.accuracy:.2f}%, macro F1 {scores.macro_f1:.4f} "
                                 f"over {scores.texts:,} texts"])


def _listed(names: list[str]) -> str:
    shown_names = [printable(n) for n in names[:10]]
    return ", ".join(shown_names) + (", ..." if len(names) > 10 else "")
