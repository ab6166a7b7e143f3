"""An imported checkpoint's own tokenizer: tokenizer.json through the `tokenizers` library, or a sentencepiece
tokenizer.model. Both are data (JSON, a protobuf), never code. A prompt is encoded as the checkpoint's
tokenizer encodes a text, or, with `--chat`, as its chat template (runtime/chat.py) renders a conversation.
`xspec import` finds it in a checkpoint directory (xspec/hf/tokenizer.py); a checkpoint keeps its
description and file, and loading one makes it again here.

A tokenizer is untrusted like the rest of a checkpoint, and it does work: its normalizer, pre-tokenizer and
decoder may hold regular expressions, which a backtracking engine can spend minutes on over one long line,
and the `tokenizers` library panics (a pyo3 PanicException, which is a BaseException) when one passes its
engine's retry limit. So, wherever one is made (at import, and again when a checkpoint is loaded), it is
probed on long runs of each kind of character and refused when its time grows faster than the text
(`_Probe`). Every call into the library then runs in a worker thread with a time budget, which both
libraries allow by releasing the GIL while they work: a line that still stalls it is an error naming the
line, never a hang (the thread is left to finish or to end with the process). Whatever the library raises,
a panic included, is an error naming the file.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import queue
import re
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from functools import partial
from typing import BinaryIO, Callable, Iterator, TypeVar

from xspec.base.errors import UserError
from xspec.base.strict_json import parse_json
from xspec.base.text import printable
from .chat import chat_template
from .vocab import PairTemplate, TargetLanguage

TOKENIZER_JSON = "tokenizer.json"
SENTENCEPIECE = "tokenizer.model"
KINDS = {TOKENIZER_JSON: "tokenizers", SENTENCEPIECE: "sentencepiece"}
# MarianTokenizer's three files, which a checkpoint keeps as one (`_Marian`): its ids are vocab.json's.
MARIAN = "marian"
MARIAN_FILES = ("source.spm", "target.spm", "vocab.json")
MARIAN_TARGET_VOCAB = "target_vocab.json"      # a target vocabulary of its own (separate_vocabs), where kept
# M2M100Tokenizer's two files, kept as one with its settings (`_M2M100`): ids are vocab.json's, then its languages'.
M2M100 = "m2m100"
M2M100_FILES = ("sentencepiece.bpe.model", "vocab.json")
M2M100_KEPT = (*M2M100_FILES, "language_codes", "source_language", "special", "madeup_words")
FILES = {**{kind: name for name, kind in KINDS.items()}, MARIAN: "vocab.json", M2M100: "vocab.json"}
NONE = "none"               # a checkpoint directory without a tokenizer: the model runs on token ids alone
DESCRIPTION = ("kind", "bos_id", "eos_ids", "add_bos", "add_eos")  # what a checkpoint keeps of a tokenizer
# The checkpoint directory's own files an import keeps beside its tokenizer (`hf_files`), as JSON objects,
# for `xspec export --format hf` to write back: the same config keys, special tokens and generation settings.
TOKENIZER_CONFIG = "tokenizer_config.json"
HF_FILES = ("config.json", TOKENIZER_CONFIG, "special_tokens_map.json", "generation_config.json")

# Time budgets. Tokenizers built as Llama 2's and 3's, Qwen2's, GPT-2's, BERT's and T5's encode a 1 MiB
# line (xspec's longest) of the worst kind for each in 0.6 to 4 s on one core of the 2-core development
# machine; a call gets five times that and never less than two seconds: only a stalled tokenizer runs out.
BUDGET_BASE_S = 2.0
BUDGET_PER_CHARACTER_S = 20e-6
BUDGET_PER_TOKEN_S = 1e-3           # decoding
READ_TIMEOUT_S = 60.0               # making one from its file (64 MiB at most; 2 MB: 0.05 s)
CHUNK_CHARACTERS = 1 << 20          # lines encoded in one call: at most this much text ...
CHUNK_LINES = 4096                  # ... and this many lines

# The probe: each kind of character in a run of PROBE_SHORT and of PROBE_LONG characters. Four times the
# text takes four times as long where the work is linear, sixteen times where it is quadratic.
PROBE_TEXTS = (("letters", "a"), ("digits", "7"), ("spaces", " "), ("punctuation marks", "!"),
               ("line breaks", "\n"), ("mixed characters", "a1 !\n"), ("non-ASCII characters", "é中🙂"),
               ("combining accents", "\u0301"))
PROBE_SHORT, PROBE_LONG = 1_000, 4_000
PROBE_GROWTH = 8.0                  # refused at this ratio of times (thread CPU time, least of three tries) ...
PROBE_FLOOR_S = 0.01                # ... once the long run takes this long: below it, times are noise
PROBE_TIMEOUT_S = 2.0               # any one step of the probe
PROBE_TOKEN_S = 0.05                # decoding the vocabulary's longest token alone


class TokenizingError(UserError):
    """A line the tokenizer could not encode, in its time budget or at all. `index` is the line's place in
    the list given to `encode`; `at("prompts.txt:12")` names it as its file and line number instead."""

    def __init__(self, origin: str, index: int, line: str, problem: str) -> None:
        self.origin, self.index, self.problem = origin, index, problem
        super().__init__(f"{origin}: {problem}: line {index + 1} of the text given, {_preview(line)}")

    def at(self, place: str) -> UserError:
        return UserError(f"{place}: {self.origin}: {self.problem}")


def _preview(line: str, length: int = 30) -> str:
    return f'"{printable(line[:length])}{"..." if len(line) > length else ""}"'


class CheckpointTokenizer:
    """Text <-> ids as the checkpoint's model was trained with; `bos_id`/`eos_id` from its config (None
    where it has none), `eos_ids` every id a continuation ends at (config.json's and generation_config.json's).
    The interface of runtime/vocab.py's Vocab: encode, encode_prompts, decode, len, model_proto. `origin`
    names it in errors (`DIR/tokenizer.json`, or a checkpoint's `...: its tokenizer.json`).

    A prompt is encoded as the checkpoint's own tokenizer encodes text (`encode_prompts`): tokenizer.json's
    post-processor adds what it adds (Llama 3's BOS; nothing for Qwen's), and a sentencepiece tokenizer.model
    adds BOS and EOS as tokenizer_config.json's add_bos_token and add_eos_token say (LlamaTokenizer's
    defaults: BOS, no EOS)."""

    def __init__(self, kind: str, data: bytes, bos_id: int | None, eos_ids: list[int], origin: str,
                 add_bos: bool = True, add_eos: bool = False, hf_files: dict[str, dict] | None = None,
                 settings_origin: str = "tokenizer_config.json") -> None:
        self.kind, self.model_proto, self.bos_id, self.eos_ids = kind, data, bos_id, eos_ids
        self.add_bos, self.add_eos = add_bos, add_eos
        self.hf_files = hf_files or {}      # HF_FILES the checkpoint directory had, kept for export
        self._origin = origin
        # tokenizer_config.json's chat template (`settings_origin` names the file), compiled and so checked now
        self.chat = chat_template(self.hf_files.get(TOKENIZER_CONFIG, {}), settings_origin)
        self._library: _Library | None = None
        if kind == "tokenizers":
            self._library = _Tokenizers(data, origin)
        elif kind == "sentencepiece":
            self._library = _Sentencepiece(data, origin)
        elif kind == MARIAN:
            self._library = _Marian(data, origin)
        elif kind == M2M100:
            self._library = _M2M100(data, origin)
        self._size = self._library.size if self._library is not None else 0
        self._framing: tuple[list[int], list[int]] | None = None     # framing(), found once
        if self._library is not None:
            _Probe(self._library, origin).run()

    def __len__(self) -> int:
        """The bound of the ids it produces (added tokens may leave gaps, so more than it has tokens)."""
        return self._size

    @property
    def target_size(self) -> int:
        """The bound of the ids a translation's output may hold: the target vocabulary's, where a checkpoint
        has one of its own (Marian's separate_vocabs), else `len`."""
        return self._library.target_size if isinstance(self._library, _Marian) else self._size

    @property
    def eos_id(self) -> int | None:
        return self.eos_ids[0] if self.eos_ids else None

    # As runtime/vocab.py's Vocab: a document is BOS (or, without one, EOS), its tokens, EOS.
    @property
    def document_start(self) -> int:
        start = self.bos_id if self.bos_id is not None else self.eos_id
        if start is None:
            raise UserError(f"{self._origin}: the checkpoint's config.json names neither bos_token_id nor "
                            "eos_token_id, so documents have no token to start from")
        return start

    @property
    def document_end(self) -> int:
        return self.eos_id if self.eos_id is not None else self.document_start

    @property
    def end_tokens(self) -> tuple[int, ...]:
        """Every token a continuation ends at, `document_end` first."""
        return tuple(dict.fromkeys([self.document_end, *self.eos_ids]))

    never_generated: tuple[int, ...] = ()

    def _needed(self) -> _Library:
        if self._library is None:
            raise UserError(f"{self._origin}: none (the checkpoint directory had no tokenizer.json, "
                            "tokenizer.model, vocab.txt, spiece.model or Marian's vocab.json): text cannot be turned "
                            "into token ids")
        return self._library

    def encode(self, lines: list[str]) -> list[list[int]]:
        """Each line's ids (no special tokens), a batch of lines to a call, each call within its time budget."""
        return self._encoded(lines, self._needed().encode)

    def encode_prompts(self, lines: list[str]) -> list[list[int]]:
        """Each line's ids as the checkpoint's tokenizer makes them of a text, special tokens included."""
        if self.kind == "tokenizers":
            library = self._needed()
            assert isinstance(library, _Tokenizers)
            return self._encoded(lines, library.encode_with_specials)
        start = [self.bos_id] if self.add_bos and self.bos_id is not None else []
        end = [self.eos_id] if self.add_eos and self.eos_id is not None else []
        return [[*start, *ids, *end] for ids in self.encode(lines)]

    def encode_sources(self, lines: list[str], language: int | None = None) -> list[list[int]]:
        """Each sentence as the checkpoint's tokenizer encodes a text: a tokenizer.json's post-processor's
        special tokens as it places them (BART's <s> and </s>; mBART's </s> and language code, that of
        `language` where given), M2M100Tokenizer's language code (its source language's, or `language`), pieces
        and </s>, else the text's pieces ending with the end token (Marian's </s>)."""
        if self.kind == "tokenizers":
            return self.encode_prompts(lines) if language is None else self._in_language(lines, language)
        library = self._library
        if isinstance(library, _M2M100):
            return self._encoded(lines, partial(library.framed, language=language))
        return [ids if ids[-1:] == [self.document_end] else [*ids, self.document_end]
                for ids in self.encode_prompts(lines)]

    def encode_targets(self, lines: list[str], language: int | None = None) -> list[list[int]]:
        """Each target sentence of a pair as the checkpoint's tokenizer encodes a text_target: as a source
        but for Marian's, whose target.spm splits it; framed with the target's `language` code in place of the
        source's where the tokenizer frames a text with one (NLLB's)."""
        library = self._library
        if isinstance(library, _Marian):
            return [[*ids, self.document_end] for ids in self._encoded(lines, library.encode_targets)]
        return self.encode_sources(lines, language)

    def _in_language(self, lines: list[str], language: int) -> list[list[int]]:
        """The lines framed as the tokenizer frames a text, with `language`'s code in place of its own."""
        before, after = self.framing()
        special = {self.bos_id, *self.eos_ids}
        before, after = ([i if i in special else language for i in ids] for ids in (before, after))
        return [[*before, *ids, *after] for ids in self.encode(lines)]

    def framing(self) -> tuple[list[int], list[int]]:
        """The ids the tokenizer puts before and after a text's own (BART's <s> and </s>, NLLB's language code
        and </s>), as encode_sources places them: found once, from a probe's encodings."""
        if self._framing is None:
            self._framing = self._probed_framing()
        return self._framing

    def _probed_framing(self) -> tuple[list[int], list[int]]:
        probe = "a"
        plain, framed = self.encode([probe])[0], self.encode_sources([probe])[0]
        for start in range(len(framed) - len(plain) + 1):
            if framed[start:start + len(plain)] == plain:
                return framed[:start], framed[start + len(plain):]
        raise UserError(f"{self._origin}: a text's framing cannot be told from its tokens (\"{probe}\" encodes "
                        "otherwise with the special tokens)")

    def pair_template(self) -> PairTemplate:
        """How tokenizer.json's post-processor frames a pair of texts (its pair template: BERT's [CLS] a [SEP] b
        [SEP], types 0 then 1; RoBERTa's <s> a </s></s> b </s>, all 0), told from its encoding of a probe pair:
        each text is then encoded alone, as the library encodes each of a pair, and framed so."""
        library = self._needed()
        if not isinstance(library, _Tokenizers):
            raise UserError(f"{self._origin}: a {self.kind} tokenizer has no template for a pair of texts (a "
                            "tokenizer.json's post-processor has one: BERT's [CLS] a [SEP] b [SEP])")
        probe = "a"
        try:
            ids, types, texts = bounded(lambda: library.encode_pair(probe, probe), _budget([probe, probe]))
        except (Overtime, CallFailed):
            raise UserError(f"{self._origin}: cannot encode a pair of texts (\"{probe}\", \"{probe}\")") from None
        # Before the first text, the first text, between, the second text, after: each id and its type.
        parts: list[list[tuple[int, int]]] = [[] for _ in range(5)]
        part = 0
        for token, kind, text in zip(ids, types, texts):
            place = part + part % 2 if text is None else 2 * text + 1   # a special token: after the text before it
            if place < part:
                part = len(parts)   # a text out of its order: no template of these five parts
                break
            part = place
            parts[part].append((token, kind))
        plain = self.encode([probe])[0]
        if part == len(parts) or any([i for i, _ in parts[p]] != plain or len({t for _, t in parts[p]}) != 1
                                     for p in (1, 3)):
            raise UserError(f"{self._origin}: a pair's framing cannot be told from its tokens (the pair \"{probe}\", "
                            f"\"{probe}\" is not framed as one text after the other)")
        before, first, between, second, after = parts
        return PairTemplate(tuple(before), tuple(between), tuple(after), first[0][1], second[0][1])

    def target_language(self, code: str) -> TargetLanguage:
        """Marian's multilingual models take the target language as a source's first piece (`>>fr<<`); those
        of a tokenizer.json (mBART-50, M2M100) as the output's first token, the code's own (`fr_XX`) or
        M2M100's spelling of it (`__fr__`)."""
        library, shown_code = self._library, printable(code)   # as typed: a terminal sees it escaped
        if isinstance(library, _Marian):
            codes = sorted(p[2:-2] for p in library.ids if p.startswith(">>") and p.endswith("<<"))
            if code not in codes:
                listed = ", ".join(codes[:30]) + (", ..." if len(codes) > 30 else "") if codes else "none"
                raise UserError(f"--tgt-lang {shown_code}: {self._origin} has no >>{shown_code}<< token (its "
                                f"target languages: {printable(listed)})")
            return TargetLanguage(prefix=f">>{code}<< ")
        if isinstance(library, (_Tokenizers, _M2M100)):
            return TargetLanguage(forced_bos=self.language_code(code, "--tgt-lang"))
        raise UserError(f"--tgt-lang {shown_code}: {self._origin} names no target languages (Marian's >>xx<< "
                        "tokens, or a tokenizer.json's language codes)")

    def language_code(self, code: str, flag: str = "--src-lang") -> int:
        """The id of a tokenizer.json's language code `code` (mBART-50's fr_XX, NLLB's fra_Latn), as given or as
        M2M100 spells it (__fr__); `flag` names it in the refusal."""
        library, shown_code = self._library, printable(code)
        if isinstance(library, _Tokenizers):
            for token in (code, f"__{code}__"):
                found = library.tokenizer.token_to_id(token)
                if found is not None:
                    return found
            raise UserError(f"{flag} {shown_code}: {self._origin} has no token {shown_code} or __{shown_code}__ (a "
                            "language code as the checkpoint's tokenizer spells it: fr_XX, __fr__, fra_Latn)")
        if isinstance(library, _M2M100):
            found = library.languages.get(code.removeprefix("__").removesuffix("__"))
            if found is not None:
                return found
            listed = ", ".join(library.languages)
            raise UserError(f"{flag} {shown_code}: {self._origin} has no language code {shown_code} (its languages: "
                            f"{printable(listed)})")
        raise UserError(f"{flag} {shown_code}: {self._origin} names no languages by code (a tokenizer.json's "
                        "language codes: mBART's, NLLB's)")

    def encode_chat(self, lines: list[str], system: str | None = None) -> list[list[int]]:
        """Each line a user's message (after `system`'s, if given), rendered by the chat template with the
        assistant's turn opened, then encoded as transformers' apply_chat_template encodes it: the template
        writes the special tokens, the tokenizer adds none."""
        if self.chat is None:
            raise UserError(f"{self._origin}: the checkpoint has no chat template (tokenizer_config.json's "
                            "chat_template, or chat_template.jinja), so --chat has no conversation format")
        start = [{"role": "system", "content": system}] if system is not None else []
        rendered = [self.chat.render([*start, {"role": "user", "content": line}]) for line in lines]
        return self._encoded(rendered, self._needed().encode)

    def _encoded(self, lines: list[str], encode: Callable[[list[str]], list[list[int]]]) -> list[list[int]]:
        encoded: list[list[int]] = []
        for start, chunk in _chunks(lines):
            try:
                encoded += bounded(lambda: encode(chunk), _budget(chunk))
            except (Overtime, CallFailed):     # which line it was: each alone, with a budget of its own
                encoded += [self._encode_line(encode, start + i, line) for i, line in enumerate(chunk)]
        return encoded

    def _encode_line(self, encode: Callable[[list[str]], list[list[int]]], index: int, line: str) -> list[int]:
        budget = _budget([line])
        try:
            return bounded(lambda: encode([line]), budget)[0]
        except Overtime:
            raise TokenizingError(self._origin, index, line, f"encoding a line of {len(line):,} characters took "
                                  f"more than {_seconds(budget)} (its normalizer or pre-tokenizer is too slow on "
                                  "it: a regular expression that backtracks?)") from None
        except CallFailed as failed:
            raise TokenizingError(self._origin, index, line, f"cannot encode a line of {len(line):,} characters "
                                  f"({failed.reason})") from None

    def mask(self) -> tuple[str, int]:
        """The token a masked language model fills and its id: tokenizer_config.json's mask_token (BERT's
        [MASK], RoBERTa's <mask>), else whichever of those two the tokenizer has."""
        named = self.hf_files.get(TOKENIZER_CONFIG, {}).get("mask_token")
        named = named.get("content") if isinstance(named, dict) else named
        candidates = [named] if isinstance(named, str) else ["[MASK]", "<mask>"]
        library = self._library
        if isinstance(library, _Tokenizers):
            for token in candidates:
                found = library.tokenizer.token_to_id(token)
                if found is not None:
                    return token, found
        raise UserError(f"{self._origin}: no mask token ({' or '.join(printable(c) for c in candidates)}) in the "
                        "tokenizer: a masked language model's tokenizer.json names one")

    def special_token_ids(self) -> frozenset[int]:
        """tokenizer.json's added tokens marked special ([CLS], [SEP], [PAD], [MASK], ...), else the start and
        end ids, as transformers' get_special_tokens_mask counts them."""
        library = self._library
        if isinstance(library, _Tokenizers):
            return frozenset(i for i, token in library.tokenizer.get_added_tokens_decoder().items() if token.special)
        if isinstance(library, _M2M100):
            return frozenset(library.special)
        return frozenset(i for i in (self.bos_id, *self.eos_ids) if i is not None)

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        """The text of `ids`, special tokens left out (`skip_special`, as transformers' skip_special_tokens)."""
        library = self._needed()
        if self.kind == "sentencepiece":
            specials = {self.bos_id, *self.eos_ids}
            ids = [i for i in ids if i not in specials]
        budget = BUDGET_BASE_S + BUDGET_PER_TOKEN_S * len(ids)
        try:
            if isinstance(library, _Tokenizers):
                return bounded(lambda: library.decode(list(ids), skip_special), budget)
            return bounded(lambda: library.decode(list(ids)), budget)
        except Overtime:
            raise UserError(f"{self._origin}: decoding {len(ids):,} token ids took more than {_seconds(budget)} (its "
                            "decoder is too slow on them)") from None
        except CallFailed as failed:
            raise UserError(f"{self._origin}: cannot decode {len(ids):,} token ids ({failed.reason})") from None

    def describe(self) -> dict:
        described = {"kind": self.kind, "bos_id": self.bos_id, "eos_ids": self.eos_ids, "add_bos": self.add_bos,
                     "add_eos": self.add_eos}
        return {**described, "hf_files": self.hf_files} if self.hf_files else described

    def special_ids(self) -> list[tuple[str, int]]:
        """(describe()'s key, id) of each special id: ("bos_id", 1), ("eos_ids[0]", 2), ..."""
        bos = [("bos_id", self.bos_id)] if self.bos_id is not None else []
        return bos + [(f"eos_ids[{i}]", eos) for i, eos in enumerate(self.eos_ids)]

    @classmethod
    def from_description(cls, description: str, data: bytes, where: str) -> "CheckpointTokenizer":
        """The tokenizer a checkpoint keeps (`where`: the checkpoint) from its description and file."""
        info = parse_json(description, f"{where}: metadata xspec.tokenizer")
        kinds = (*KINDS.values(), MARIAN, M2M100, NONE)
        # Checkpoints written before add_bos and add_eos were kept hold the three keys alone.
        keys = ({"kind", "bos_id", "eos_ids"}, set(DESCRIPTION), {*DESCRIPTION, "hf_files"})
        files = info.get("hf_files", {}) if isinstance(info, dict) else None
        if not (isinstance(info, dict) and info.keys() in keys
                and info["kind"] in kinds and (info["bos_id"] is None or type(info["bos_id"]) is int)
                and isinstance(info["eos_ids"], list) and all(type(i) is int for i in info["eos_ids"])
                and all(isinstance(info.get(flag, True), bool) for flag in ("add_bos", "add_eos"))
                and isinstance(files, dict) and all(name in HF_FILES and isinstance(value, dict)
                                                    for name, value in files.items())):
            raise UserError(f"{where}: not a checkpoint xspec wrote (metadata xspec.tokenizer: not a tokenizer "
                            "description)")
        kind = info["kind"]
        origin = f"{where}: its {FILES[kind]}" if kind in KINDS.values() else f"{where}: its tokenizer"
        return cls(kind, data, info["bos_id"], info["eos_ids"], origin, info.get("add_bos", True),
                   info.get("add_eos", False), files, f"{where}: its {TOKENIZER_CONFIG}")


def check_against_embedding(tokenizer: CheckpointTokenizer, rows: int, where: str) -> None:
    """A loaded checkpoint's tokenizer (`where`: the checkpoint) against its model, whose embedding has `rows`:
    every id the tokenizer produces must be a row, and every special id one of its tokens (or, without a
    tokenizer, a row)."""
    if tokenizer.kind != NONE and len(tokenizer) > rows:
        raise UserError(f"{where}: its {FILES[tokenizer.kind]} produces ids up to {len(tokenizer) - 1:,}, but the "
                        f"model's embedding has {rows:,} rows")
    bound = len(tokenizer) if tokenizer.kind != NONE else rows
    holder = f"its {FILES[tokenizer.kind]} has {bound:,} ids" if tokenizer.kind != NONE else \
        f"the model's embedding has {rows:,} rows"
    for key, value in tokenizer.special_ids():
        if not 0 <= value < bound:
            raise UserError(f"{where}: not a checkpoint xspec wrote (metadata xspec.tokenizer: {key} {value} is "
                            f"not a token id: {holder})")


# --- the libraries -----------------------------------------------------------------------------------

class _Tokenizers:
    """tokenizer.json through the `tokenizers` library (whose encode_batch and decode_batch release the GIL)."""

    def __init__(self, data: bytes, origin: str) -> None:
        value = parse_json(data, origin)     # UTF-8, JSON, no key given twice: one message for each
        if not isinstance(value, dict) or not isinstance(value.get("model"), dict):
            raise UserError(f"{origin}: not a tokenizers tokenizer (expected a JSON object with a \"model\" object)")
        from tokenizers import Tokenizer

        text = data.decode("utf-8")
        self.tokenizer = _read(lambda: Tokenizer.from_str(text), f"{origin}: not a tokenizers tokenizer")
        # Lengths are xspec's to handle (a long prompt keeps its last tokens), and padding would add ids to
        # every line of a batch: whatever the file sets for either is not applied.
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        vocabulary = self.tokenizer.get_vocab(with_added_tokens=True)
        # The ids' bound: added tokens may leave gaps, so their count can fall short of it.
        self.size = max(max(vocabulary.values(), default=-1) + 1, self.tokenizer.get_vocab_size(True))
        longest = max(vocabulary, key=len, default=None)
        self.longest = (longest, vocabulary[longest]) if longest is not None else None

    def encode(self, lines: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(lines, add_special_tokens=False)]

    def encode_with_specials(self, lines: list[str]) -> list[list[int]]:
        """As the checkpoint's tokenizer encodes a text: its post-processor's special tokens included."""
        return [e.ids for e in self.tokenizer.encode_batch(lines, add_special_tokens=True)]

    def encode_pair(self, first: str, second: str) -> tuple[list[int], list[int], list[int | None]]:
        """A pair's ids, token types and which text each id is of (0, 1; None: a special token), as the
        checkpoint's tokenizer encodes a text and its text_pair."""
        encoded = self.tokenizer.encode(first, second, add_special_tokens=True)
        return encoded.ids, encoded.type_ids, encoded.sequence_ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tokenizer.decode_batch([ids], skip_special_tokens=skip_special)[0]


class _Sentencepiece:
    """tokenizer.model through sentencepiece (which releases the GIL while it encodes and decodes)."""

    longest = None      # no decoder of its own to probe: pieces are joined

    def __init__(self, data: bytes, origin: str) -> None:
        import sentencepiece as spm

        if not data:        # SentencePieceProcessor(model_proto=b"") loads nothing, and fails only when used
            raise UserError(f"{origin}: not a sentencepiece tokenizer (an empty file)")
        self.processor = _read(lambda: spm.SentencePieceProcessor(model_proto=data),
                               f"{origin}: not a sentencepiece tokenizer")
        self.size = self.processor.get_piece_size()

    def encode(self, lines: list[str]) -> list[list[int]]:
        return self.processor.encode(lines)

    def decode(self, ids: list[int]) -> str:
        return self.processor.decode(ids)


class _Marian:
    """MarianTokenizer's files, kept as one JSON object (base64): source.spm and target.spm split a text into
    pieces, and vocab.json gives each piece its id (not the sentencepiece models' own ids); a piece it lacks is
    <unk>, and a leading language code (`>>de<<`) is one piece. Where the checkpoint has a target vocabulary of
    its own (separate_vocabs: target_vocab.json), a target's pieces take their ids there and an output is read
    through it and joined by target.spm; with one vocabulary for both sides, as MarianTokenizer does, the
    source model joins the pieces of an output, its special tokens (</s>, <unk>, <pad>) left out. Both models
    release the GIL while they work."""

    longest = None      # pieces are joined: no decoder of its own to probe

    def __init__(self, data: bytes, origin: str) -> None:
        import sentencepiece as spm

        files = parse_json(data, origin)
        if not (isinstance(files, dict) and files.keys() in (set(MARIAN_FILES), {*MARIAN_FILES, MARIAN_TARGET_VOCAB})
                and all(isinstance(v, str) for v in files.values())):
            raise UserError(f"{origin}: not Marian's tokenizer files ({', '.join(MARIAN_FILES)})")
        raw = {name: _base64(text, f"{origin}: {name}") for name, text in files.items()}
        self.source, self.target = (_processor(spm, raw[name], f"{origin}: {name}") for name in MARIAN_FILES[:2])
        self.ids: dict[str, int] = _vocab_json(raw["vocab.json"], origin)
        self.separate = MARIAN_TARGET_VOCAB in raw
        self.target_ids = _vocab_json(raw[MARIAN_TARGET_VOCAB], origin, MARIAN_TARGET_VOCAB) if self.separate \
            else self.ids
        if self.separate and self.ids.get("</s>") != self.target_ids.get("</s>"):
            raise UserError(f"{origin}: {MARIAN_TARGET_VOCAB} gives </s> another id than vocab.json does (both sides' "
                            "texts end with the one end token)")
        self.pieces = {index: piece for piece, index in self.target_ids.items()}
        self.special = {self.target_ids[token] for token in ("</s>", "<unk>", "<pad>") if token in self.target_ids}
        self.size = max(self.ids.values()) + 1
        self.target_size = max(self.target_ids.values()) + 1

    def encode(self, lines: list[str], target: bool = False) -> list[list[int]]:
        """Each line's ids; `target`: split by target.spm, as MarianTokenizer splits a text_target (and its ids
        from target_vocab.json, where the checkpoint has one)."""
        split = [_language_code(line) for line in lines]
        pieces = (self.target if target else self.source).encode([text for _, text in split], out_type=str)
        ids = self.target_ids if target else self.ids
        return [[ids.get(piece, ids["<unk>"]) for piece in [*code, *line]] for (code, _), line in zip(split, pieces)]

    def encode_targets(self, lines: list[str]) -> list[list[int]]:
        return self.encode(lines, target=True)

    def decode(self, ids: list[int]) -> str:
        pieces = [self.pieces[i] for i in ids if i not in self.special and i in self.pieces]
        joiner = self.target if self.separate else self.source
        return joiner.decode_pieces(pieces).replace("\u2581", " ").strip()


MAX_ID = 1 << 31


def _vocab_json(data: bytes, origin: str, name: str = "vocab.json") -> dict[str, int]:
    """A vocab.json of pieces and their ids, with the <unk> every piece it lacks becomes."""
    vocab = parse_json(data, f"{origin}: {name}")
    if not isinstance(vocab, dict) or not vocab:
        raise UserError(f"{origin}: {name} is not a JSON object of pieces and their ids")
    for piece, index in vocab.items():
        if type(index) is not int or not 0 <= index < MAX_ID:
            raise UserError(f"{origin}: {name}: the id of \"{printable(piece[:40])}\" is not an integer from 0 "
                            f"to {MAX_ID - 1:,}")
    if "<unk>" not in vocab:
        raise UserError(f"{origin}: {name} has no <unk>, which every piece it lacks becomes")
    return vocab


class _M2M100:
    """M2M100Tokenizer's files, kept as one JSON object: sentencepiece.bpe.model and vocab.json (base64), its
    language codes' list and source language, and the special tokens its settings list. sentencepiece splits a
    text into pieces and vocab.json gives each its id (<unk> where it lacks one); the language codes
    (`__de__`) take the ids after vocab.json's, in their list's order, and `num_madeup_words` ids after them are
    unknown tokens (fairseq's padding of the vocabulary); a special token in a text is one token.
    A source is its language's code, its ids, then </s>. Decoding leaves the special tokens out (language codes
    too where the settings list them, as the Hub's checkpoints do) and joins the pieces as sentencepiece does."""

    longest = None      # pieces are joined: no decoder of its own to probe

    def __init__(self, data: bytes, origin: str) -> None:
        import sentencepiece as spm

        kept = parse_json(data, origin)
        if not (isinstance(kept, dict) and kept.keys() == set(M2M100_KEPT)
                and all(isinstance(kept[name], str) for name in (*M2M100_FILES, "language_codes", "source_language"))
                and kept["language_codes"] in M2M100_LANGUAGES and isinstance(kept["special"], list)
                and all(isinstance(token, str) and token for token in kept["special"])
                and type(kept["madeup_words"]) is int and 0 <= kept["madeup_words"] <= MAX_MADEUP_WORDS):
            raise UserError(f"{origin}: not M2M100's tokenizer files ({', '.join(M2M100_FILES)}) and settings")
        raw = {name: _base64(kept[name], f"{origin}: {name}") for name in M2M100_FILES}
        self.processor = _processor(spm, raw[M2M100_FILES[0]], f"{origin}: {M2M100_FILES[0]}")
        vocab = _vocab_json(raw["vocab.json"], origin)
        if sorted(vocab.values()) != list(range(len(vocab))):
            raise UserError(f"{origin}: vocab.json: its ids are not 0 to {len(vocab) - 1:,} once each (M2M100's "
                            "language codes take the ids after them)")
        self.languages = {code: len(vocab) + i for i, code in enumerate(M2M100_LANGUAGES[kept["language_codes"]])}
        if kept["source_language"] not in self.languages:
            raise UserError(f"{origin}: src_lang \"{printable(kept['source_language'][:20])}\" is not one of its "
                            f"language codes ({kept['language_codes']}'s)")
        self.ids = {**vocab, **{f"__{code}__": index for code, index in self.languages.items()}}
        unknown = [token for token in kept["special"] if token not in self.ids]
        if unknown:
            raise UserError(f"{origin}: the special token \"{printable(unknown[0][:40])}\" is neither in vocab.json "
                            "nor a language code")
        self.pieces = {index: piece for piece, index in self.ids.items()}
        if "</s>" not in vocab:
            raise UserError(f"{origin}: vocab.json has no </s>, which ends every text")
        self.unknown, self.end = vocab["<unk>"], vocab["</s>"]
        self.source_language = self.languages[kept["source_language"]]
        named = [*kept["special"], *(token for token in ("<s>", "</s>", "<pad>", "<unk>") if token in vocab)]
        self.special = {self.ids[token] for token in named}
        self.split = re.compile("(" + "|".join(re.escape(token) for token in sorted(set(named), key=len,
                                                                                    reverse=True)) + ")")
        self.size = len(self.ids) + kept["madeup_words"]    # ids after the codes, each an unknown token

    def encode(self, lines: list[str]) -> list[list[int]]:
        return [self._encode(line) for line in lines]

    def _encode(self, line: str) -> list[int]:
        ids: list[int] = []
        for place, part in enumerate(self.split.split(line)):
            if place % 2:       # a special token the text holds
                ids.append(self.ids[part])
            elif part:
                ids += [self.ids.get(piece, self.unknown) for piece in self.processor.encode(part, out_type=str)]
        return ids

    def framed(self, lines: list[str], language: int | None) -> list[list[int]]:
        """A source (or, with the target's `language`, a target) as M2M100Tokenizer frames one."""
        code = self.source_language if language is None else language
        return [[code, *ids, self.end] for ids in self.encode(lines)]

    def decode(self, ids: list[int]) -> str:
        pieces = [self.pieces[i] for i in ids if i not in self.special and i in self.pieces]
        return self.processor.decode_pieces(pieces).strip()


_Library = _Tokenizers | _Sentencepiece | _Marian | _M2M100

MAX_MADEUP_WORDS = 1 << 20

# M2M100Tokenizer's language code lists (its `language_codes` setting): fairseq's, in the order of their ids.
M2M100_LANGUAGES = {
    "m2m100": tuple("af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha he "
                    "hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne nl "
                    "no ns oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh "
                    "yi yo zh zu".split()),
    "wmt21": ("en", "ha", "is", "ja", "cs", "ru", "zh", "de"),
}


def _language_code(line: str) -> tuple[list[str], str]:
    """A leading `>>xx<<` apart from the text after it (MarianTokenizer's multilingual targets)."""
    end = line.find("<<") if line.startswith(">>") else -1
    return ([line[:end + 2]], line[end + 2:]) if end != -1 else ([], line)


def _base64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise UserError(f"{where}: not base64") from None


def _processor(spm, data: bytes, where: str):
    """A sentencepiece model from its bytes (SentencePieceProcessor loads nothing from none, and fails only
    when used)."""
    if not data:
        raise UserError(f"{where}: empty, not a sentencepiece model")
    return _read(lambda: spm.SentencePieceProcessor(model_proto=data), f"{where}: not a sentencepiece model")


def kept_files(files: dict[str, bytes], **settings: object) -> bytes:
    """Tokenizer files (Marian's, M2M100's), with any settings, as the one object a checkpoint keeps."""
    return json.dumps({**{name: base64.b64encode(data).decode("ascii") for name, data in files.items()},
                       **settings}).encode()


def files_of(kept: bytes, names: tuple[str, ...]) -> dict[str, bytes]:
    """The files `names` again, from what a checkpoint keeps (checked when its tokenizer was made)."""
    return {name: base64.b64decode(text) for name, text in json.loads(kept).items() if name in names}


def _read(load: Callable[[], T], refusal: str) -> T:
    """What `load` makes of a tokenizer's file, or a UserError starting with `refusal` saying why (the library
    raises assorted types for a file it cannot read, a panic among them)."""
    try:
        return bounded(load, READ_TIMEOUT_S)
    except Overtime:
        raise UserError(f"{refusal} (reading it takes more than {READ_TIMEOUT_S:.0f} s)") from None
    except CallFailed as failed:
        raise UserError(f"{refusal} ({failed.reason})") from None


# --- calls with a time budget ----------------------------------------------------------------------------

T = TypeVar("T")


class Overtime(Exception):
    """The call was still running when its budget ran out."""


class CallFailed(Exception):
    """The call raised; `reason` says what, in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def _budget(lines: list[str]) -> float:
    return BUDGET_BASE_S + BUDGET_PER_CHARACTER_S * sum(len(line) for line in lines)


def _chunks(lines: list[str]) -> Iterator[tuple[int, list[str]]]:
    """(index of the first, lines) of at most CHUNK_LINES lines and CHUNK_CHARACTERS characters (or one line)."""
    start, size = 0, 0
    for i, line in enumerate(lines):
        if i > start and (size + len(line) > CHUNK_CHARACTERS or i - start >= CHUNK_LINES):
            yield start, lines[start:i]
            start, size = i, 0
        size += len(line)
    if start < len(lines):
        yield start, lines[start:]


def bounded(call: Callable[[], T], seconds: float) -> T:
    """call()'s result, run by the worker thread and waited for at most `seconds` (else Overtime: the worker
    is left to finish it, or to end with the process, and the next call gets a new one); whatever it
    raises, a native panic included, is CallFailed."""
    return bounded_timed(call, seconds)[0]


def bounded_timed(call: Callable[[], T], seconds: float) -> tuple[T, float]:
    """As bounded, with the CPU time the worker thread spent on the call: a measure of the call alone, which
    neither other processes nor this process's other threads (an abandoned call among them) change."""
    outcome: list = []
    finished = threading.Event()
    with _calls.lock, _failure_report_held_back() as failed:
        if _calls.worker is None:
            _calls.worker = _start_worker()
        _calls.worker.put((call, outcome, finished))
        if not finished.wait(seconds):
            _calls.worker = None
            raise Overtime
        done, value, cpu = outcome[0]
        failed.append(not done)
    if done:
        return value, cpu
    _reraise_interrupt(value)
    raise CallFailed(_reason(value))


