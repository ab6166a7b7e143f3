"""The shared source/target sentencepiece vocabulary (§5.1: byte-pair encoding, one vocabulary for both sides)."""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import sentencepiece as spm

from xspec.base.errors import UserError
from xspec.base.text import printable
from xspec.base.files import read_regular_file, write_bytes_atomically

PAD, UNK, BOS, EOS = 0, 1, 2, 3
MASK_PIECE = "<mask>"            # the piece a masked language model's vocabulary adds (one, wherever it stands)
MODEL_FILE = "sentencepiece.model"
SPACE = "\u2581"                 # sentencepiece's mark for the space before a word


@dataclass(frozen=True)
class TargetLanguage:
    """How a multilingual translation model is asked for a target language: text before each source
    (Marian's `>>fr<< `), or the output's first token (mBART-50's `fr_XX`, M2M100's `__fr__`)."""

    prefix: str = ""
    forced_bos: int | None = None


@dataclass(frozen=True)
class PairTemplate:
    """How a tokenizer frames a pair of texts as one sequence (transformers' text and text_pair): the special
    ids before the first text, between the two and after the second, each with its token type, and each
    text's type. BERT's: [CLS] a [SEP] b [SEP], of types 0 up to the first [SEP], then 1; RoBERTa's:
    <s> a </s></s> b </s>, all of type 0; xspec's own vocabulary: a EOS b EOS, of types 0, then 1."""

    before: tuple[tuple[int, int], ...]     # (id, token type) of each
    between: tuple[tuple[int, int], ...]
    after: tuple[tuple[int, int], ...]
    first_type: int
    second_type: int

    @property
    def specials(self) -> int:
        return len(self.before) + len(self.between) + len(self.after)

    @property
    def types(self) -> int:
        """How many token types the pairs it frames need: one more than the highest."""
        return 1 + max(t for _, t in (*self.before, *self.between, *self.after,
                                      (0, self.first_type), (0, self.second_type)))

    def frame(self, first: list[int], second: list[int], size: int) -> tuple[list[int], list[int]]:
        """The pair's ids and token types, in at most `size` positions: where the texts do not fit, the
        longer is cut at its end until it fits or is as long as the other, then both, the longer (else the
        second) keeping the odd id (the tokenizers library's truncation="longest_first")."""
        room = max(size - self.specials, 0)
        if len(first) + len(second) > room:
            shorter, longer = sorted((len(first), len(second)))
            longer = max(shorter, room - shorter)
            if shorter + longer > room:
                shorter, longer = room // 2, room // 2 + room % 2
            kept_first, kept_second = (longer, shorter) if len(first) > len(second) else (shorter, longer)
            first, second = first[:kept_first], second[:kept_second]
        parts = [([i for i, _ in self.before], [t for _, t in self.before]),
                 (first, [self.first_type] * len(first)),
                 ([i for i, _ in self.between], [t for _, t in self.between]),
                 (second, [self.second_type] * len(second)),
                 ([i for i, _ in self.after], [t for _, t in self.after])]
        return [i for ids, _ in parts for i in ids], [t for _, types in parts for t in types]


