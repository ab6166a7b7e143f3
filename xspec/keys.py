"""The keys of the `train`, `data` and `decode` sections, listed from their schemas (compiler/sections.py):
`xspec keys`, and docs/keys.md, which a test keeps equal to `xspec keys --markdown`."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Literal

from annotated_types import Ge, Gt, Le, Lt
from pydantic.fields import FieldInfo


@dataclass(frozen=True)
class Key:
    name: str              # train.warmup_steps
    type: str              # int >= 1
    default: str           # 4000
    meaning: str
    fine_tuning: str = ""  # the value `xspec train --init` starts from, where it sets one


def section_keys() -> list[Key]:
    from xspec.compiler.sections import FINE_TUNING, SECTIONS

    return [Key(f"{section}.{name}", _type(field), _default(field.default), field.description or "",
                _default(FINE_TUNING[f"{section}.{name}"]) if f"{section}.{name}" in FINE_TUNING else "")
            for section, schema in SECTIONS.items() for name, field in schema.model_fields.items()]


def _type(field: FieldInfo) -> str:
    return " ".join([_annotation(field.annotation), *_bounds(field.metadata)])


def _bounds(metadata: list) -> list[str]:
    return [f"{symbol} {_literal(getattr(m, attr))}" for m in metadata
            for kind, symbol, attr in ((Ge, ">=", "ge"), (Gt, ">", "gt"), (Le, "<=", "le"), (Lt, "<", "lt"))
            if isinstance(m, kind)]


def _annotation(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(f'"{a}"' for a in args)
    if origin is typing.Annotated:
        return " ".join([_annotation(args[0]), *_bounds([b for m in args[1:] for b in getattr(m, "metadata", [m])])])
    if origin is typing.Union:
        named = " | ".join(_annotation(a) for a in args if a is not type(None))
        return named + " | none" if type(None) in args else named
    if origin is tuple:     # written as a list in a spec
        return "[" + ", ".join("..." if a is Ellipsis else _annotation(a) for a in args) + "]"
    return getattr(annotation, "__name__", str(annotation))


def _default(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return "[" + ", ".join(_default(v) for v in value) + "]"
    return f'"{value}"' if isinstance(value, str) else _literal(value)


def _literal(value: Any) -> str:
    """A value as a spec writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int):
        return f"{value:_}" if value >= 10_000 else str(value)
    return str(value)


def render_text(keys: list[Key]) -> str:
    width = max(len(k.name) for k in keys)
    lines = []
    for k in keys:
        tuned = f"; train --init: {k.fine_tuning}" if k.fine_tuning else ""
        lines.append(f"{k.name:<{width}}  {k.type}, default {k.default}{tuned}")
        lines.append(f"{'':<{width}}  {k.meaning}")
    return "\n".join(lines) + "\n"


def render_markdown(keys: list[Key]) -> str:
    lines = ["| key | type | default | `train --init` | meaning |", "|---|---|---|---|---|"]
    lines += [f"| `{k.name}` | {k.type.replace('|', '&#124;')} | `{k.default}` | "
              f"{f'`{k.fine_tuning}`' if k.fine_tuning else ''} | {k.meaning.replace('|', '&#124;')} |"
              for k in keys]
    return "\n".join(lines) + "\n"
