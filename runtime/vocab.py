"""The shared source/target sentencepiece vocabulary (§5.1: byte-pair encoding, one vocabulary for both sides)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from xspec.errors import UserError

PAD, UNK, BOS, EOS = 0, 1, 2, 3
MODEL_FILE = "sentencepiece.model"


class Vocab:
    """Text <-> token ids. The ids of PAD/UNK/BOS/EOS are fixed so every run agrees on them."""

    def __init__(self, model_proto: bytes) -> None:
        self.model_proto = model_proto
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, lines: list[str]) -> list[list[int]]:
        return self.sp.encode(lines)

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode([i for i in ids if i > EOS])

    @classmethod
    def load(cls, path: Path) -> "Vocab":
        try:
            return cls(path.read_bytes())
        except OSError as error:
            raise UserError(f"{path}: cannot read the sentencepiece model: {error.strerror}") from None
        except RuntimeError as error:
            raise UserError(f"{path}: not a sentencepiece model ({error})") from None


def train_vocab(sentences: Iterable[str], size: int, model_type: str, out_dir: Path) -> Vocab:
    """Trains on the training corpus (both sides) and writes `out_dir/sentencepiece.model`.

    `hard_vocab_limit=False`: a corpus too small for `size` pieces (the demo task with the paper's
    37000) gets the largest vocabulary it supports instead of an error.
    """
    prefix = out_dir / MODEL_FILE.removesuffix(".model")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_prefix=str(prefix), vocab_size=size, model_type=model_type,
        pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS, hard_vocab_limit=False,
        character_coverage=1.0, input_sentence_size=2_000_000, shuffle_input_sentence=True,
        num_threads=2, minloglevel=2,
    )
    return Vocab.load(out_dir / MODEL_FILE)


def load_or_train_vocab(run_dir: Path, sentences: Iterable[str], size: int, model_type: str) -> Vocab:
    """Reuses the run directory's vocabulary when there is one (resume, or a re-run into the same --out)."""
    cached = run_dir / MODEL_FILE
    return Vocab.load(cached) if cached.exists() else train_vocab(sentences, size, model_type, run_dir)
