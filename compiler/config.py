"""The typed config of a generated module: the spec's parameters as a dataclass, and the code that reads
sizes and constants from it.

Generated classes take the config as nanoGPT's take its GPTConfig, so `nn.Linear(config.d_model,
config.d_ff)` points back to the spec's `d_ff`. An op argument written as an expression of parameters
(`d_ff`, `sqrt(d_model)`, `4 * d_model`) is recorded with its node as that expression over `config`
(the graph builder calls `config_expression`), kept only where it computes exactly the checked value.
A module's input width is the expression of the op that made it (compiler/lower.py follows the graph);
only shape comments, and the width of a graph input, read the one parameter of a value (`ConfigNames`).
"""

from __future__ import annotations

import ast as pyast
import keyword
import math
from typing import Callable, Optional

from . import ast
from .evaluate import Constant
from .shapes import TensorType

# Names a field may not take: the config's own annotations and decorator would read the field instead.
SHADOWED = frozenset({"int", "float", "str", "bool", "dataclass"})
# The spec's math functions that generated code may call through `math`.
MATH = {"sqrt": math.sqrt, "exp": math.exp, "log": math.log}
OPERATORS: dict[str, Callable[[object, object], object]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,  # type: ignore[operator]
    "//": lambda a, b: a // b, "%": lambda a, b: a % b}  # type: ignore[operator]
# A power generated code may take: of a positive value, by a literal exponent no larger than this
# (`config.query_pre_attn_scalar ** -0.5`); the checker (compiler/codecheck.py) allows no other.
MAX_EXPONENT = 4


def config_fields(params: dict[str, Constant]) -> dict[str, Constant]:
    """The parameters a config holds: scalars and lists of them (tuples, a per-layer schedule) under names
    Python can use as fields."""
    return {name: value for name, value in params.items()
            if isinstance(value, (bool, int, float, str, tuple)) and name.isidentifier()
            and not keyword.iskeyword(name) and not name.startswith("_") and name not in SHADOWED}


def config_expression(expr: ast.Expr, value: object, fields: dict[str, Constant],
                      local: Callable[[str], object]) -> Optional[str]:
    """`expr` as Python over `config` (`config.d_ff`, `math.sqrt(config.d_model)`), if it reads only
    parameters (a local name of the same value counts: a block argument passed the parameter) and
    computes `value` exactly, of its type; else None, and generated code writes the value itself."""
    return _exactly(expr, value, fields, local, "config.")


def derived_field(expr: ast.Expr, value: object, fields: dict[str, Constant]) -> Optional[str]:
    """A parameter the spec computes from others (`d_k = d_model / heads`) as Python over the config's own
    fields (`self.d_model // self.heads`), if it computes `value` exactly; else None (a constant)."""
    return _exactly(expr, value, fields, lambda name: None, "self.")


def _exactly(expr: ast.Expr, value: object, fields: dict[str, Constant], local: Callable[[str], object],
             prefix: str) -> Optional[str]:
    """`expr` over the fields (`{prefix}{name}`), where it reads at least one and computes `value` exactly,
    of its type."""
    try:
        code, computed = _render(expr, fields, local, prefix)
    except _NotConfig:
        return None
    if type(computed) is not type(value) or computed != value or prefix not in code:
        return None
    return _outer(code)


class _NotConfig(Exception):
    pass


def _render(expr: ast.Expr, fields: dict[str, Constant], local: Callable[[str], object],
            prefix: str) -> tuple[str, object]:
    """Python for `expr` over the fields (each written `{prefix}{name}`) and the value it computes."""
    def render(part: ast.Expr) -> tuple[str, object]:
        return _render(part, fields, local, prefix)

    if isinstance(expr, ast.Name):
        if expr.id not in fields or local(expr.id) not in (None, fields[expr.id]):
            raise _NotConfig
        return f"{prefix}{expr.id}", fields[expr.id]
    if isinstance(expr, ast.Literal) and type(expr.value) in (int, float, str, bool):
        return repr(expr.value), expr.value
    if isinstance(expr, ast.ListExpr):  # a list is a tuple in the config
        items = [render(item) for item in expr.items]
        code = ", ".join(code for code, _ in items) + ("," if len(items) == 1 else "")
        return f"({code})", tuple(value for _, value in items)
    if isinstance(expr, ast.UnaryOp) and expr.op == "-":
        operand, a = render(expr.operand)
        if isinstance(a, bool) or not isinstance(a, (int, float)):
            raise _NotConfig
        return f"(-{operand})", -a
    if isinstance(expr, ast.BinOp) and expr.op in OPERATORS:
        (left, a), (right, b) = render(expr.left), render(expr.right)
        if isinstance(a, bool) or isinstance(b, bool):
            raise _NotConfig
        try:
            return f"({left} {expr.op} {right})", OPERATORS[expr.op](a, b)
        except (TypeError, ValueError, ZeroDivisionError, OverflowError):
            raise _NotConfig from None
    if isinstance(expr, ast.BinOp) and expr.op == "/":  # the spec's exact quotient of whole numbers: //
        (left, a), (right, b) = render(expr.left), render(expr.right)
        if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) \
                or not isinstance(b, (int, float)) or not b:
            raise _NotConfig
        if isinstance(a, int) and isinstance(b, int):
            if a % b:
                raise _NotConfig  # the spec's inexact quotient is an error where it is used
            return f"({left} // {right})", a // b
        return f"({left} / {right})", a / b
    if isinstance(expr, ast.BinOp) and expr.op == "**":
        exponent = _literal_number(expr.right)
        base, a = render(expr.left)
        if exponent is None or abs(exponent) > MAX_EXPONENT or isinstance(a, bool) or not isinstance(a, (int, float)) \
                or a <= 0:
            raise _NotConfig
        return f"({base} ** {exponent!r})", a ** exponent
    if isinstance(expr, ast.Call) and expr.callee.id in MATH and len(expr.args) == 1 and not expr.kwargs:
        argument, a = render(expr.args[0])
        if isinstance(a, bool) or not isinstance(a, (int, float)) or (expr.callee.id != "exp" and a <= 0):
            raise _NotConfig
        return f"math.{expr.callee.id}({_outer(argument)})", MATH[expr.callee.id](a)
    raise _NotConfig