class _Calls:
    """The worker thread's queue, and what the calls share; made anew in a forked child, which has neither
    the thread nor a lock another thread may have held."""

    def __init__(self) -> None:
        self.lock = threading.Lock()                    # one call at a time: one worker, one stderr
        self.worker: queue.SimpleQueue | None = None
        self.held: BinaryIO | None = None               # where stderr goes during a call


_calls = _Calls()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: globals().update(_calls=_Calls()))


def _start_worker() -> queue.SimpleQueue:
    calls: queue.SimpleQueue = queue.SimpleQueue()

    def serve() -> None:
        while True:
            call, outcome, finished = calls.get()
            start = time.thread_time()
            try:
                # Both libraries work on the calling thread for one text: its CPU time is the call's.
                outcome.append((True, call(), time.thread_time() - start))
            except BaseException as error:      # a pyo3 PanicException is no Exception
                outcome.append((False, error, time.thread_time() - start))
            finished.set()

    threading.Thread(target=serve, name="xspec-tokenizer", daemon=True).start()
    return calls


def _is_panic(error: BaseException) -> bool:
    # pyo3_runtime.PanicException cannot be imported by name: it is known by its class's name.
    return type(error).__name__ == "PanicException"


def _reraise_interrupt(error: BaseException) -> None:
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        raise error


