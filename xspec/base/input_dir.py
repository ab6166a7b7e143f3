"""A directory a user gives xspec to read (a checkpoint, a prepared corpus): its files are read only from
inside it.

The rule for symlinks: a link is followed when its target lies inside the directory given, and refused,
naming the link and where it leads, when it leads out. A Hugging Face cache snapshot
(`models--ORG--NAME/snapshots/REVISION/`) is one exception by its layout: its files are links into the
same model's `blobs/` folder, which therefore counts as inside. Every file is then opened as
xspec/base/files.py opens any input: regular files only, never blocking."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from xspec.base.errors import UserError
from xspec.base.files import UnreadableFile, open_regular_file, read_regular_file
from xspec.base.strict_json import parse_json
from xspec.base.text import shown


@dataclass(frozen=True)
class InputDirectory:
    path: Path                    # as given: messages name files under it
    roots: tuple[Path, ...]       # where its files may really lie (resolved)

    @classmethod
    def open(cls, path: Path, what: str) -> "InputDirectory":
        """The directory at `path`; anything else is refused, naming `what` was expected there."""
        path = Path(path)
        try:
            is_dir = path.is_dir()
        except (OSError, ValueError):
            is_dir = False
        if not is_dir:
            raise UserError(f"{shown(path)}: {_why_not_a_directory(path)} ({what} is expected)")
        real = Path(os.path.realpath(path))
        roots = [real]
        blobs = real.parent.parent / "blobs"
        if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--") and blobs.is_dir():
            roots.append(Path(os.path.realpath(blobs)))
        return cls(path, tuple(roots))

    def file(self, name: str) -> Path:
        """The path of `name` in the directory, for messages (reading goes through `checked`)."""
        return self.path / name

    def has(self, name: str) -> bool:
        """Whether an entry of that name is there (a dangling or outward link counts: reading it says why)."""
        return os.path.lexists(self.path / name)

    def checked(self, name: str) -> Path:
        """The path of `name`, after checking that it leads nowhere outside the directory."""
        path = self.path / name
        real = Path(os.path.realpath(path))
        if not any(real == root or root in real.parents for root in self.roots):
            raise UnreadableFile(path, f"a symlink leading out of {shown(self.path)} (to {shown(real)}); "
                                       "xspec follows links only inside the directory it is given")
        return path

    def open_file(self, name: str) -> BinaryIO:
        return open_regular_file(self.checked(name))

    def read(self, name: str, max_bytes: int | None = None) -> bytes:
        return read_regular_file(self.checked(name), max_bytes)

    def read_json(self, name: str, max_bytes: int) -> Any:
        return parse_json(self.read(name, max_bytes), shown(self.path / name))


def _why_not_a_directory(path: Path) -> str:
    if os.path.lexists(path):
        return "a symlink to a missing directory" if os.path.islink(path) and not path.exists() else "not a directory"
    above = path.parent
    while above != above.parent and not os.path.lexists(above):
        above = above.parent
    if os.path.lexists(above) and not above.is_dir():
        return f"{shown(above)} is a file, not a directory"
    return "no such directory"