# What a layer's condition may compute (`(i + 1) % sliding_window_pattern != 0`).
CONDITION_OPERATORS = frozenset({"+", "-", "*", "//", "%", "==", "!=", "<", "<=", ">", ">=", "and", "or"})


def config_condition(expr: ast.Expr, fields: dict[str, Constant], index: str) -> Optional[str]:
    """A condition over the layer's index (`index`) and parameters as Python over `config`
    (`(i + 1) % config.sliding_window_pattern != 0`), or None where it reads anything else."""
    if isinstance(expr, ast.Name):
        return index if expr.id == index else f"config.{expr.id}" if expr.id in fields else None
    if isinstance(expr, ast.Literal):
        return repr(expr.value)
    if isinstance(expr, ast.Index):
        items, index_code = config_condition(expr.value, fields, index), config_condition(expr.index, fields, index)
        return None if items is None or index_code is None else f"{items}[{index_code}]"
    if isinstance(expr, ast.UnaryOp):
        operand = config_condition(expr.operand, fields, index)
        return None if operand is None else f"({expr.op} {operand})" if expr.op == "not" else f"(-{operand})"
    if isinstance(expr, ast.BinOp) and expr.op in CONDITION_OPERATORS:
        left, right = config_condition(expr.left, fields, index), config_condition(expr.right, fields, index)
        return None if left is None or right is None else f"({left} {expr.op} {right})"
    return None


def condition_source(code: str) -> str:
    """A condition `config_condition` wrote, with only the parentheses Python needs."""
    return pyast.unparse(pyast.parse(code, mode="eval"))


def _literal_number(expr: ast.Expr) -> Optional[int | float]:
    """The number a literal (`2`, `0.5`) or a negated literal (`-0.5`) writes, else None."""
    if isinstance(expr, ast.UnaryOp) and expr.op == "-":
        value = _literal_number(expr.operand)
        return None if value is None else -value
    if isinstance(expr, ast.Literal) and isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool):
        return expr.value
    return None


def _outer(code: str) -> str:
    """An argument needs no parentheses of its own."""
    return code[1:-1] if code.startswith("(") and code.endswith(")") else code


class ConfigNames:
    """Sizes as the config names them, by value: a whole number is the one parameter of that value, if one
    only. For shape comments, and a graph input's width: module arguments follow the spec's expressions."""

    def __init__(self, fields: dict[str, Constant]) -> None:
        by_value: dict[int, list[str]] = {}
        for name, value in fields.items():
            if isinstance(value, int) and not isinstance(value, bool):
                by_value.setdefault(value, []).append(name)
        self.names = {value: names[0] for value, names in by_value.items() if len(names) == 1}

    def size(self, value: object) -> str:
        """`config.d_model` for 512 where only d_model is 512; else the literal."""
        if isinstance(value, int) and not isinstance(value, bool) and value in self.names:
            return f"config.{self.names[value]}"
        return repr(value)

    def shape(self, shape: TensorType) -> str:
        """`[batch, src_len, d_model]`: the spec's dimension names, and parameters for sizes."""
        dims = [self.names.get(d, str(d)) if isinstance(d, int) else str(d) for d in shape.dims]
        text = "[" + ", ".join(dims) + "]"
        return text if shape.dtype == "float" else f"{shape.dtype}{text}"
