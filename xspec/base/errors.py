"""Errors a user can cause. The CLI renders these as one clear message, never a traceback."""

from __future__ import annotations

from typing import Literal


class UserError(Exception):
    """A mistake in the user's input (a file, a flag, a checkpoint), not a bug in xspec.

    `str(error)` is the whole message; name the file and line where there is one
    (e.g. ``train.de:17: invalid UTF-8``).
    """

    exit_code = 1


class SpecError(UserError):
    """A spec with errors. `str(error)` is the rendered diagnostics; `.diagnostics` the records."""

    exit_code = 2

    def __init__(self, rendered: str, diagnostics: list) -> None:
        super().__init__(rendered)
        self.diagnostics = diagnostics


# What a command was processing when it failed: the CLI's last resort names it (xspec/cli.py).
_INPUT_ATTRIBUTE = "_xspec_processing"


class processing:
    """`with processing("train.txt:17"):` marks an exception raised inside with the input being processed
    (the innermost mark wins), so that a failure that is xspec's fault still says where it happened."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> Literal[False]:      # never swallows the exception
        if error is not None and not hasattr(error, _INPUT_ATTRIBUTE):
            try:
                setattr(error, _INPUT_ATTRIBUTE, self.what)
            except (AttributeError, TypeError):    # an exception type without a __dict__
                pass
        return False


def input_of(error: BaseException) -> str | None:
    """The input `processing` marked `error` with, if any."""
    what = getattr(error, _INPUT_ATTRIBUTE, None)
    return what if isinstance(what, str) else None
