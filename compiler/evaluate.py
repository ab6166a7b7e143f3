"""A small, safe evaluator for constant expressions (parameters, section values, op attributes).

It walks the AST itself: spec text is data and is never handed to Python's `eval`.
"""

from __future__ import annotations

import math
import operator
from typing import Callable, Optional, Union

from . import ast
from .diagnostics import Span

Constant = Union[int, float, bool, str, tuple]


class ConstantError(Exception):
    def __init__(self, code: str, span: Span, message: str, hint: Optional[str] = None) -> None:
        super().__init__(message)
        self.code, self.span, self.message, self.hint = code, span, message, hint


class InexactQuotient(float):
    """`a / b` of two integers that does not divide evenly. It is a float, but remembers its
    operands so that using it as a size can say *why* it is not an integer."""

    numerator: int
    denominator: int
    expr: ast.BinOp  # where the division is written

    def __new__(cls, numerator: int, denominator: int, expr: ast.BinOp) -> "InexactQuotient":
        value = super().__new__(cls, numerator / denominator)
        value.numerator, value.denominator, value.expr = numerator, denominator, expr
        return value

    def explain(self) -> tuple[str, str]:
        """A message and a hint for using this value where a whole number is needed."""
        left, right = _operand_text(self.expr.left), _operand_text(self.expr.right)
        return (f"{left} / {right} = {self.numerator} / {self.denominator} is not a whole number",
                f"{left} ({self.numerator}) must be divisible by {right} ({self.denominator})")


MATH_FUNCTIONS: dict[str, Callable[..., Constant]] = {
    "sqrt": math.sqrt,
    "exp": math.exp,
    "log": math.log,
    "min": min,
    "max": max,
    "abs": abs,
    "int": int,
    "float": float,
    "round": round,
}

_ARITHMETIC: dict[str, Callable] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
    "%": operator.mod, "**": operator.pow,
}
_COMPARE: dict[str, Callable] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge,
}

Lookup = Callable[[ast.Name], Constant]


def evaluate(expr: ast.Expr, lookup: Lookup) -> Constant:
    """The value of a constant expression; names are resolved by `lookup` (which may raise)."""
    if isinstance(expr, ast.Literal):
        return expr.value
    if isinstance(expr, ast.Name):
        return lookup(expr)
    if isinstance(expr, ast.ListExpr):
        return tuple(evaluate(item, lookup) for item in expr.items)
    if isinstance(expr, ast.UnaryOp):
        value = evaluate(expr.operand, lookup)
        if expr.op == "not":
            return not _require_bool(value, expr.operand.span)
        return -_require_number(value, expr.operand.span)
    if isinstance(expr, ast.BinOp):
        return _binop(expr, lookup)
    if isinstance(expr, ast.Call):
        return _call(expr, lookup)
    raise ConstantError("not-constant", expr.span, "a function is not a constant value")


def _binop(expr: ast.BinOp, lookup: Lookup) -> Constant:
    left = evaluate(expr.left, lookup)
    if expr.op in ("and", "or"):  # short-circuit, as a reader expects
        if _require_bool(left, expr.left.span) == (expr.op == "or"):
            return left
        return _require_bool(evaluate(expr.right, lookup), expr.right.span)
    right = evaluate(expr.right, lookup)
    if expr.op in _COMPARE:
        if type(left) is not type(right) and not (_is_number(left) and _is_number(right)):
            raise ConstantError("type", expr.op_span, f"cannot compare {describe(left)} with {describe(right)}")
        return _COMPARE[expr.op](left, right)
    if expr.op == "+" and isinstance(left, str) and isinstance(right, str):
        return left + right
    left = _require_number(left, expr.left.span)
    right = _require_number(right, expr.right.span)
    if expr.op in ("/", "//", "%") and right == 0:
        raise ConstantError("value", expr.op_span, "division by zero")
    if expr.op == "/":
        if isinstance(left, int) and isinstance(right, int):
            if left % right == 0:
                return left // right
            return InexactQuotient(left, right, expr)
        return left / right
    try:
        return _ARITHMETIC[expr.op](left, right)
    except (OverflowError, ValueError) as error:
        raise ConstantError("value", expr.op_span, f"cannot compute {expr.op}: {error}") from None


def _call(expr: ast.Call, lookup: Lookup) -> Constant:
    function = MATH_FUNCTIONS.get(expr.callee.id)
    if function is None or expr.kwargs or expr.label:
        raise ConstantError(
            "not-constant", expr.span,
            f"'{expr.callee.id}(...)' is not a constant expression",
            hint="constant expressions may call " + ", ".join(sorted(MATH_FUNCTIONS)),
        )
    args = [_require_number(evaluate(a, lookup), a.span) for a in expr.args]
    try:
        return function(*args)
    except (TypeError, ValueError, OverflowError) as error:
        raise ConstantError("value", expr.span, f"{expr.callee.id}: {error}") from None


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require_number(value: Constant, span: Span) -> Union[int, float]:
    if not _is_number(value):
        raise ConstantError("type", span, f"expected a number, got {describe(value)}")
    return value  # type: ignore[return-value]


def _require_bool(value: Constant, span: Span) -> bool:
    if not isinstance(value, bool):
        raise ConstantError("type", span, f"expected true or false, got {describe(value)}")
    return value


def describe(value: object) -> str:
    """How a value is named in messages: 'a number (512)', 'a string ('relu')', ..."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, tuple):
        return "a list"
    return "a function"


def _operand_text(e: ast.Expr) -> str:
    return e.id if isinstance(e, ast.Name) else repr(e.value) if isinstance(e, ast.Literal) else "(...)"
