"""Lines cut from a stream of bytes in bounded memory, and what had to be skipped, said by file and line.

A line is skipped, not fatal, when it is empty (after stripping), longer than `max_bytes` (it is never
held whole: cutting skips to its end), or not UTF-8; a record of JSON Lines or Parquet (sources.py) also
when its line is not JSON, not a JSON object, or its text field is missing or not a string. `Skips` counts
each kind and keeps the first few places, which `xspec data prepare` prints and records.
"""

from __future__ import annotations

import builtins
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Optional

from xspec.base.text import shown

KEPT_PLACES = 10                    # skipped lines named in the report; the rest are counted

# Each kind of skipped line, as reports name it. The first three are those of plain text.
KINDS = {"empty": "empty", "too_long": "too long", "invalid_utf8": "not UTF-8", "not_json": "not JSON",
         "not_object": "not a JSON object", "no_field": "without the text field",
         "not_string": "with a text field that is not a string"}


@dataclass
class Skips:
    empty: int = 0
    too_long: int = 0
    invalid_utf8: int = 0
    not_json: int = 0
    not_object: int = 0
    no_field: int = 0
    not_string: int = 0
    where: list[str] = field(default_factory=list)

    def note(self, kind: str, place: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if kind != "empty" and len(self.where) < KEPT_PLACES:
            self.where.append(place)

    def counts(self) -> dict[str, int]:
        return {kind: getattr(self, kind) for kind in KINDS}

    def describe(self) -> str:
        counts = self.counts()
        parts = [f"{n:,} {KINDS[kind]}" for kind, n in counts.items() if n]
        if not parts:
            return "nothing skipped"
        places = "; ".join(self.where)
        more = ", ..." if sum(counts.values()) - self.empty > len(self.where) else ""
        return "skipped " + ", ".join(parts) + (f" ({places}{more})" if places else "")


@dataclass
class Digest:
    """A file's SHA-256 and size, taken while it is read."""

    sha256: "hashlib._Hash" = field(default_factory=lambda: hashlib.sha256())
    bytes: int = 0

    def update(self, block: builtins.bytes) -> None:     # `bytes` in here is the field
        self.sha256.update(block)
        self.bytes += len(block)


@dataclass
class Line:
    """A record as read: its text (None when skipped, and why), its 1-based line number (row, in Parquet)."""

    number: int
    text: Optional[str]
    problem: str = ""                  # a skipped record's kind (a key of KINDS)
    detail: str = ""
    row: bool = False                  # numbered as a Parquet row, not a line

    def place(self, path: Path) -> str:
        """Where the record is, as reports name it: FILE:LINE, or FILE, row N."""
        return f"{shown(path)}, row {self.number}" if self.row else f"{shown(path)}:{self.number}"


def cut_lines(blocks: Iterable[bytes], max_bytes: int) -> Iterator[tuple[int, Optional[bytes]]]:
    """(number, bytes) of every line of the stream `blocks`, the last one with or without its newline; the
    bytes are None for a line longer than `max_bytes`, which is never held whole."""
    number, pieces, held, skipping = 0, list[bytes](), 0, False
    for block in blocks:
        start = 0
        while True:
            newline = block.find(b"\n", start)
            if newline < 0:
                if not skipping and start < len(block):
                    pieces.append(block[start:])
                    held += len(block) - start
                    if held > max_bytes:
                        pieces, held, skipping = [], 0, True
                break
            number += 1
            if skipping:
                yield number, None
                skipping = False
            else:
                data = b"".join(pieces) + block[start:newline] if pieces else block[start:newline]
                yield number, (data if len(data) <= max_bytes else None)
            pieces, held, start = [], 0, newline + 1
    if skipping:
        yield number + 1, None
    elif pieces:
        yield number + 1, b"".join(pieces)


def text_line(number: int, data: Optional[bytes], max_bytes: int) -> Line:
    """A line of plain text: stripped, or skipped as too long, not UTF-8 or empty."""
    if data is None:
        return Line(number, None, "too_long", f"longer than {max_bytes:,} bytes")
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError as error:
        return Line(number, None, "invalid_utf8", f"invalid UTF-8 (byte 0x{data[error.start]:02x} at column "
                                                  f"{error.start + 1})")
    return Line(number, text) if text else Line(number, None, "empty")
