"""Reading a text file's lines, with invalid UTF-8 reported as `file:line` (as the runtime's corpus reader
does; this one does not import the runtime, so `xspec treebank` starts without loading torch)."""

from __future__ import annotations

from pathlib import Path

from xspec.base.errors import UserError
from xspec.base.files import read_regular_file


def read_lines(path: Path) -> list[str]:
    """The lines of the regular file at `path`, without line endings (a last line may lack its newline)."""
    data = read_regular_file(Path(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise UserError(f"{path}:{line}: invalid UTF-8 (byte 0x{data[error.start]:02x})") from None
    return text.removesuffix("\n").split("\n") if text else []
