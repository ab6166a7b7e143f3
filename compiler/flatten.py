"""One self-contained spec text for a resolved model: imports inlined, parameters as literals.

A run directory keeps this text, so a checkpoint can be rebuilt without the files it came from.
"""

from __future__ import annotations

from pydantic import BaseModel

from xspec.base.text import printable

from .diagnostics import Span
from .parse import quote
from .resolve import ResolvedModel
from .sections import SECTIONS


class TooLarge(Exception):
    """The resolved spec would exceed the size limit of a self-contained spec."""


def flatten(model: ResolvedModel, max_bytes: int) -> str:
    """The resolved spec's text; TooLarge if it would exceed `max_bytes` (checked as it is written,
    since parameters that all name one long list would otherwise multiply it)."""
    lines = [f"# Resolved from {printable(model.span.file)} by xspec: parameters are final values.",
             f"model {model.name} {{"]
    size = 0
    for name, value in model.params.items():
        allowed = f" in {literal(model.choices[name])}" if name in model.choices else ""
        lines.append(f"  param {name} = {literal(value)}{allowed}")
        size += len(lines[-1])
        if size > max_bytes:
            raise TooLarge()
    for block in model.blocks.values():
        lines += ["", "  " + _source(model, block.span)]
    if model.written_ties:
        lines.append("")
    for tie in model.written_ties:    # each under its condition: a --set of the run's spec may change it
        text = "tie " + ", ".join(str(p) for p in tie.paths)
        if tie.condition is None:
            lines.append(f"  {text}")
        else:
            lines += [f"  if {_source(model, tie.condition.span)} {{", f"    {text}", "  }"]
    for name in SECTIONS:
        lines += ["", f"  {name} {{", *_section_entries(model.sections[name]), "  }"]
    lines.append("}")
    text = "\n".join(lines) + "\n"
    if len(text.encode("utf-8")) > max_bytes:
        raise TooLarge()
    return text


def literal(value: object) -> str:
    """Spec syntax for a constant."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    return repr(float(value)) if isinstance(value, float) else repr(value)


def _section_entries(section: BaseModel) -> list[str]:
    return [f"    {key} = {literal(value)}" for key, value in section.model_dump().items() if value is not None]


def _source(model: ResolvedModel, span: Span) -> str:
    """The text a span covers, in the file it came from."""
    lines = model.files[span.file].split("\n")[span.line - 1: span.end_line]  # lines as the parser counts them
    lines[-1] = lines[-1][: span.end_col - 1]
    lines[0] = lines[0][span.col - 1:]
    return "\n".join(lines)
