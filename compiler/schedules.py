"""A schedule's kinds: a list parameter that layers read by their index and compare with strings
(`if layer_types[i] == "sliding_attention"`) may hold only kinds the spec names, in those comparisons
or in the list's last line in the spec's files (its default, or a derived model's `set`, which may
name kinds of its own). Any other kind, from a `--set` or another parameter, would silently take every
`else` branch."""

from __future__ import annotations

from typing import Iterator, Mapping

from xspec.base.text import printable

from . import ast
from .diagnostics import COMMAND_LINE, Diagnostics
from .evaluate import Constant


def check_schedules(blocks: Mapping[str, ast.Block], ties: list[ast.Tie], lines: Mapping[str, list[ast.Param]],
                    written: Mapping[str, ast.Param], params: Mapping[str, Constant],
                    diagnostics: Diagnostics) -> None:
    """`lines`: each parameter's `param` and `set` lines in the files; `written`: the line (or `--set`) that
    last gave its value."""
    compared: dict[str, set[str]] = {}
    conditions = [tie.condition for tie in ties if tie.condition is not None]
    for expr in [*conditions, *(e for block in blocks.values() for e in _expressions(block.body))]:
        for name, kind in _comparisons(expr):
            compared.setdefault(name, set()).add(kind)
    for name, kinds in compared.items():
        value = params.get(name)
        if not isinstance(value, tuple) or name not in written:
            continue
        named = kinds.union(_strings(lines[name][-1].value)) if lines.get(name) else kinds
        bad = next(((i, item) for i, item in enumerate(value) if isinstance(item, str) and item not in named), None)
        if bad is None:
            continue
        span = written[name].value.span
        where = f"--set {name}: " if span is COMMAND_LINE else ""
        listed = ", ".join(f"'{printable(kind)}'" for kind in sorted(named))
        diagnostics.error("value", span, f"{where}{name}[{bad[0]}] is '{printable(bad[1])[:80]}', a kind no layer of "
                          f"the spec names (it names {listed})",
                          "the layers read their kind from this list by index; a kind no `if` names would "
                          "silently take the `else` branch")


def _expressions(body: tuple[ast.Stmt, ...]) -> Iterator[ast.Expr]:
    pending = list(body)
    while pending:
        stmt = pending.pop()
        if isinstance(stmt, ast.If):
            yield stmt.condition
            pending += [*stmt.then, *stmt.orelse]
        elif isinstance(stmt, ast.Repeat):
            yield stmt.count
            pending += stmt.body
        else:
            yield stmt.value


def _children(expr: ast.Expr) -> tuple[ast.Expr, ...]:
    if isinstance(expr, ast.BinOp):
        return expr.left, expr.right
    if isinstance(expr, ast.UnaryOp):
        return (expr.operand,)
    if isinstance(expr, ast.Index):
        return expr.value, expr.index
    if isinstance(expr, ast.ListExpr):
        return expr.items
    if isinstance(expr, ast.Call):
        return (*expr.args, *(k.value for k in expr.kwargs))
    if isinstance(expr, ast.Lambda):
        return (expr.body,)
    return ()


def _walk(expr: ast.Expr) -> Iterator[ast.Expr]:
    pending = [expr]
    while pending:
        node = pending.pop()
        yield node
        pending += _children(node)


def _comparisons(expr: ast.Expr) -> Iterator[tuple[str, str]]:
    """(list, kind) for each `list[...] == "kind"` or `!=` in `expr`, either way round."""
    for node in _walk(expr):
        if not isinstance(node, ast.BinOp) or node.op not in ("==", "!="):
            continue
        for item, other in ((node.left, node.right), (node.right, node.left)):
            if isinstance(item, ast.Index) and isinstance(item.value, ast.Name) and \
                    isinstance(other, ast.Literal) and isinstance(other.value, str):
                yield item.value.id, other.value


def _strings(expr: ast.Expr) -> Iterator[str]:
    for node in _walk(expr):
        if isinstance(node, ast.Literal) and isinstance(node.value, str):
            yield node.value
