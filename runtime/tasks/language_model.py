"""Language modelling: text files, one document (or sentence) a line; every token predicted from the
ones before it (runtime/documents.py); at the end perplexity on the test split and a few sampled
continuations."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterable, Optional

import torch

from xspec.base.errors import UserError
from xspec.base.files import write_atomically
from ..demo_data import write_demo_text
from ..distributed import Context
from ..documents import Documents, encode_documents, lines_named, read_documents
from ..generation import Generator
from ..prepared.format import PreparedDir
from ..prepared.splits import check_run_vocabulary, decoded_documents, shared_vocabulary, train_text
from ..run_dir import DATA_DIR, SAMPLES, DataFiles, Split
from ..scoring import score_lines
from . import Corpus, Outcome, SplitReader, max_sequence_tokens
from ..unigram import token_counts, unigram_perplexity
from ..vocab import EOS, Vocab

SAMPLE_PROMPTS = 3          # test documents whose first words are continued at the end of a run
PROMPT_WORDS = 3


class TextSplits(SplitReader):
    """The reading of tasks that train on text alone, one document (or text) a line: a language model's, a
    masked language model's."""

    kind: str
    prepared_kind = "text"
    texts: dict[str, Documents]         # each split read, as text

    def demo_files(self, run_dir: Path) -> DataFiles:
        """The built-in demo's text: the English-like side of the demo language pair."""
        paths = write_demo_text(run_dir / DATA_DIR)
        return DataFiles(*(Split(paths[s]) for s in ("train", "valid", "test")))

    def decoded(self, dirs: list[PreparedDir]) -> Documents:
        return Documents([line for line in decoded_documents(dirs) if line], dirs[0].path)

    def read_plain(self, name: str, split: Split) -> Documents:
        if split.tgt is not None:
            raise UserError(f"{split.src}, {split.tgt}: a {self.kind} trains on one text file per split "
                            f"(--{name} FILE), not a source and a target")
        return read_documents(split.src)

    def vocab_text(self) -> Iterable[str]:
        return self.texts["train"].lines

    def prepared_vocab(self) -> Optional[tuple[Path, bytes]]:
        return shared_vocabulary(self.prepared)


class LanguageModelling(TextSplits):
    kind = "language model"

    def __init__(self, spec) -> None:
        super().__init__()
        self.spec = spec
        self.train_counts: Counter[int] = Counter()     # token -> how often the training data predicts it
        self.train_examples = None

    def example_size(self) -> int:
        """Predictions per block (blocks), or the most inputs of a line (lines)."""
        data, longest = self.spec.data, max_sequence_tokens(self.spec)
        if data.examples == "lines" or data.block_size is None:
            return longest
        positions = self.spec.max_positions
        if positions is not None and data.block_size > positions:
            raise UserError(f"data.block_size = {data.block_size} is more than the model's {positions} positions")
        return data.block_size

    def encode(self, vocab: Vocab, truncate: bool, vocab_path: str = "") -> Corpus:
        mode, size = self.spec.data.examples, self.example_size()
        if "train" in self.prepared:
            check_run_vocabulary(self.prepared, vocab, vocab_path)
            train = train_text(self.prepared["train"], self.weights, mode, size, truncate)
        else:
            train = encode_documents(self.texts["train"], vocab, mode, size, truncate)
            if not len(train):
                raise UserError(f"{self.texts['train'].path}: every line is longer than {size} tokens; "
                                "raise data.max_tokens or pass --truncate")
            self.train_counts = token_counts(sequence[1:] for sequence in train.sequences)
        self.train_examples = train
        valid = encode_documents(self.texts["valid"], vocab, mode, size, truncate=True) \
            if "valid" in self.texts else None
        return Corpus(train, valid)

    def evaluate(self, model: torch.nn.Module, vocab: Vocab, context: Context, run_dir: Path,
                 progress: bool) -> Optional[Outcome]:
        """Perplexity on the test split (or the validation split when there is none, said so), line by line
        (runtime/scoring.py); continuations of a few test documents' first words, and of nothing, into
        RUN/samples.txt."""
        test = self.texts.get("test", self.texts.get("valid"))
        if test is None:
            return None
        split = "test" if "test" in self.texts else "validation"     # what the figures are called
        longest = max_sequence_tokens(self.spec)
        if not self.train_counts and self.train_examples is not None:       # prepared: counted now, a chunk at a time
            counts = self.train_examples.token_counts()
            self.train_counts = Counter({i: int(n) for i, n in enumerate(counts.tolist()) if n})
        with lines_named(test):
            scores = score_lines(model, vocab, test.lines, context.device, longest,
                                 precision=self.spec.decode.precision)
            test_ids = vocab.encode(test.lines)
        # each line as a document: its tokens and the EOS after them (the first EOS is context, not predicted)
        unigram = unigram_perplexity(self.train_counts, ([*ids, EOS] for ids in test_ids), len(vocab))
        prompts = [" ".join(line.split()[:PROMPT_WORDS]) for line in test.lines[:SAMPLE_PROMPTS]] + [""]
        generator = Generator(model, vocab, self.spec.decode, context.device, longest, seed=self.spec.train.seed)
        continuations = generator.generate(prompts)
        write_atomically(run_dir / SAMPLES, "".join(f"{p} ||| {c}\n" for p, c in zip(prompts, continuations)))
        metrics = {f"{split}_loss": round(scores.loss, 5), f"{split}_perplexity": round(scores.perplexity, 3),
                   f"{split}_bits_per_token": round(scores.bits_per_token, 4),
                   f"{split}_bits_per_byte": round(scores.bits_per_byte, 4), "unigram_perplexity": round(unigram, 3),
                   "scored_on": split}
        lines = [f"sample: [{p}] {c}" for p, c in zip(prompts, continuations)]
        lines.append(f"{split} perplexity {scores.perplexity:.2f} ({scores.loss:.4f} nats, {scores.bits_per_token:.3f} "
                     f"bits per token, {scores.bits_per_byte:.3f} bits per byte, {sum(scores.tokens):,} tokens; "
                     f"a unigram model of the training data: {unigram:.2f})")
        return Outcome(metrics, lines)
