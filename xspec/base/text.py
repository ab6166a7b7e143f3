"""Text from input shown safely: one escaping for whatever a file, a path or a record supplies before it
reaches a terminal, a message or a generated file. A control character (a newline in a file name, an
ANSI escape in a config key) is shown as its Python escape, so it can neither start a line of its own
nor be obeyed by a terminal."""

from __future__ import annotations

from os import PathLike


def printable(text: str) -> str:
    """`text` with every non-printable character (controls, line breaks, format characters) escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def shown(path: str | PathLike) -> str:
    """A path as messages show it."""
    return printable(str(path))


def printable_lines(text: str) -> str:
    """A message of several lines, each escaped: its own line breaks kept, nothing else a terminal obeys."""
    return "\n".join(printable(line) for line in text.split("\n"))
