"""Text files read as a stream of lines, in bounded memory, with what had to be skipped said by file and line.

A line is skipped, not fatal, when it is empty (after stripping), longer than `max_bytes` (it is never
held whole: reading skips to its end), or not UTF-8. `Skips` counts each kind and keeps the first few
places, which `xspec data prepare` prints and records.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

from xspec.base.errors import UserError
from xspec.base.files import open_regular_file

READ_BYTES = 1 << 20
KEPT_PLACES = 10                    # skipped lines named in the report; the rest are counted


@dataclass
class Skips:
    empty: int = 0
    too_long: int = 0
    invalid_utf8: int = 0
    where: list[str] = field(default_factory=list)

    def note(self, kind: str, place: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if kind != "empty" and len(self.where) < KEPT_PLACES:
            self.where.append(place)

    def describe(self) -> str:
        parts = [f"{n:,} {what}" for n, what in ((self.empty, "empty"), (self.too_long, "too long"),
                                                 (self.invalid_utf8, "not UTF-8")) if n]
        if not parts:
            return "nothing skipped"
        shown = "; ".join(self.where)
        more = ", ..." if self.too_long + self.invalid_utf8 > len(self.where) else ""
        return "skipped " + ", ".join(parts) + (f" ({shown}{more})" if shown else "")


@dataclass
class Digest:
    """A file's SHA-256 and size, taken while it is read."""

    sha256: "hashlib._Hash" = field(default_factory=lambda: hashlib.sha256())
    bytes: int = 0


@dataclass
class Line:
    """A line as read: its text (None when skipped, and why), its 1-based number."""

    number: int
    text: Optional[str]
    problem: str = ""                  # a skipped line's: "empty", "too_long" or "invalid_utf8"
    detail: str = ""


def read_lines(path: Path, max_bytes: int, digest: Optional[Digest] = None) -> Iterator[Line]:
    """Every line of `path` in order, the last one with or without its newline; `digest` takes every byte."""
    number, buffer, skipping = 0, b"", False
    with open_regular_file(path) as handle:
        while True:
            try:
                block = handle.read(READ_BYTES)
            except OSError as error:
                raise UserError(f"{path}: cannot read: {error.strerror}") from None
            if not block:
                break
            if digest is not None:
                digest.sha256.update(block)
                digest.bytes += len(block)
            start = 0
            while True:
                newline = block.find(b"\n", start)
                if newline < 0:
                    if not skipping:
                        buffer += block[start:]
                        if len(buffer) > max_bytes:
                            buffer, skipping = b"", True
                    break
                number += 1
                if skipping:
                    yield Line(number, None, "too_long", f"longer than {max_bytes:,} bytes")
                    skipping = False
                else:
                    yield _line(number, buffer + block[start:newline], max_bytes)
                buffer, start = b"", newline + 1
    if skipping:
        yield Line(number + 1, None, "too_long", f"longer than {max_bytes:,} bytes")
    elif buffer:
        yield _line(number + 1, buffer, max_bytes)


def _line(number: int, data: bytes, max_bytes: int) -> Line:
    if len(data) > max_bytes:
        return Line(number, None, "too_long", f"longer than {max_bytes:,} bytes")
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError as error:
        return Line(number, None, "invalid_utf8", f"invalid UTF-8 (byte 0x{data[error.start]:02x} at column "
                                                  f"{error.start + 1})")
    return Line(number, text) if text else Line(number, None, "empty")


def text_lines(paths: list[Path], max_bytes: int, skips: Skips,
               digests: Optional[dict[Path, Digest]] = None) -> Iterator[str]:
    """The kept lines of `paths`, one file after another; skipped ones noted in `skips`; each file's
    digest into `digests` when given."""
    for path in paths:
        digest = digests.setdefault(path, Digest()) if digests is not None else None
        for line in read_lines(path, max_bytes, digest):
            if line.text is None:
                skips.note(line.problem, f"{path}:{line.number}: {line.detail or line.problem}")
            else:
                yield line.text


def aligned_lines(source: Path, target: Path, max_bytes: int, skips: Skips,
                  digests: Optional[dict[Path, Digest]] = None) -> Iterator[tuple[str, str]]:
    """The kept pairs of two line-aligned files: a pair is skipped when either side is; files of
    different lengths are an error (found when the shorter one ends)."""
    src = read_lines(source, max_bytes, digests.setdefault(source, Digest()) if digests is not None else None)
    tgt = read_lines(target, max_bytes, digests.setdefault(target, Digest()) if digests is not None else None)
    while True:
        a, b = next(src, None), next(tgt, None)
        if a is None or b is None:
            longer, shorter, extra = (source, target, a) if a is not None else (target, source, b)
            if extra is not None:
                raise UserError(f"{shorter} has {extra.number - 1:,} lines but {longer} has more: source and target "
                                "files must be aligned line by line")
            return
        if a.text is not None and b.text is not None:
            yield a.text, b.text
            continue
        line, path = (a, source) if a.text is None else (b, target)
        skips.note(line.problem, f"{path}:{line.number}: {line.detail or line.problem}")
