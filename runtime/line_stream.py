"""Lines of text as they arrive, for commands that answer each line as soon as they can (`xspec translate`).

`take(limit)` waits for one line, then returns it with every further line that has already arrived, up
to `limit`: typed one at a time, each line is answered at once; piped or read from a file, lines come
in windows of `limit`. Invalid UTF-8, and a line of more than MAX_LINE_BYTES, are reported with their
line number.
"""

from __future__ import annotations

import io
import os
import select
from typing import BinaryIO, Optional

from xspec.base.errors import UserError

CHUNK = 1 << 16  # bytes per read
MAX_LINE_BYTES = 1 << 20  # a sentence to translate is far shorter; more is not text (`cat /dev/zero | ...`)


class LineStream:
    def __init__(self, source: BinaryIO, name: str) -> None:
        self.source, self.name = source, name
        self.buffer = b""
        self.ended = False
        self.line_number = 0  # lines returned so far
        try:
            self.fd: Optional[int] = source.fileno()
        except (io.UnsupportedOperation, AttributeError, ValueError):
            self.fd = None  # an in-memory stream: everything in it has arrived

    def take(self, limit: int) -> list[str]:
        """At least one line (waiting for it) and at most `limit`; an empty list once the input ends."""
        lines: list[str] = []
        while len(lines) < limit:
            newline = self.buffer.find(b"\n")
            if newline >= 0:
                lines.append(self._decode(self.buffer[:newline]))
                self.buffer = self.buffer[newline + 1:]
                continue
            if self.ended:
                if self.buffer:  # a last line without its newline
                    lines.append(self._decode(self.buffer))
                    self.buffer = b""
                break
            if len(self.buffer) > MAX_LINE_BYTES:
                raise UserError(f"{self.name}:{self.line_number + 1}: a line longer than {MAX_LINE_BYTES:,} bytes")
            if lines and not self._ready():
                break  # answer what has come rather than wait for more
            self._read()
        return lines

    def _ready(self) -> bool:
        """Whether reading now would not wait."""
        if self.fd is None:
            return True
        try:
            return bool(select.select([self.fd], [], [], 0)[0])
        except (OSError, ValueError):  # not selectable (e.g. a file on Windows): reading does not wait for long
            return True

    def _read(self) -> None:
        data = os.read(self.fd, CHUNK) if self.fd is not None else self.source.read(CHUNK)
        if data:
            self.buffer += data
        else:
            self.ended = True

    def _decode(self, data: bytes) -> str:
        self.line_number += 1
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise UserError(f"{self.name}:{self.line_number}: invalid UTF-8 (byte 0x{data[error.start]:02x} at "
                            f"column {error.start + 1})") from None
