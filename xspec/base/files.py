"""Reading and writing files: never a half-written file, never a blocked read, paths checked early.

Every file xspec writes (checkpoints, run descriptions, translations, reports, generated code) goes
through `write_atomically_with`: the content goes to a temporary file in the destination's own
folder, is flushed to disk, and is renamed over the destination in one step; on any failure the
temporary file is removed and the destination is untouched. The final file gets the permissions a
plain `open(path, "w")` would give it (0o666 less the umask).

`read_regular_file` reads only regular files: a FIFO or a device given as an input is refused
rather than read (which could block or never end), and every failure is one `UserError` naming the
path.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from xspec.base.errors import UserError
from xspec.base.text import shown


def write_atomically(path: Path, text: str) -> Path:
    """Writes `text` (UTF-8) to `path` atomically; returns `path`."""
    return write_bytes_atomically(path, text.encode("utf-8"))


def write_bytes_atomically(path: Path, data: bytes) -> Path:
    """Writes `data` to `path` atomically; returns `path`."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            handle.write(data)

    return write_atomically_with(path, write)


def write_atomically_with(path: Path, write: Callable[[Path], None]) -> Path:
    """Calls `write(tmp)` to fill a temporary path beside `path` (e.g. safetensors' `save_file`),
    then moves it over `path`. The parent folders are created as needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())   # mkstemp (and safetensors) create files 0o600
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)
    return path


def link_atomically(source: Path, path: Path) -> Path:
    """Makes `path` name the same file as `source` (a hard link; a copy where the filesystem has none),
    atomically as `write_atomically_with` writes. The two names then outlive each other."""

    def link(tmp: Path) -> None:
        tmp.unlink()
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)

    return write_atomically_with(path, link)


def current_umask() -> int:
    # The only portable way to read the umask is to set it; it is put back at once.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_directory(directory: Path) -> None:
    """Makes the rename itself durable; some file systems cannot sync a folder, which is harmless."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --- reading ------------------------------------------------------------------------------------

_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class UnreadableFile(UserError):
    """A file that cannot be read as asked. `reason` says why without the path, for callers that name
    the file their own way (a spec's `import` line)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{shown(path)}: {reason}")
        self.path, self.reason = path, reason


def read_regular_file(path: Path, max_bytes: int | None = None) -> bytes:
    """The contents of the regular file at `path` (at most `max_bytes`, when given)."""
    with open_regular_file(path) as handle:
        try:
            data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
        except OSError as error:
            raise UnreadableFile(path, f"cannot read: {error.strerror}") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise UnreadableFile(path, f"larger than {max_bytes:,} bytes")
    return data


def open_regular_file(path: Path) -> BinaryIO:
    """The regular file at `path`, open for reading bytes; anything else is refused with the reason."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        missing = "a symlink to a missing file" if os.path.islink(path) else "no such file"
        raise UnreadableFile(path, missing) from None
    except NotADirectoryError:
        raise UnreadableFile(path, "a folder on its path is a file, not a directory") from None
    except ValueError:
        raise UnreadableFile(path, "a path cannot contain a NUL byte") from None
    except IsADirectoryError:
        raise UnreadableFile(path, "is a directory, not a text file") from None
    except OSError as error:
        raise UnreadableFile(path, f"cannot read: {error.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
        suffix = ", not a text file" if stat.S_ISDIR(mode) else "; only regular files are read"
        raise UnreadableFile(path, f"is {kind}{suffix}")
    return os.fdopen(fd, "rb")


# --- checking output paths before any work is done -------------------------------------------------

def check_output_file(path: Path, option: str) -> Path:
    """Refuses, naming the option, an output file that could not be written: `path` is a folder, or
    its parent is neither an existing folder nor one that can be created."""
    path = Path(path)
    if _is_dir(path, option):
        raise UserError(f"{option} {shown(path)}: is a directory; give a file name")
    _check_creatable_folder(path.parent, option, path)
    return path


def check_output_dir(path: Path, option: str) -> Path:
    """Refuses, naming the option, an output folder that exists as a file or cannot be created."""
    path = Path(path)
    _check_creatable_folder(path, option, path)
    return path


def _check_creatable_folder(folder: Path, option: str, given: Path) -> None:
    existing = folder
    while not _exists(existing, option):
        existing = existing.parent
    if not _is_dir(existing, option):
        raise UserError(f"{option} {shown(given)}: {shown(existing)} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{option} {shown(given)}: cannot write in {shown(existing)} (permission denied)")


def _exists(path: Path, option: str) -> bool:
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):   # for the latter, the caller walks up to the file
        return False
    except ValueError:                     # an embedded NUL byte
        raise UserError(f"{option} {shown(path)}: a path cannot contain a NUL byte") from None
    except OSError as error:               # e.g. a symlink loop, or a non-directory on the way
        raise UserError(f"{option} {shown(path)}: {error.strerror}") from None
    return True


def _is_dir(path: Path, option: str) -> bool:
    return _exists(path, option) and path.is_dir()
