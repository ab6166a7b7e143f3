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


class Diagnostics:
    """Collects diagnostics from every stage; knows the source texts to quote them."""

    def __init__(self) -> None:
        self.records: list[Diagnostic] = []
        self.sources: dict[str, str] = {}

    def error(self, code: str, span: Span, message: str, hint: Optional[str] = None) -> None:
        self._add(Diagnostic(code, "error", span, message, hint))

    def warning(self, code: str, span: Span, message: str, hint: Optional[str] = None) -> None:
        self._add(Diagnostic(code, "warning", span, message, hint))

    def _add(self, diagnostic: Diagnostic) -> None:
        # A mistake inside a repeated layer is met once per layer; say it once.
        if diagnostic not in self.records:
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
        return "\n".join(self._render_one(d) for d in ordered)

    def _render_one(self, d: Diagnostic) -> str:
        where = "<command line>" if d.span is COMMAND_LINE or d.span.line == 0 else str(d.span)
        lines = [f"{where}: {d.severity}: {d.message} [{d.code}]"]
        source = self.sources.get(d.span.file)
        if source is not None and d.span.line > 0:
            text = source.splitlines()[d.span.line - 1] if d.span.line <= len(source.splitlines()) else ""
            width = (d.span.end_col - d.span.col) if d.span.end_line == d.span.line else len(text) - d.span.col + 1
            lines.append("    " + text)
            lines.append("    " + " " * (d.span.col - 1) + "^" + "~" * max(width - 1, 0))
        if d.hint:
            lines.append(f"  hint: {d.hint}")
        return "\n".join(lines)


def did_you_mean(name: str, candidates: Iterable[str]) -> Optional[str]:
    """A hint naming the closest candidate, if one is close enough to be a likely typo."""
    matches = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return f"did you mean '{matches[0]}'?" if matches else None
