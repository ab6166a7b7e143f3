"""A small, safe evaluator for constant expressions (parameters, section values, op attributes).

It walks the AST itself: spec text is data and is never handed to Python's `eval`.
"""

from __future__ import annotations

import math
import operator
from typing import Callable, Optional, TypeVar, Union, overload

from . import ast
from .diagnostics import Span
from .limits import MAX_EXPONENT_BITS, MAX_INT, MAX_LIST_ITEMS, MAX_STRING, Budget

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


def _round(value: Union[int, float], ndigits: Optional[int] = None) -> Union[int, float]:
    """round(), except that an integer rounded to more digits than int64 has is 0 at once: Python
    computes 10 ** -ndigits first, which takes minutes for round(5, -10 ** 9)."""
    if ndigits is None:
        return round(value)
    if isinstance(value, int) and isinstance(ndigits, int) and ndigits < -len(str(MAX_INT)):
        return 0
    return round(value, ndigits)


MATH_FUNCTIONS: dict[str, Callable[..., Constant]] = {
    "sqrt": math.sqrt,
    "exp": math.exp,
    "log": math.log,
    "min": min,
    "max": max,
    "abs": abs,
    "int": int,
    "float": float,
    "round": _round,
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


def evaluate(expr: ast.Expr, lookup: Lookup, budget: Optional[Budget] = None) -> Constant:
    """The value of a constant expression; names are resolved by `lookup` (which may raise).

    Every value it returns passes `check_value`: integers within int64, finite floats, short strings.
    `budget`, when given, is charged one step per expression evaluated."""
    if budget is not None:
        budget.step(expr.span)
    if isinstance(expr, ast.Literal):
        return check_value(expr.value, expr.span)
    if isinstance(expr, ast.Name):
        return lookup(expr)
    if isinstance(expr, ast.ListExpr):
        return check_value(tuple(evaluate(item, lookup, budget) for item in expr.items), expr.span)
    if isinstance(expr, ast.Index):
        return _item(evaluate(expr.value, lookup, budget), evaluate(expr.index, lookup, budget), expr)
    if isinstance(expr, ast.UnaryOp):
        value = evaluate(expr.operand, lookup, budget)
        if expr.op == "not":
            return not _require_bool(value, expr.operand.span)
        return check_value(-_require_number(value, expr.operand.span), expr.span)
    if isinstance(expr, ast.BinOp):
        return check_value(_binop(expr, lookup, budget), expr.span)
    if isinstance(expr, ast.Call):
        return check_value(_call(expr, lookup, budget), expr.span)
    raise ConstantError("not-constant", expr.span, "a function is not a constant value")


def _item(items: Constant, index: Constant, expr: ast.Index) -> Constant:
    if not isinstance(items, tuple):
        raise ConstantError("type", expr.value.span, f"only a list has items, not {describe(items)}")
    if not isinstance(index, int) or isinstance(index, bool):
        raise ConstantError("type", expr.index.span, f"a list's item is chosen by a whole number, not "
                            f"{describe(index)}")
    if not 0 <= index < len(items):
        raise ConstantError("value", expr.span, f"item {index} of a list of {len(items)}: items are counted "
                            f"from 0 to {len(items) - 1}")
    return items[index]


# A scalar the checks accept comes back as it was given (they refuse values, never convert them).
_Scalar = TypeVar("_Scalar", bool, int, float, str)


@overload
def check_value(value: _Scalar, span: Span) -> _Scalar: ...
@overload
def check_value(value: object, span: Span) -> Constant: ...
def check_value(value: object, span: Span) -> Constant:
    """`value` if it is a constant the language allows; otherwise a ConstantError at `span`.

    Integers are sizes and counts, so they stay within int64; floats are finite (so generated code
    and flattened specs never need `inf` or `nan`); strings are short and plain (no control
    characters, which could break a file name, a log line or a generated docstring)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) > MAX_INT:
            raise ConstantError("too-large", span, f"integer out of range: {_magnitude(value)} exceeds the "
                                f"limit of {MAX_INT:,}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConstantError("value", span, f"{value} is not a finite number")
        return value
    if isinstance(value, str):
        if len(value) > MAX_STRING:
            raise ConstantError("too-large", span, f"a string of {len(value):,} characters exceeds the limit "
                                f"of {MAX_STRING:,}")
        if not value.isprintable():
            raise ConstantError("value", span, f"strings may not contain control characters: {value!r}"[:200])
        return value
    if isinstance(value, tuple):
        # Lists within lists could nest a parameter per level, deeper than any parser or printer goes.
        if any(isinstance(item, tuple) for item in value):
            raise ConstantError("type", span, "a list may hold numbers, booleans and strings, not lists")
        if len(value) > MAX_LIST_ITEMS:
            raise ConstantError("too-large", span, f"a list of {len(value):,} items exceeds the limit of "
                                f"{MAX_LIST_ITEMS:,}")
        for item in value:
            check_value(item, span)
        return value
    raise ConstantError("type", span, f"{describe(value)} is not a value a spec can hold")


def _magnitude(value: int) -> str:
    digits = value.bit_length() * 0.30103  # log10(2): never convert a huge integer to text
    return f"an integer of about {digits:,.0f} digits" if digits > 30 else f"{value:,}"


def _binop(expr: ast.BinOp, lookup: Lookup, budget: Optional[Budget]) -> Constant:
    left = evaluate(expr.left, lookup, budget)
    if expr.op in ("and", "or"):  # short-circuit, as a reader expects
        if _require_bool(left, expr.left.span) == (expr.op == "or"):
            return left
        return _require_bool(evaluate(expr.right, lookup, budget), expr.right.span)
    right = evaluate(expr.right, lookup, budget)
    if expr.op in _COMPARE:
        if type(left) is not type(right) and not (_is_number(left) and _is_number(right)):
            raise ConstantError("type", expr.op_span, f"cannot compare {describe(left)} with {describe(right)}")
        try:
            return _COMPARE[expr.op](left, right)
        except TypeError:  # lists compare item by item: [1] < ["a"] compares a number with a string
            raise ConstantError("type", expr.op_span, f"cannot compare {describe(left)} with {describe(right)}: "
                                "their items differ in type") from None
    if isinstance(left, tuple) or isinstance(right, tuple):
        return _list_arithmetic(expr, left, right)
    if expr.op == "+" and isinstance(left, str) and isinstance(right, str):
        if len(left) + len(right) > MAX_STRING:
            raise ConstantError("too-large", expr.op_span, f"a string of {len(left) + len(right):,} characters "
                                f"exceeds the limit of {MAX_STRING:,}")
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
    if expr.op == "**":
        _check_power(left, right, expr)
    try:
        result = _ARITHMETIC[expr.op](left, right)
    except (OverflowError, ValueError, ZeroDivisionError) as error:
        raise ConstantError("value", expr.op_span, f"cannot compute {expr.op}: {error}") from None
    if isinstance(result, complex):  # (-8) ** 0.5
        raise ConstantError("value", expr.op_span, f"{_operand(left)} ** {_operand(right)} is not a real number")
    return result


def _list_arithmetic(expr: ast.BinOp, left: Constant, right: Constant) -> Constant:
    """Lists joined (`a + b`) or repeated (`["sliding_attention"] * 5`), within the list limit."""
    if expr.op == "+" and isinstance(left, tuple) and isinstance(right, tuple):
        items, times = left + right, 1
    elif expr.op == "*" and isinstance(left, tuple) and type(right) is int:
        items, times = left, right
    elif expr.op == "*" and isinstance(right, tuple) and type(left) is int:
        items, times = right, left
    else:
        raise ConstantError("type", expr.op_span, f"'{expr.op}' of {describe(left)} and {describe(right)}: lists "
                            "are joined by + and repeated by * a whole number")
    if times < 0:
        raise ConstantError("value", expr.op_span, f"a list repeated {times} times: the count may not be negative")
    if len(items) * times > MAX_LIST_ITEMS:
        raise ConstantError("too-large", expr.op_span, f"a list of {len(items) * times:,} items exceeds the limit of "
                            f"{MAX_LIST_ITEMS:,}")
    return items * times


def _operand(value: Union[int, float]) -> str:
    return f"({value!r})" if value < 0 else repr(value)


def _check_power(base: Union[int, float], exponent: Union[int, float], expr: ast.BinOp) -> None:
    """Refuse an integer power beyond int64 before computing it: 10 ** 10 ** 10 would take hours."""
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 0:
        if exponent * math.log2(abs(base)) > MAX_EXPONENT_BITS:
            raise ConstantError("too-large", expr.op_span, f"{base} ** {exponent} is out of range "
                                f"(integers are at most {MAX_INT:,})")


def _call(expr: ast.Call, lookup: Lookup, budget: Optional[Budget]) -> Constant:
    function = MATH_FUNCTIONS.get(expr.callee.id)
    if function is None or expr.kwargs or expr.label:
        raise ConstantError(
            "not-constant", expr.span,
            f"'{expr.callee.id}(...)' is not a constant expression",
            hint="constant expressions may call " + ", ".join(sorted(MATH_FUNCTIONS)),
        )
    args = [_require_number(evaluate(a, lookup, budget), a.span) for a in expr.args]
    try:
        return function(*args)
    except (TypeError, ValueError, OverflowError, ZeroDivisionError) as error:  # log(8, 1) divides by zero
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
