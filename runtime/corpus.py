"""Reading and checking text files: one sentence per line, source line i aligned with target line i.

Every problem is a one-line `UserError` naming the file (and line), raised before training starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from xspec.base.errors import UserError
from xspec.base.files import read_regular_file
from .batching import Batch, collate
from .data_order import WholeCorpusWindows
from .vocab import BOS, EOS, Tokenizer


def read_lines(path: Path) -> list[str]:
    """The file's lines, without line endings; invalid UTF-8 is reported with its line number.
    Only regular files are read (`read_regular_file`)."""
    data = read_regular_file(Path(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise UserError(f"{path}:{line}: invalid UTF-8 (byte 0x{data[error.start]:02x} at column {column})") from None
    return text.removesuffix("\n").split("\n") if text else []


@dataclass
class ParallelText:
    """Aligned sentence pairs, with what was dropped on the way (reported to the user)."""

    source: list[str]
    target: list[str]
    line_numbers: list[int]            # 1-based line of each kept pair in the original files
    source_path: Path
    empty_skipped: int = 0


def read_parallel(src_path: Path, tgt_path: Path) -> ParallelText:
    source, target = read_lines(src_path), read_lines(tgt_path)
    if len(source) != len(target):
        raise UserError(f"{src_path} has {len(source)} lines but {tgt_path} has {len(target)}: "
                        "source and target files must be aligned line by line")
    kept = [i for i, (s, t) in enumerate(zip(source, target)) if s.strip() and t.strip()]
    if not kept:
        raise UserError(f"{src_path}: no sentence pairs (every line is empty on one side or the other)")
    return ParallelText([source[i].strip() for i in kept], [target[i].strip() for i in kept],
                        [i + 1 for i in kept], Path(src_path), empty_skipped=len(source) - len(kept))


@dataclass
class EncodedPairs(WholeCorpusWindows):
    """Token ids ready for batching: the source ends with EOS; the target without BOS/EOS."""

    source: list[list[int]]
    target: list[list[int]]
    empty_skipped: int = 0
    too_long: int = 0                  # skipped, or truncated when `truncate`
    truncated: bool = False
    start: int = BOS                   # the token a target starts from (an import's decoder start token)
    end: int = EOS                     # the token both sides end with (an import's own)

    def __len__(self) -> int:
        return len(self.source)

    # What batching reads of any task's examples (see `Examples` in runtime/tasks).
    @property
    def src_lens(self) -> list[int]:
        return [len(s) for s in self.source]

    @property
    def tgt_lens(self) -> list[int]:
        return [len(t) for t in self.target]

    def collate(self, indices: list[int]) -> Batch:
        return collate(indices, self.source, self.target, self.start, self.end)

    def summary(self, name: str) -> str:
        parts = [f"{name}: {len(self)} sentence pairs"]
        if self.empty_skipped:
            parts.append(f"{self.empty_skipped} with an empty side skipped")
        if self.too_long:
            parts.append(f"{self.too_long} too long {'truncated' if self.truncated else 'skipped'}")
        return ", ".join(parts)


def encode_pairs(text: ParallelText, vocab: Tokenizer, max_tokens: int, truncate: bool,
                 start: int = BOS, language: int | None = None, source_language: int | None = None) -> EncodedPairs:
    """`max_tokens` bounds the model's sequences: the source as the tokenizer frames a text (xspec's: + EOS),
    and the target's labels so framed (+ EOS) after the token it starts from. An imported checkpoint's targets
    start from `start` and are framed with the target `language`'s code where its tokenizer frames a text with
    one (NLLB's before it; mBART's after the end token, which its decoder input then starts from, as
    transformers' shift_tokens_right moves it); sources in `source_language`'s where given. A text too long
    keeps its framing when truncated."""
    codes = _check_framing(vocab, language)
    after = len(vocab.framing()[1])
    sources = vocab.encode_sources(text.source, source_language)
    labels = vocab.encode_targets(text.target, language)
    end = labels[0][-1] if labels else vocab.document_end    # the framing's last token, the same for every text
    if codes == "after":
        start = end
    out = EncodedPairs([], [], empty_skipped=text.empty_skipped, truncated=truncate, start=start, end=end)
    for src, tgt in zip(sources, labels):
        if len(src) > max_tokens or len(tgt) > max_tokens:
            out.too_long += 1
            if not truncate:
                continue
            src, tgt = (truncated(ids, max_tokens, after) for ids in (src, tgt))
        out.source.append(src)
        out.target.append(tgt[:-1])
    return out


def _check_framing(vocab: Tokenizer, language: int | None) -> str | None:
    """Where the tokenizer frames a text with a language code ("before" it, NLLB's; "after" its end token,
    mBART's), or None: such a framing takes the targets' own code, which `language` gives (--tgt-lang)."""
    before, after = vocab.framing()
    special = {vocab.bos_id, *vocab.eos_ids, vocab.document_end}
    where = "after" if any(i not in special for i in after) else "before" \
        if any(i not in special for i in before) else None
    if where is not None and language is None:
        example = "NLLB's starts it with one" if where == "before" else "mBART's ends it with one"
        raise UserError(f"training on sentence pairs: the checkpoint's tokenizer frames a text with a language code "
                        f"({example}), which a target takes in its own language: give it with --tgt-lang CODE")
    return where


def encode_source(lines: list[str], vocab: Tokenizer, max_tokens: int, language: int | None = None
                  ) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """Sentences to translate, each framed as the tokenizer frames a text (xspec's: + EOS; an import's own, in
    `language`'s code where given), and the (index, tokens) of each one longer than `max_tokens`, which is
    truncated, its framing kept (a translation per input line is promised)."""
    encoded = vocab.encode_sources(lines, language)
    too_long = [(i, len(ids)) for i, ids in enumerate(encoded) if len(ids) > max_tokens]
    after = len(vocab.framing()[1]) if too_long else 0
    return [truncated(ids, max_tokens, after) for ids in encoded], too_long


@dataclass
class Framed:
    """Encoded texts an encoder alone reads (framed as the tokenizer frames a text) of at most a size: those
    kept, their places among those given, the place and length of each that was longer, and how many held
    special tokens alone."""

    texts: list[list[int]]
    indices: list[int]
    longer: list[tuple[int, int]] = field(default_factory=list)
    empty: int = 0

    @property
    def too_long(self) -> int:
        return len(self.longer)


def framed(encoded: list[list[int]], size: int, truncate: bool, after: int, special: frozenset[int]) -> Framed:
    """The texts of at most `size` tokens (a longer one truncated, the `after` ids that close its framing kept,
    where `truncate`; else left out) and not of `special` tokens alone."""
    out = Framed([], [])
    for index, ids in enumerate(encoded):
        if all(token in special for token in ids):
            out.empty += 1
            continue
        if len(ids) > size:
            out.longer.append((index, len(ids)))
            if not truncate:
                continue
            ids = truncated(ids, size, after)
        out.texts.append(ids)
        out.indices.append(index)
    return out


def truncated(ids: list[int], max_tokens: int, after: int) -> list[int]:
    """A framed text of at most `max_tokens` ids: its text cut, the `after` ids that close the framing kept."""
    return ids if len(ids) <= max_tokens else ids[:max_tokens - after] + ids[len(ids) - after:]
