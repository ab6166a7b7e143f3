"""Reading spec files: regular files only, of bounded size, in UTF-8.

A spec names the files it imports, so a path is untrusted: `/dev/zero` must not be read forever, a
FIFO must not block, a symlink loop or a NUL byte must be a message, not an exception.
"""

from __future__ import annotations

import errno
import os
import stat

from .limits import MAX_SOURCE_BYTES


class SourceError(Exception):
    """Why a file cannot be read as a spec (the message is the reason alone, without the path)."""


def read_source(path: str) -> str:
    """The text of the spec file at `path`."""
    if "\0" in path:
        raise SourceError("the path contains a NUL byte")
    try:
        info = os.stat(path)  # follows symlinks; a loop is ELOOP
        if not stat.S_ISREG(info.st_mode):
            raise SourceError("is a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file")
        # O_NONBLOCK: if the file was swapped for a FIFO since the stat, opening must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise SourceError(_reason(error)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SourceError("not a regular file")
        data = _read_at_most(fd, MAX_SOURCE_BYTES + 1)
    except OSError as error:
        raise SourceError(_reason(error)) from None
    finally:
        os.close(fd)
    if len(data) > MAX_SOURCE_BYTES:
        raise SourceError(f"larger than {MAX_SOURCE_BYTES // 1024} KiB, the limit for a spec file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise SourceError(f"not valid UTF-8 (line {line})") from None


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, min(65536, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _reason(error: OSError) -> str:
    if error.errno == errno.ELOOP:
        return "too many levels of symbolic links"
    return error.strerror or str(error)
