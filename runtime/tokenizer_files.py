"""The tokenizer files a checkpoint keeps, each made into the library object that encodes and decodes with it:
tokenizer.json through the `tokenizers` library (`TokenizerJson`), a sentencepiece tokenizer.model
(`SentencepieceModel`), MarianTokenizer's files (`MarianFiles`) and M2M100Tokenizer's (`M2M100Files`). All are
data (JSON, protobuf messages), never code; each is read through runtime/bounded_calls.py, and checked as it is
made. runtime/tokenizer.py's CheckpointTokenizer holds one."""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Union

from xspec.base.errors import UserError
from xspec.base.strict_json import parse_json
from xspec.base.text import printable
from .bounded_calls import read_bounded

# MarianTokenizer's three files, which a checkpoint keeps as one (`MarianFiles`): its ids are vocab.json's.
MARIAN_FILES = ("source.spm", "target.spm", "vocab.json")
MARIAN_TARGET_VOCAB = "target_vocab.json"      # a target vocabulary of its own (separate_vocabs), where kept
# M2M100Tokenizer's two files, kept as one with its settings (`M2M100Files`): ids are vocab.json's, then its
# languages'.
M2M100_FILES = ("sentencepiece.bpe.model", "vocab.json")
M2M100_KEPT = (*M2M100_FILES, "language_codes", "source_language", "special", "madeup_words")

class TokenizerJson:
    """tokenizer.json through the `tokenizers` library (whose encode_batch and decode_batch release the GIL)."""

    def __init__(self, data: bytes, origin: str) -> None:
        value = parse_json(data, origin)     # UTF-8, JSON, no key given twice: one message for each
        if not isinstance(value, dict) or not isinstance(value.get("model"), dict):
            raise UserError(f"{origin}: not a tokenizers tokenizer (expected a JSON object with a \"model\" object)")
        from tokenizers import Tokenizer

        text = data.decode("utf-8")
        self.tokenizer = read_bounded(lambda: Tokenizer.from_str(text), f"{origin}: not a tokenizers tokenizer")
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


class SentencepieceModel:
    """tokenizer.model through sentencepiece (which releases the GIL while it encodes and decodes)."""

    longest = None      # no decoder of its own to probe: pieces are joined

    def __init__(self, data: bytes, origin: str) -> None:
        import sentencepiece as spm

        if not data:        # SentencePieceProcessor(model_proto=b"") loads nothing, and fails only when used
            raise UserError(f"{origin}: not a sentencepiece tokenizer (an empty file)")
        self.processor = read_bounded(lambda: spm.SentencePieceProcessor(model_proto=data),
                               f"{origin}: not a sentencepiece tokenizer")
        self.size = self.processor.get_piece_size()

    def encode(self, lines: list[str]) -> list[list[int]]:
        return self.processor.encode(lines)

    def decode(self, ids: list[int]) -> str:
        return self.processor.decode(ids)


class MarianFiles:
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


class M2M100Files:
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


Library = Union[TokenizerJson, SentencepieceModel, MarianFiles, M2M100Files]

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
    return read_bounded(lambda: spm.SentencePieceProcessor(model_proto=data), f"{where}: not a sentencepiece model")


def kept_files(files: dict[str, bytes], **settings: object) -> bytes:
    """Tokenizer files (Marian's, M2M100's), with any settings, as the one object a checkpoint keeps."""
    return json.dumps({**{name: base64.b64encode(data).decode("ascii") for name, data in files.items()},
                       **settings}).encode()


def files_of(kept: bytes, names: tuple[str, ...]) -> dict[str, bytes]:
    """The files `names` again, from what a checkpoint keeps (checked when its tokenizer was made)."""
    return {name: base64.b64decode(text) for name, text in json.loads(kept).items() if name in names}
