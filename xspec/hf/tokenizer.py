"""Finding a Hugging Face checkpoint directory's tokenizer (tokenizer.json preferred, else tokenizer.model)
and its special ids; the tokenizer itself is runtime/tokenizer.py's, which a loaded checkpoint uses too."""

from __future__ import annotations

from pathlib import Path

from xspec.base.errors import UserError
from xspec.base.files import read_regular_file
from xspec.runtime.tokenizer import KINDS, NONE, CheckpointTokenizer

MAX_TOKENIZER_BYTES = 64 << 20


def special_ids(config: dict) -> tuple[int | None, list[int]]:
    bos, eos = config.get("bos_token_id"), config.get("eos_token_id")
    eos_ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if not (bos is None or type(bos) is int) or not all(type(i) is int for i in eos_ids):
        raise UserError("config.json: bos_token_id and eos_token_id must be token ids")
    return bos, eos_ids


def find_tokenizer(directory: Path, config: dict) -> CheckpointTokenizer:
    """The directory's tokenizer (tokenizer.json preferred), or one of kind "none" when it has neither file."""
    bos, eos = special_ids(config)
    for name, kind in KINDS.items():
        path = directory / name
        if path.is_file():
            return CheckpointTokenizer(kind, read_regular_file(path, MAX_TOKENIZER_BYTES), bos, eos, str(path))
    return CheckpointTokenizer(NONE, b"", bos, eos, f"{directory}: its tokenizer")
