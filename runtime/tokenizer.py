"""An imported checkpoint's own tokenizer: tokenizer.json through the `tokenizers` library, a sentencepiece
tokenizer.model, or MarianTokenizer's or M2M100Tokenizer's files (runtime/tokenizer_files.py makes each; all
data, never code). A prompt is encoded as the checkpoint's tokenizer encodes a text, or, with `--chat`, as its
chat template (runtime/chat.py) renders a conversation. `xspec import` finds it in a checkpoint directory
(xspec/hf/tokenizer.py); a checkpoint keeps its description and file, and loading one makes it again here.

A tokenizer is untrusted like the rest of a checkpoint, and it does work: its normalizer, pre-tokenizer and
decoder may hold regular expressions, which a backtracking engine can spend minutes on over one long line,
and the `tokenizers` library panics (a pyo3 PanicException, which is a BaseException) when one passes its
engine's retry limit. So, wherever one is made (at import, and again when a checkpoint is loaded), it is
probed on long runs of each kind of character and refused when its time grows faster than the text
(`_Probe`). Every call into the library then runs with a time budget (runtime/bounded_calls.py): a line that
still stalls it is an error naming the line, never a hang. Whatever the library raises, a panic included, is
an error naming the file.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Iterator

from xspec.base.errors import UserError
from xspec.base.strict_json import parse_json
from xspec.base.text import printable
from .bounded_calls import CallFailed, Overtime, T, bounded, bounded_timed
from .chat import chat_template
from .tokenizer_files import Library, M2M100Files, MarianFiles, SentencepieceModel, TokenizerJson
from .vocab import PairTemplate, TargetLanguage

TOKENIZER_JSON = "tokenizer.json"
SENTENCEPIECE = "tokenizer.model"
KINDS = {TOKENIZER_JSON: "tokenizers", SENTENCEPIECE: "sentencepiece"}
MARIAN = "marian"        # MarianTokenizer's files (tokenizer_files.MarianFiles)
M2M100 = "m2m100"        # M2M100Tokenizer's files (tokenizer_files.M2M100Files)
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
CHUNK_CHARACTERS = 1 << 20          # lines encoded in one call: at most this much text ...
CHUNK_LINES = 4096                  # ... and this many lines

# The probe: each kind of character in a run of PROBE_SHORT and of PROBE_LONG characters. Four times the
# text takes four times as long where the work is linear, sixteen times where it is quadratic.
PROBE_TEXTS = (("letters", "a"), ("digits", "7"), ("spaces", " "), ("punctuation marks", "!"),
               ("line breaks", "\n"), ("mixed characters", "a1 !\n"), ("non-ASCII characters", "é中🙂"),
               ("combining accents", "\u0301"))
PROBE_SHORT, PROBE_LONG = 1_000, 4_000
PROBE_GROWTH = 8.0                  # refused at this ratio of times (thread CPU time, least of PROBE_TRIES) ...
PROBE_FLOOR_S = 0.01                # ... once the long run takes this long: below it, times are noise
PROBE_TRIES = 5                     # tries of each of a suspect pair: one run of 15 against 1.8 ms was noise
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
        self._library: Library | None = None
        if kind == "tokenizers":
            self._library = TokenizerJson(data, origin)
        elif kind == "sentencepiece":
            self._library = SentencepieceModel(data, origin)
        elif kind == MARIAN:
            self._library = MarianFiles(data, origin)
        elif kind == M2M100:
            self._library = M2M100Files(data, origin)
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
        return self._library.target_size if isinstance(self._library, MarianFiles) else self._size

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

    def _needed(self) -> Library:
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
            assert isinstance(library, TokenizerJson)
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
        if isinstance(library, M2M100Files):
            return self._encoded(lines, partial(library.framed, language=language))
        return [ids if ids[-1:] == [self.document_end] else [*ids, self.document_end]
                for ids in self.encode_prompts(lines)]

    def encode_targets(self, lines: list[str], language: int | None = None) -> list[list[int]]:
        """Each target sentence of a pair as the checkpoint's tokenizer encodes a text_target: as a source
        but for Marian's, whose target.spm splits it; framed with the target's `language` code in place of the
        source's where the tokenizer frames a text with one (NLLB's)."""
        library = self._library
        if isinstance(library, MarianFiles):
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
        if not isinstance(library, TokenizerJson):
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
        if isinstance(library, MarianFiles):
            codes = sorted(p[2:-2] for p in library.ids if p.startswith(">>") and p.endswith("<<"))
            if code not in codes:
                listed = ", ".join(codes[:30]) + (", ..." if len(codes) > 30 else "") if codes else "none"
                raise UserError(f"--tgt-lang {shown_code}: {self._origin} has no >>{shown_code}<< token (its "
                                f"target languages: {printable(listed)})")
            return TargetLanguage(prefix=f">>{code}<< ")
        if isinstance(library, (TokenizerJson, M2M100Files)):
            return TargetLanguage(forced_bos=self.language_code(code, "--tgt-lang"))
        raise UserError(f"--tgt-lang {shown_code}: {self._origin} names no target languages (Marian's >>xx<< "
                        "tokens, or a tokenizer.json's language codes)")

    def language_code(self, code: str, flag: str = "--src-lang") -> int:
        """The id of a tokenizer.json's language code `code` (mBART-50's fr_XX, NLLB's fra_Latn), as given or as
        M2M100 spells it (__fr__); `flag` names it in the refusal."""
        library, shown_code = self._library, printable(code)
        if isinstance(library, TokenizerJson):
            for token in (code, f"__{code}__"):
                found = library.tokenizer.token_to_id(token)
                if found is not None:
                    return found
            raise UserError(f"{flag} {shown_code}: {self._origin} has no token {shown_code} or __{shown_code}__ (a "
                            "language code as the checkpoint's tokenizer spells it: fr_XX, __fr__, fra_Latn)")
        if isinstance(library, M2M100Files):
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
        if isinstance(library, TokenizerJson):
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
        if isinstance(library, TokenizerJson):
            return frozenset(i for i, token in library.tokenizer.get_added_tokens_decoder().items() if token.special)
        if isinstance(library, M2M100Files):
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
            if isinstance(library, TokenizerJson):
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


# --- the probe -----------------------------------------------------------------------------------------

class _Probe:
    """Refuses a tokenizer whose encoding or decoding time grows faster than the text, that fails on a long
    run of one kind of character, or that takes long to decode its longest token. Its cost for real
    tokenizers (Llama 2 and 3, Qwen2, GPT-2, BERT, T5 shapes, sentencepiece): 10 to 60 ms."""

    def __init__(self, library: Library, origin: str) -> None:
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
        # A suspect, at half the ratio refused: the least of PROBE_TRIES tries of each, as a busy machine adds
        # time to either (a short run slowed once would hide a quadratic long one).
        for _ in range(PROBE_TRIES - 1):
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
