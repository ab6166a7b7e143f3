"""Diagnostics: errors and warnings collected as records, rendered once.

Every stage reports into one `Diagnostics` collector instead of raising at the first problem, so a
user sees all the errors of a file at once. Rendering follows the compilers people know:

    specs/bad.xspec:12:9: error: unknown op 'atention' [unknown-name]
        x = atention(x, x, x)
            ^~~~~~~~
      hint: did you mean 'attention'?
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Iterable, Literal, Optional

from xspec.base.text import printable

from .codes import CODES
from .limits import MAX_ERRORS, MAX_HINT_CANDIDATES

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Span:
    """A region of a source file; lines and columns are 1-based, `end_col` is exclusive."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


COMMAND_LINE = Span("<command line>", 0, 0, 0, 0)


@dataclass(frozen=True)
class Diagnostic:
    code: str
    severity: Severity
    span: Span
    message: str
    hint: Optional[str] = None


class TooManyErrors(Exception):
    """MAX_ERRORS errors were reported: the compiler stops rather than drown the first ones."""


class Diagnostics:
    """Collects diagnostics from every stage; knows the source texts to quote them."""

    def __init__(self) -> None:
        self.records: list[Diagnostic] = []
        self.sources: dict[str, str] = {}
        self.stopped_early = False  # MAX_ERRORS was reached
        self._seen: set[Diagnostic] = set()
        self._lines: dict[str, list[str]] = {}

    def error(self, code: str, span: Span, message: str, hint: Optional[str] = None) -> None:
        self._add(Diagnostic(code, "error", span, message, hint))
        if len(self.errors) >= MAX_ERRORS:
            self.stopped_early = True
            raise TooManyErrors()

    def warning(self, code: str, span: Span, message: str, hint: Optional[str] = None) -> None:
        if len(self.records) < 2 * MAX_ERRORS:  # beyond that, warnings are noise
            self._add(Diagnostic(code, "warning", span, message, hint))

    def _add(self, diagnostic: Diagnostic) -> None:
        assert diagnostic.code in CODES, f"diagnostic code {diagnostic.code!r} is not in compiler/codes.py"
        # A mistake inside a repeated layer is met once per layer; say it once.
        if diagnostic not in self._seen:
            self._seen.add(diagnostic)
            self.records.append(diagnostic)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.records if d.severity == "error"]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.records if d.severity == "warning"]

    def render(self, records: Optional[Iterable[Diagnostic]] = None) -> str:
        chosen = self.records if records is None else list(records)
        ordered = sorted(chosen, key=lambda d: (d.span.file, d.span.line, d.span.col))
        rendered = [self._render_one(d) for d in ordered]
        if self.stopped_early and records is None:
            rendered.append(f"xspec: stopped after {MAX_ERRORS} errors")
        return "\n".join(rendered)

    def _render_one(self, d: Diagnostic) -> str:
        where = "<command line>" if d.span is COMMAND_LINE or d.span.line == 0 else printable(str(d.span))
        lines = [f"{where}: {d.severity}: {d.message} [{d.code}]"]
        text = self._line(d.span.file, d.span.line)
        if text is not None:
            width = (d.span.end_col - d.span.col) if d.span.end_line == d.span.line else len(text) - d.span.col + 1
            shown, col = _excerpt(text, d.span.col)
            lines.append("    " + shown)
            lines.append("    " + " " * (col - 1) + "^" + "~" * min(max(width - 1, 0), len(shown) - col))
        if d.hint:
            lines.append(f"  hint: {d.hint}")
        return "\n".join(lines)

    def _line(self, file: str, line: int) -> Optional[str]:
        """Line `line` of `file` as the parser counts lines (at '\\n' only), if the source is known."""
        if file not in self._lines:
            source = self.sources.get(file)
            if source is None:
                return None
            self._lines[file] = source.split("\n")
        lines = self._lines[file]
        return lines[line - 1] if 0 < line <= len(lines) else None


EXCERPT_WIDTH = 160  # characters of a source line quoted under a diagnostic


def _excerpt(text: str, col: int) -> tuple[str, int]:
    """The part of a source line worth quoting, made printable, and the column within it."""
    start = max(0, min(col - 1 - EXCERPT_WIDTH // 2, len(text) - EXCERPT_WIDTH))
    shown = "".join(c if c.isprintable() else " " for c in text[start:start + EXCERPT_WIDTH])
    if start > 0:
        shown, col = "..." + shown[3:], col - start
    if start + EXCERPT_WIDTH < len(text):
        shown = shown[:-3] + "..."
    return shown, col


def did_you_mean(name: str, candidates: Iterable[str]) -> Optional[str]:
    """A hint naming the closest candidate, if one is close enough to be a likely typo.

    Only the MAX_HINT_CANDIDATES candidates closest in length are compared: a spec with thousands of
    names must not make each of its errors cost a comparison with every one of them."""
    unique = set(candidates)
    if len(unique) > MAX_HINT_CANDIDATES:
        unique = set(sorted(unique, key=lambda c: (abs(len(c) - len(name)), c))[:MAX_HINT_CANDIDATES])
    matches = difflib.get_close_matches(name, sorted(unique), n=1, cutoff=0.6)
    return f"did you mean '{matches[0]}'?" if matches else None
