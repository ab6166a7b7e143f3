"""An imported checkpoint's own tokenizer: tokenizer.json through the `tokenizers` library, or a sentencepiece
tokenizer.model. Both are data (JSON, a protobuf), never code. Chat templates (tokenizer_config.json's
chat_template) are not read: prompts are plain text. `xspec import` finds it in a checkpoint directory
(xspec/hf/tokenizer.py); a checkpoint keeps its description and file, and loading one makes it again here."""

from __future__ import annotations

import json

from xspec.base.errors import UserError

TOKENIZER_JSON = "tokenizer.json"
SENTENCEPIECE = "tokenizer.model"
KINDS = {TOKENIZER_JSON: "tokenizers", SENTENCEPIECE: "sentencepiece"}
NONE = "none"               # a checkpoint directory without a tokenizer: the model runs on token ids alone


class CheckpointTokenizer:
    """Text <-> ids as the checkpoint's model was trained with; `bos_id`/`eos_id` from its config (None
    where it has none). The interface of runtime/vocab.py's Vocab: encode, decode, len, model_proto."""

    def __init__(self, kind: str, data: bytes, bos_id: int | None, eos_ids: list[int], origin: str) -> None:
        self.kind, self.model_proto, self.bos_id, self.eos_ids = kind, data, bos_id, eos_ids
        self._origin = origin
        try:
            if kind == NONE:
                self._size = 0
            elif kind == "tokenizers":
                from tokenizers import Tokenizer

                self._tokenizer = Tokenizer.from_str(data.decode("utf-8"))
                # The ids' bound: added tokens may leave gaps, so their count can fall short of it.
                ids = self._tokenizer.get_vocab(with_added_tokens=True).values()
                self._size = max(max(ids, default=-1) + 1, self._tokenizer.get_vocab_size(with_added_tokens=True))
            else:
                import sentencepiece as spm

                self._sp = spm.SentencePieceProcessor(model_proto=data)
                self._size = self._sp.get_piece_size()
        except Exception as error:  # the libraries raise assorted types for a file they cannot parse
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise UserError(f"{origin}: not a {kind} tokenizer ({reason})") from None

    def __len__(self) -> int:
        return self._size

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

    never_generated: tuple[int, ...] = ()

    def _needed(self) -> None:
        if self.kind == NONE:
            raise UserError(f"{self._origin}: none (the checkpoint directory had no tokenizer.json or "
                            "tokenizer.model): text cannot be turned into token ids")

    def encode(self, lines: list[str]) -> list[list[int]]:
        self._needed()
        if self.kind == "tokenizers":
            return [e.ids for e in self._tokenizer.encode_batch(lines, add_special_tokens=False)]
        return self._sp.encode(lines)

    def decode(self, ids: list[int]) -> str:
        self._needed()
        if self.kind == "tokenizers":
            return self._tokenizer.decode(ids, skip_special_tokens=True)
        specials = {self.bos_id, *self.eos_ids}
        return self._sp.decode([i for i in ids if i not in specials])

    def describe(self) -> dict:
        return {"kind": self.kind, "bos_id": self.bos_id, "eos_ids": self.eos_ids}

    @classmethod
    def from_description(cls, description: str, data: bytes, origin: str) -> "CheckpointTokenizer":
        try:
            info = json.loads(description)
            kind, bos, eos = info["kind"], info["bos_id"], info["eos_ids"]
            assert kind in (*KINDS.values(), NONE) and (bos is None or type(bos) is int)
            assert isinstance(eos, list) and all(type(i) is int for i in eos)
        except (ValueError, KeyError, TypeError, AssertionError):
            raise UserError(f"{origin}: not a tokenizer description xspec wrote") from None
        return cls(kind, data, bos, eos, origin)