class Tokenizer(Protocol):
    """Text <-> token ids as the runtime reads them: xspec's own `Vocab`, or an imported checkpoint's
    tokenizer (runtime/tokenizer.py), each with its own ids for where a document starts and ends."""

    @property
    def document_start(self) -> int: ...

    @property
    def document_end(self) -> int: ...

    @property
    def end_tokens(self) -> tuple[int, ...]:
        """Every token a continuation ends at, `document_end` first."""
        ...

    @property
    def never_generated(self) -> tuple[int, ...]: ...

    @property
    def kind(self) -> str:
        """What `model_proto` holds: "xspec" (xspec's own sentencepiece vocabulary, its special ids fixed),
        an import's "sentencepiece", "tokenizers" or "marian" files, or "none" (an import without one)."""
        ...

    @property
    def model_proto(self) -> bytes: ...

    @property
    def bos_id(self) -> int | None:
        """The id the tokenizer starts a text with, where it adds one."""
        ...

    @property
    def eos_ids(self) -> list[int]:
        """The end ids a checkpoint's config names (config.json's eos_token_id)."""
        ...

    @property
    def hf_files(self) -> dict[str, dict]:
        """The JSON files of an imported checkpoint's tokenizer, kept for export: file name -> its object."""
        ...

    def describe(self) -> dict | None:
        """What a checkpoint records to rebuild the tokenizer beside its file; None: xspec's own needs none."""
        ...

    def __len__(self) -> int: ...

    @property
    def target_size(self) -> int:
        """The bound of a translation's output ids: `len`, or a target vocabulary's of its own (Marian's)."""
        ...

    def encode(self, lines: list[str]) -> list[list[int]]: ...

    def decode(self, ids: list[int], skip_special: bool = True) -> str: ...

    def encode_prompts(self, lines: list[str]) -> list[list[int]]:
        """Each prompt's ids as the model reads a text to continue."""
        ...

    def encode_sources(self, lines: list[str], language: int | None = None) -> list[list[int]]:
        """Each sentence's ids as a translation model's encoder reads it, ending with `document_end`; framed
        with the `language` code where the tokenizer frames a text with one."""
        ...

    def language_code(self, code: str, flag: str = "--src-lang") -> int:
        """The id of a multilingual tokenizer's language code `code`; `flag` names it in the refusal."""
        ...

    def encode_targets(self, lines: list[str], language: int | None = None) -> list[list[int]]:
        """Each target sentence of a training pair, ending with `document_end`; framed with the `language`
        code where the tokenizer frames a text with one."""
        ...

    def framing(self) -> tuple[list[int], list[int]]:
        """The ids the tokenizer puts before and after a text's own, as encode_sources places them."""
        ...

    def target_language(self, code: str) -> "TargetLanguage":
        """How a source asks for target language `code`; a tokenizer that names no target languages refuses."""
        ...

    def pair_template(self) -> PairTemplate:
        """How it frames a pair of texts (a sentence pair classifier's); a tokenizer that frames none refuses."""
        ...

    def encode_chat(self, lines: list[str], system: str | None = None) -> list[list[int]]:
        """Each line a user's message in the tokenizer's chat template."""
        ...

    def mask(self) -> tuple[str, int]:
        """The token a masked language model fills, and its id (refused where the tokenizer has none)."""
        ...

    def special_token_ids(self) -> frozenset[int]:
        """The ids of special tokens (a text's framing, padding), which masking for training never picks."""
        ...


class Vocab:
    """Text <-> token ids. The ids of PAD/UNK/BOS/EOS are fixed so every run agrees on them.

    A document is read as `document_start`, its tokens, `document_end`; generation stops at `document_end`
    and never produces `never_generated`. (An imported checkpoint's own tokenizer, runtime/tokenizer.py,
    has its own ids for these.)"""

    document_start = EOS
    document_end = EOS
    end_tokens = (EOS,)
    never_generated = (PAD, BOS)
    kind = "xspec"
    bos_id = None  # a text starts as a document does, at EOS
    eos_ids = [EOS]
    hf_files: dict[str, dict] = {}

    def __init__(self, model_proto: bytes) -> None:
        self.model_proto = model_proto
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        found = self.sp.piece_to_id(MASK_PIECE)     # UNK where the vocabulary has no such piece
        self.mask_id = found if found != UNK else None

    def describe(self) -> dict | None:
        return None

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    @property
    def target_size(self) -> int:
        return len(self)

    def encode(self, lines: list[str]) -> list[list[int]]:
        """Each line's pieces; a masked language model's <mask> stands for a word with the space before it,
        the text on either side encoded as a text of its own (as transformers' tokenizers strip a mask's
        space: sentencepiece alone would give the space a piece of its own)."""
        if self.mask_id is None or not any(MASK_PIECE in line for line in lines):
            return self.sp.encode(lines)
        return [self._masked(line) if MASK_PIECE in line else ids for line, ids in zip(lines, self.sp.encode(lines))]

    def _masked(self, line: str) -> list[int]:
        assert self.mask_id is not None
        parts = self.sp.encode(line.split(MASK_PIECE))
        return [*parts[0], *(i for part in parts[1:] for i in (self.mask_id, *part))]

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        """The text of `ids`; special ids (whatever `skip_special` says: they have no text), and ids of
        embedding rows beyond the vocabulary (a model whose embedding is larger than its vocabulary can still
        sample them), are left out."""
        pieces = len(self)
        return self.sp.decode([i for i in ids if EOS < i < pieces])

    def encode_sources(self, lines: list[str], language: int | None = None) -> list[list[int]]:
        return [[*ids, EOS] for ids in self.encode(lines)]     # xspec's vocabulary names no languages

    def language_code(self, code: str, flag: str = "--src-lang") -> int:
        raise UserError(f"{flag} {printable(code)}: xspec's vocabulary names no languages by code (a multilingual "
                        "checkpoint's tokenizer.json does: mBART's, NLLB's)")

    def encode_targets(self, lines: list[str], language: int | None = None) -> list[list[int]]:
        return self.encode_sources(lines)     # xspec's vocabulary names no languages

    def framing(self) -> tuple[list[int], list[int]]:
        return [], [EOS]

    def target_language(self, code: str) -> "TargetLanguage":
        raise UserError(f"--tgt-lang {printable(code)}: xspec's vocabulary names no target languages (a "
                        "translation model trained by xspec translates into its training data's target language)")

    def pair_template(self) -> PairTemplate:
        """Each text ends with EOS, as a text alone does; the second is of the second type."""
        return PairTemplate(before=(), between=((EOS, 0),), after=((EOS, 1),), first_type=0, second_type=1)

    def encode_prompts(self, lines: list[str]) -> list[list[int]]:
        """A prompt continues a document: its start, then the text's tokens."""
        return [[self.document_start, *ids] for ids in self.encode(lines)]

    def encode_chat(self, lines: list[str], system: str | None = None) -> list[list[int]]:
        raise UserError("--chat: the model's vocabulary is xspec's own, which has no chat template (an imported "
                        "checkpoint's tokenizer brings its template)")

    def mask(self) -> tuple[str, int]:
        if self.mask_id is None:
            raise UserError(f"xspec's vocabulary of this run has no {MASK_PIECE} piece: only a masked language "
                            "model's run trains its vocabulary with one")
        return MASK_PIECE, self.mask_id

    def special_token_ids(self) -> frozenset[int]:
        return frozenset({PAD, BOS, EOS})

    @classmethod
    def from_bytes(cls, model_proto: bytes, origin: str) -> "Vocab":
        """A vocabulary read from somewhere untrusted; `origin` names it in the error."""
        if not model_proto:
            raise UserError(f"{origin}: not a sentencepiece model (empty)")
        try:
            vocab = cls(model_proto)
        except RuntimeError as error:        # sentencepiece's only error for a model it cannot parse
            raise UserError(f"{origin}: not a sentencepiece model ({str(error).splitlines()[0]})") from None
        special = (vocab.sp.pad_id(), vocab.sp.unk_id(), vocab.sp.bos_id(), vocab.sp.eos_id())
        if special != (PAD, UNK, BOS, EOS):
            raise UserError(f"{origin}: a sentencepiece model with other special ids (pad, unk, bos, eos = "
                            f"{special}) than xspec's {(PAD, UNK, BOS, EOS)}")
        return vocab

    @classmethod
    def load(cls, path: Path) -> "Vocab":
        return cls.from_bytes(read_regular_file(path), str(path))


