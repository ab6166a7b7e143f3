"""Long lines of generated code wrapped at a call's arguments: the generated blocks' lines, hanging (the
arguments on the lines after the call's head); and long arithmetic at its operators."""

from __future__ import annotations

import ast
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


# Binding strength of the operators arithmetic is split at; a split operation is parenthesized whole.
_PRECEDENCE = {ast.Add: 1, ast.Sub: 1, ast.Mult: 2, ast.Div: 2, ast.FloorDiv: 2, ast.Mod: 2, ast.Pow: 3}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}


def assignment(target: str, code: str, indent: str) -> list[str]:
    """`target = code` on one line, or where too long, the expression in parentheses split at its
    operators, each operand on a line of its own (as far as it must be)."""
    line = f"{indent}{target} = {code}"
    expression = ast.parse(code, mode="eval").body
    if len(line) < LINE_LIMIT or not (isinstance(expression, ast.BinOp) and type(expression.op) in _SYMBOLS):
        return [line]
    # Split even where the expression alone would fit the line: the target is on it too.
    laid = _laid_out(expression, indent, 0, False, split=True)  # "(", the operands a level in, ... ")"
    return [f"{indent}{target} = (", *laid[1:]]


def _laid_out(node: ast.expr, indent: str, outer: int, right: bool, split: bool = False) -> list[str]:
    """`node` at `indent`: one line, or (too long for one, or `split`) a parenthesized operation over
    several lines."""
    strength = _PRECEDENCE.get(type(node.op), 0) if isinstance(node, ast.BinOp) else 0
    text = ast.unparse(node)
    grouped = isinstance(node, ast.BinOp) and (strength < outer or (right and strength == outer))
    if grouped:
        text = f"({text})"
    if not isinstance(node, ast.BinOp) or type(node.op) not in _SYMBOLS or (
            not split and len(indent + text) < LINE_LIMIT):
        return [indent + text]
    inner = indent + INDENT
    left = _laid_out(node.left, inner, strength, False)
    right_lines = _laid_out(node.right, inner, strength, True)
    right_lines[0] = f"{inner}{_SYMBOLS[type(node.op)]} {right_lines[0].lstrip()}"
    return [f"{indent}(", *left, *right_lines[:-1], right_lines[-1] + ")"]
