"""Errors a user can cause. The CLI renders these as one clear message, never a traceback."""

from __future__ import annotations


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