def train_vocab(sentences: Iterable[str], size: int, model_type: str, out_dir: Path,
                symbols: Sequence[str] = (), setting: str = "data.vocab_size", mask: bool = False) -> Vocab:
    """Trains on the training corpus (both sides) and writes `out_dir/sentencepiece.model` atomically.

    `hard_vocab_limit=False`: a corpus too small for `size` pieces (the demo task with the paper's
    37000) gets the largest vocabulary it supports instead of an error.
    `symbols`: words that are always one piece each, wherever they stand between spaces (a treebank's
    `(NP`, which sentencepiece would otherwise cut where the script changes, into `▁(` and `NP`).
    `setting`: what the user set `size` with, for the error when it is too small.
    `mask`: a masked language model's, with MASK_PIECE (id 4), which a text may hold.
    """
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, vocab_size=size, model_type=model_type,
            pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS, hard_vocab_limit=False,
            character_coverage=1.0, input_sentence_size=2_000_000, shuffle_input_sentence=True,
            # With the word-initial space marker, so that " (NP" is one piece, not "▁" and "(NP".
            user_defined_symbols=[*([MASK_PIECE] if mask else []), *(SPACE + symbol for symbol in symbols)],
            num_threads=2, minloglevel=2,
        )
    except RuntimeError as error:
        # character_coverage=1.0 makes every character of the text a piece: a smaller size cannot be met.
        needed = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(error))
        if needed is None:
            raise
        raise UserError(f"{setting} {size}: too few pieces for the training text, whose characters and the "
                        f"special pieces need {needed.group(1)}; ask for at least that many") from None
    write_bytes_atomically(out_dir / MODEL_FILE, model.getvalue())
    return Vocab(model.getvalue())


def load_or_train_vocab(run_dir: Path, sentences: Iterable[str], size: int, model_type: str,
                        mask: bool = False) -> Vocab:
    """Reuses the run directory's vocabulary when there is one (resume, or a re-run into the same --out)."""
    cached = run_dir / MODEL_FILE
    return Vocab.load(cached) if cached.exists() else train_vocab(sentences, size, model_type, run_dir, mask=mask)
