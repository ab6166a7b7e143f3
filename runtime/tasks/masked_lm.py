"""Masked language modelling (BERT's): text files, one text a line, each framed as the tokenizer frames a
text ([CLS] ... [SEP]) and masked when batched (runtime/masking.py: 15% chosen, 80/10/10); at the end the
masked-token loss and accuracy on the test split."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from xspec.base.errors import UserError
from ..distributed import Context
from ..documents import Documents, lines_named
from ..corpus import framed
from ..masking import Masking, MaskedText, masked_scores
from ..vocab import Tokenizer
from . import Corpus, Outcome, max_sequence_tokens
from .language_model import TextSplits


class MaskedLanguageModelling(TextSplits):
    kind = "masked language model"

    def __init__(self, spec) -> None:
        super().__init__()
        self.spec = spec
        self.masking: Optional[Masking] = None

    def masked_text(self, docs: Documents, vocab: Tokenizer, truncate: bool) -> MaskedText:
        """A split's texts framed by the tokenizer, at most the model's positions long."""
        if self.masking is None:
            _, mask_id = vocab.mask()
            self.masking = Masking(mask_id, vocab.special_token_ids(), len(vocab), self.spec.train.seed)
        with lines_named(docs):
            encoded = vocab.encode_sources(docs.lines)
        kept = framed(encoded, max_sequence_tokens(self.spec), truncate, len(vocab.framing()[1]),
                      self.masking.special)
        return MaskedText(kept.texts, self.masking, docs.empty_skipped + kept.empty, kept.too_long, truncate)

    def encode(self, vocab: Tokenizer, truncate: bool, vocab_path: str = "") -> Corpus:
        if "train" in self.prepared:
            raise UserError("--data: a masked language model reads its training text from a file (--train FILE); "
                            "prepared directories hold language models' and translation models' data")
        train = self.masked_text(self.texts["train"], vocab, truncate)
        if not len(train):
            raise UserError(f"{self.texts['train'].path}: no line to train on: each is longer than the model's "
                            f"{max_sequence_tokens(self.spec)} positions (raise data.max_tokens or pass --truncate) "
                            "or holds special tokens alone (an unknown word is one: [UNK])")
        valid = self.masked_text(self.texts["valid"], vocab, truncate=True) if "valid" in self.texts else None
        return Corpus(train, valid)

    def evaluate(self, model: torch.nn.Module, vocab: Tokenizer, context: Context, run_dir: Path,
                 progress: bool) -> Optional[Outcome]:
        """The masked-token loss and accuracy on the test split (or the validation split when there is none,
        said so), masked as in training."""
        test = self.texts.get("test", self.texts.get("valid"))
        if test is None:
            return None
        split = "test" if "test" in self.texts else "validation"
        scores = masked_scores(model, self.masked_text(test, vocab, truncate=True), context.device)
        metrics = {f"{split}_masked_loss": round(scores.loss, 5), f"{split}_masked_accuracy": round(scores.accuracy, 5),
                   "scored_on": split}
        return Outcome(metrics, [f"{split}: masked-token loss {scores.loss:.4f} nats, accuracy "
                                 f"{100 * scores.accuracy:.2f}% over {scores.tokens:,} masked tokens"])
