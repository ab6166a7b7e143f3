"""A run's splits given as prepared directories: opened and checked, their vocabulary, their examples.

The training split is read as it is needed (examples.py). A validation or test split is small: it is
decoded back into text and read like a text file, so that validation BLEU, test BLEU and perplexity
work on it as on files (the text is the tokens' decoding, i.e. after the vocabulary's normalisation).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

from xspec.base.errors import UserError
from xspec.base.text import shown
from .examples import Mixture, PreparedPairs, PreparedText
from .format import MANIFEST, VOCAB_FILE, PreparedDir, open_prepared
from ..run_dir import PreparedSplit
from ..vocab import Vocab

MAX_DECODED_EXAMPLES = 1_000_000    # a validation or test split is decoded into memory


def open_split(split: PreparedSplit, kind: str, option: str) -> list[PreparedDir]:
    """Each directory of `split`, checked (sizes, hashes, boundaries, ids), of the task's kind."""
    opened = [open_prepared(d) for d in split.dirs]
    for prepared in opened:
        if prepared.kind != kind:
            what = "a language model's text" if prepared.kind == "text" else "a translation corpus (sentence pairs)"
            raise UserError(f"{option} {shown(prepared.path)}: {what}, but the model is a "
                            f"{'language model' if kind == 'text' else 'translation model'}")
    return opened


def shared_vocabulary(opened: dict[str, list[PreparedDir]]) -> Optional[tuple[Path, bytes]]:
    """The one vocabulary of every prepared directory of the run (path, sentencepiece model); None when none
    is prepared. Directories prepared with different vocabularies cannot be trained together."""
    first: Optional[PreparedDir] = None
    for dirs in opened.values():
        for prepared in dirs:
            if first is None:
                first = prepared
            elif prepared.manifest.vocabulary.sha256 != first.manifest.vocabulary.sha256:
                raise UserError(f"{shown(prepared.path / MANIFEST)}: prepared with another vocabulary than "
                                f"{shown(first.path)} (their sentencepiece models differ); prepare them with the same "
                                "--vocab")
    return None if first is None else (first.path / VOCAB_FILE, first.vocab_proto)


def check_run_vocabulary(opened: dict[str, list[PreparedDir]], vocab: Vocab, where: str) -> None:
    """The run's vocabulary is the one every prepared directory's ids mean."""
    digest = hashlib.sha256(vocab.model_proto).hexdigest()
    for dirs in opened.values():
        for prepared in dirs:
            if prepared.manifest.vocabulary.sha256 != digest:
                raise UserError(f"{shown(prepared.path / MANIFEST)}: prepared with another vocabulary than the run's "
                                f"({where}): its token ids would mean other pieces")


def train_text(dirs: list[PreparedDir], weights: tuple[float, ...], mode: str, size: int, truncate: bool):
    parts = [PreparedText(d, mode, size, truncate) for d in dirs]
    return parts[0] if len(parts) == 1 else Mixture(list(zip(parts, weights)))


def train_pairs(dirs: list[PreparedDir], weights: tuple[float, ...], max_tokens: int, truncate: bool):
    parts = [PreparedPairs(d, max_tokens, truncate) for d in dirs]
    return parts[0] if len(parts) == 1 else Mixture(list(zip(parts, weights)))


def decoded_documents(dirs: list[PreparedDir]) -> list[str]:
    """The documents of prepared text, decoded (a validation or test split)."""
    lines = []
    for prepared in _bounded(dirs):
        vocab, stream, offsets = Vocab.from_bytes(prepared.vocab_proto, shown(prepared.path / VOCAB_FILE)), \
            prepared.streams["tokens"], prepared.offsets["documents"]
        for k in range(prepared.manifest.examples):
            lines.append(vocab.decode(stream.read(int(offsets[k]) + 1, int(offsets[k + 1])).tolist()))
    return lines


def decoded_pairs(dirs: list[PreparedDir]) -> tuple[list[str], list[str]]:
    """The sentence pairs of a prepared translation corpus, decoded (a validation or test split)."""
    sources: list[str] = []
    targets: list[str] = []
    for prepared in _bounded(dirs):
        vocab = Vocab.from_bytes(prepared.vocab_proto, shown(prepared.path / VOCAB_FILE))
        for side, out in (("source", sources), ("target", targets)):
            stream, offsets = prepared.streams[side], prepared.offsets[side]
            for k in range(prepared.manifest.examples):
                out.append(vocab.decode(stream.read(int(offsets[k]), int(offsets[k + 1])).tolist()))
    return sources, targets


def _bounded(dirs: list[PreparedDir]) -> list[PreparedDir]:
    total = sum(d.manifest.examples for d in dirs)
    if total > MAX_DECODED_EXAMPLES:
        raise UserError(f"{shown(dirs[0].path)}: {total:,} examples for a validation or test split, which is read into "
                        f"memory; at most {MAX_DECODED_EXAMPLES:,}")
    return dirs
