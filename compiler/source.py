"""Reading spec files: regular files only (xspec/base/files.py), of bounded size, in UTF-8.

A spec names the files it imports, so a path is untrusted: `/dev/zero` must not be read forever, a
FIFO must not block, a symlink loop or a NUL byte must be a message, not an exception.
"""

from __future__ import annotations

from pathlib import Path

from xspec.base.files import UnreadableFile, read_regular_file

from .limits import MAX_RESOLVED_BYTES


class SourceError(Exception):
    """Why a file cannot be read as a spec (the message is the reason alone, without the path)."""


def read_source(path: str) -> str:
    """The text of the spec file at `path` (no larger than any spec may be: the loader then bounds the
    total of a spec and its imports)."""
    try:
        data = read_regular_file(Path(path), MAX_RESOLVED_BYTES)
    except UnreadableFile as error:
        raise SourceError(error.reason) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise SourceError(f"not valid UTF-8 (line {line})") from None