def _reason(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    text = printable(lines[0][:200]) if lines else type(error).__name__
    return f"the tokenizers library panicked: {text}" if _is_panic(error) else text


@contextmanager
def _failure_report_held_back() -> Iterator[list[bool]]:
    """While a call runs, what the process writes to stderr (fd 2) is held in a temporary file and passed on
    afterwards, unless the call failed (True appended to the list): the library then wrote its own report
    there (Rust's panic report, a backtrace with RUST_BACKTRACE set; sentencepiece's log), which the error
    raised instead says in one line. (_calls.lock held.)"""
    failed: list[bool] = []
    held = _held_file()
    saved = _duplicated_stderr() if held is not None else None
    if held is None or saved is None:
        yield failed
        return
    sys.stderr.flush()
    os.dup2(held.fileno(), 2)
    try:
        yield failed
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        held.seek(0)
        written = held.read()
        held.seek(0)
        held.truncate()
        if written and not any(failed):
            _write_all(2, written)


def _held_file() -> BinaryIO | None:
    """The temporary file stderr goes to during a call (one for the process); None where none can be made."""
    if _calls.held is None:
        try:
            _calls.held = tempfile.TemporaryFile()
        except OSError:
            return None
    return _calls.held


def _duplicated_stderr() -> int | None:
    try:
        return os.dup(2)
    except OSError:                 # no stderr at all: nothing to hold back
        return None


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


# --- the probe -----------------------------------------------------------------------------------------

class _Probe:
    """Refuses a tokenizer whose encoding or decoding time grows faster than the text, that fails on a long
    run of one kind of character, or that takes long to decode its longest token. Its cost for real
    tokenizers (Llama 2 and 3, Qwen2, GPT-2, BERT, T5 shapes, sentencepiece): 10 to 60 ms."""

    def __init__(self, library: _Library, origin: str) -> None:
        self.library, self.origin = library, origin

    def run(self) -> None:
        self._timed("encoding a first line", lambda: self.library.encode(["warm up"]))
        for what, unit in PROBE_TEXTS:
            texts = [(unit * n)[:n] for n in (PROBE_SHORT, PROBE_LONG)]
            ids = self._compare([f"encoding {len(t):,} {what}" for t in texts],
                                [partial(self._encode, t) for t in texts])
            self._compare([f"decoding the ids of {len(t):,} {what}" for t in texts],
                          [partial(self.library.decode, i) for i in ids])
        if self.library.longest is not None:
            self._longest_token(*self.library.longest)

    def _encode(self, text: str) -> list[int]:
        return self.library.encode([text])[0]

    def _timed(self, doing: str, call: Callable[[], T]) -> tuple[float, T]:
        """(CPU seconds the call took on its thread, result): other load on the machine does not count."""
        try:
            result, seconds = bounded_timed(call, PROBE_TIMEOUT_S)
        except Overtime:
            raise self._refusal(f"{doing} takes more than {PROBE_TIMEOUT_S:.0f} s") from None
        except CallFailed as failed:
            raise self._refusal(f"{doing} fails ({failed.reason})") from None
        return seconds, result

    def _compare(self, doing: list[str], calls: list[Callable[[], T]]) -> list[T]:
        timed = [self._timed(d, c) for d, c in zip(doing, calls)]
        times = [t for t, _ in timed]
        # A suspect, at half the ratio refused: the least of three tries of each, as a busy machine adds
        # time to either (a short run slowed once would hide a quadratic long one).
        for _ in range(2):
            if not _grows_too_fast(times, PROBE_GROWTH / 2):
                break
            times = [min(t, self._timed(d, c)[0]) for t, d, c in zip(times, doing, calls)]
        if _grows_too_fast(times, PROBE_GROWTH):
            ratio = times[1] / max(times[0], 1e-9)
            raise self._refusal(f"{doing[1]} takes {times[1] * 1000:.0f} ms, {ratio:.0f} times as "
                                f"long as {doing[0].split(' ', 1)[1]} ({times[0] * 1000:.1f} ms): its time grows "
                                "faster than the text (a regular expression that backtracks?)")
        return [result for _, result in timed]

    def _longest_token(self, token: str, index: int) -> None:
        doing = f"decoding its longest token (id {index}, {len(token):,} characters)"
        seconds = self._timed(doing, lambda: self.library.decode([index]))[0]
        if seconds > PROBE_TOKEN_S:             # a suspect: the lesser of two tries
            seconds = min(seconds, self._timed(doing, lambda: self.library.decode([index]))[0])
        if seconds > PROBE_TOKEN_S:
            raise self._refusal(f"{doing} takes {seconds * 1000:.0f} ms")

    def _refusal(self, problem: str) -> UserError:
        return UserError(f"{self.origin}: {problem}; refusing a tokenizer that long text would stall")


def _grows_too_fast(times: list[float], growth: float) -> bool:
    return times[1] > PROBE_FLOOR_S and times[1] > growth * times[0]
