"""Long lines of generated code wrapped at a call's arguments: the generated blocks' lines, hanging (the
arguments on the lines after the call's head)."""

from __future__ import annotations

from typing import Optional

INDENT = "    "
LINE_LIMIT = 100  # generated lines are shorter than this


def wrap(code: str, comment: str, indent: str) -> list[str]:
    """`code  # comment` on one line, or, where that is too long, its outermost call's arguments on the
    lines after it (the comment stays on the first), an argument too long for a line wrapped so too."""
    line = f"{indent}{code}  # {comment}"
    if len(line) < LINE_LIMIT or outer_call(code) is None:
        return [line]
    first, *rest = wrapped(code, indent, split=True)
    return [f"{first}  # {comment}", *rest]


def wrapped(code: str, indent: str, split: bool = False) -> list[str]:
    """`code` (ending in a call) over several lines: the call's head, then its arguments packed."""
    opening = outer_call(code)
    if (len(indent + code) < LINE_LIMIT and not split) or opening is None:
        return [indent + code]
    head, inner, close = code[:opening + 1], code[opening + 1:-1], ")"
    if inner.startswith("{") and inner.endswith("}"):  # nn.ModuleDict({...}): the dict's items
        head, inner, close = head + "{", inner[1:-1], "})"
    lines, current = [indent + head], ""
    inner_indent = indent + INDENT
    for item in split_arguments(inner):
        candidate = f"{current}, {item}" if current else item
        if len(inner_indent + candidate) + len(close) + 1 < LINE_LIMIT:
            current = candidate
            continue
        if current:
            lines.append(f"{inner_indent}{current},")
        if len(inner_indent + item) + len(close) + 1 >= LINE_LIMIT and outer_call(item) is not None:
            *middle, last = wrapped(item, inner_indent)
            lines += middle
            current = last[len(inner_indent):]
        else:
            current = item
    lines.append(f"{inner_indent}{current}{close}")
    return lines


def outer_call(code: str) -> Optional[int]:
    """The position of the opening parenthesis of the call that ends `code`, if one does."""
    if not code.endswith(")"):
        return None
    depths = _depths(code)
    openers = [i for i in range(len(code) - 1) if code[i] in "([{" and depths[i] == depths[-1]]
    return openers[-1] if openers else None


def split_arguments(text: str) -> list[str]:
    """Top-level comma-separated items of an argument list (brackets and strings respected)."""
    depths = _depths(text)
    cuts = [i for i, char in enumerate(text) if char == "," and depths[i] == 0]
    items = [text[start + 1:end].strip() for start, end in zip([-1, *cuts], [*cuts, len(text)])]
    return items[:-1] if items and not items[-1] else items


def _depths(text: str) -> list[Optional[int]]:
    """Each character's bracket depth (the brackets opened before it and not closed), None inside a
    string literal."""
    depths: list[Optional[int]] = []
    depth, quote = 0, None
    for char in text:
        if quote is not None or char in "'\"":
            depths.append(None)
            quote = char if quote is None else (None if char == quote else quote)
            continue
        depth -= char in ")]}"
        depths.append(depth)
        depth += char in "([{"
    return depths
