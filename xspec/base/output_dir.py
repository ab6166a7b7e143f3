"""A directory xspec writes whole (an export): it appears complete or not at all, and it replaces only a
directory xspec wrote itself, unchanged since.

Each such directory holds a record of what was written (`WRITTEN`: the writer, every file's path, and each
regular file's size and modification time). An existing output is replaced only when it is empty or when its
record lists everything in it as it is; a directory holding anything else (a downloaded checkpoint's README,
a file added or edited since) is refused, never emptied.

The new content is written into a staging folder beside the output (`.NAME.XXXX.tmp`), which is renamed
into place once complete. A writer killed before the rename leaves its staging folder behind; the next
write to the same output removes such leftovers, recognising them by their record and by the lock a
living writer holds on it (so a concurrent writer's folder is never touched).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from xspec.base.errors import UserError
from xspec.base.files import check_output_dir, current_umask, read_regular_file
from xspec.base.strict_json import parse_json
from xspec.base.text import shown

try:
    import fcntl
except ImportError:             # not on Windows: leftovers are then left for the user to remove
    fcntl = None  # type: ignore[assignment]

WRITTEN = ".xspec-written.json"
MAX_RECORD_BYTES = 1 << 20


def check_replaceable(path: Path, option: str, what: str) -> Path:
    """Refuses, before any work, an output that xspec may not fill: a file, a path that cannot be created,
    or a directory holding anything but an earlier output xspec wrote there (`what` names it: "export")."""
    check_output_dir(path, option)
    if path.is_symlink():       # replacing would swap the link for a directory, leaving what it names
        raise UserError(f"{option} {shown(path)}: a symlink; give the directory itself")
    if not path.is_dir() or not any(path.iterdir()):
        return path
    stray = _unwritten(path)
    if stray is not None:
        entry, changed = stray
        said = "which has changed since xspec wrote it" if changed else f"which no xspec {what} wrote there"
        raise UserError(f"{option} {shown(path)}: holds {shown(entry)}, {said}; give a new or empty directory "
                        f"(xspec replaces only a directory it wrote, as it left it)")
    if not os.access(path.resolve().parent, os.W_OK | os.X_OK):
        raise UserError(f"{option} {shown(path)}: cannot replace it (no permission to write in its parent)")
    return path


def _unwritten(path: Path) -> tuple[str, bool] | None:
    """The first entry of `path` its record does not list (the record itself if it is missing or unreadable),
    else the first file it lists whose size or time differs (True: changed since); None where none."""
    try:
        record = parse_json(read_regular_file(path / WRITTEN, MAX_RECORD_BYTES), shown(path / WRITTEN))
    except UserError:
        return min(_entries(path), default=WRITTEN), False     # the record itself, when it is all there is
    files = record.get("files") if isinstance(record, dict) else None
    listed = set(files) if isinstance(files, list) and all(isinstance(f, str) for f in files) else set()
    stray = next((entry for entry in sorted(_entries(path)) if entry not in listed), None)
    if stray is not None:
        return stray, False
    stamps = record.get("stamps") if isinstance(record, dict) else None     # none in records of older versions
    if not isinstance(stamps, dict):
        return None
    changed = (entry for entry in sorted(listed) if entry in stamps and stamps[entry] != _stamp(path / entry))
    return next(((entry, True) for entry in changed), None)


def _stamp(path: Path) -> list[int] | None:
    """A regular file's size and modification time (ns), which an edit changes; None for anything else."""
    try:
        status = os.lstat(path)
    except OSError:
        return None
    return [status.st_size, status.st_mtime_ns] if stat.S_ISREG(status.st_mode) else None


def _entries(path: Path) -> set[str]:
    """Every file, link and folder under `path` (relative, '/'-separated), the record excepted."""
    found: set[str] = set()
    for folder, directories, files in os.walk(path):
        relative = Path(folder).relative_to(path)
        found.update((relative / name).as_posix() for name in (*directories, *files))
    return found - {WRITTEN}


def write_directory(path: Path, fill: Callable[[Path], None], writer: str) -> None:
    """Calls `fill(staging)` to write a staging folder beside `path`, records what it holds, then renames it
    to `path`, so `path` is never half written; an earlier output there is replaced once the new one is
    complete. Call check_replaceable first. `writer` ("xspec export") goes into the record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(path)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        with _held(staging / WRITTEN, writer):
            fill(staging)
            files = sorted(_entries(staging))
            stamps = {entry: stamp for entry in files if (stamp := _stamp(staging / entry)) is not None}
            record = {"writer": writer, "files": files, "stamps": stamps}
            (staging / WRITTEN).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        os.chmod(staging, 0o777 & ~current_umask())   # mkdtemp creates it 0o700
        _move_into_place(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)     # left only when something failed


def _move_into_place(staging: Path, path: Path) -> None:
    if not path.exists():
        os.rename(staging, path)
        return
    previous = staging.with_name(staging.name + ".old")
    os.rename(path, previous)
    try:
        os.rename(staging, path)
    except OSError:
        os.rename(previous, path)
        raise
    shutil.rmtree(previous, ignore_errors=True)


@contextlib.contextmanager
def _held(record: Path, writer: str) -> Iterator[None]:
    """The staging folder's record, written first and locked while the folder is being filled: a folder
    whose record is unlocked was left by a writer that died."""
    with open(record, "w", encoding="utf-8") as handle:
        handle.write(json.dumps({"writer": writer, "files": None}) + "\n")
        handle.flush()
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _remove_leftovers(path: Path) -> None:
    """Staging folders of `path` that a killed writer left: named as write_directory names them, holding
    its record, and not locked by a living writer."""
    if fcntl is None:
        return
    for candidate in path.parent.glob(f".{path.name}.*.tmp"):
        record = candidate / WRITTEN
        if candidate.is_symlink() or not candidate.is_dir() or record.is_symlink() or not record.is_file():
            continue
        with open(record, "rb") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue                   # a writer is filling it now
            shutil.rmtree(candidate, ignore_errors=True)
