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
from .python_code import attribute, binary, call, constant, dotted, variable
from .shapes import TensorType

# Names a field may not take: the config's own annotations and decorator would read the field instead.
SHADOWED = frozenset({"int", "float", "str", "bool", "dataclass"})
# The spec's math functions that generated code may call through `math`, and the builtins it may call.
MATH = {"sqrt": math.sqrt, "exp": math.exp, "log": math.log}
BOUNDS: dict[str, Callable[..., object]] = {"min": min, "max": max}
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
                      local: Callable[[str], object]) -> Optional[pyast.expr]:
    """`expr` as Python over `config` (`config.d_ff`, `math.sqrt(config.d_model)`), if it reads only
    parameters (a local name of the same value counts: a block argument passed the parameter) and
    computes `value` exactly, of its type; else None, and generated code writes the value itself."""
    return _exactly(expr, value, fields, local, "config")


def derived_field(expr: ast.Expr, value: object, fields: dict[str, Constant]) -> Optional[pyast.expr]:
    """A parameter the spec computes from others (`d_k = d_model / heads`) as Python over the config's own
    fields (`self.d_model // self.heads`), if it computes `value` exactly; else None (a constant)."""
    return _exactly(expr, value, fields, lambda name: None, "self")


def _exactly(expr: ast.Expr, value: object, fields: dict[str, Constant], local: Callable[[str], object],
             owner: str) -> Optional[pyast.expr]:
    """`expr` over the fields (`{owner}.{name}`), where it reads at least one and computes `value` exactly,
    of its type."""
    try:
        code, computed = _render(expr, fields, local, owner)
    except _NotConfig:
        return None
    reads = any(isinstance(node, pyast.Attribute) and isinstance(node.value, pyast.Name) and node.value.id == owner
                for node in pyast.walk(code))
    if type(computed) is not type(value) or computed != value or not reads:
        return None
    return code


class _NotConfig(Exception):
    pass


_OPERATOR_NODES: dict[str, type[pyast.operator]] = {
    "+": pyast.Add, "-": pyast.Sub, "*": pyast.Mult, "//": pyast.FloorDiv, "%": pyast.Mod}


def _render(expr: ast.Expr, fields: dict[str, Constant], local: Callable[[str], object],
            owner: str) -> tuple[pyast.expr, object]:
    """Python for `expr` over the fields (each `{owner}.{name}`) and the value it computes."""
    def render(part: ast.Expr) -> tuple[pyast.expr, object]:
        return _render(part, fields, local, owner)

    if isinstance(expr, ast.Name):
        if expr.id not in fields or local(expr.id) not in (None, fields[expr.id]):
            raise _NotConfig
        return attribute(variable(owner), expr.id), fields[expr.id]
    if isinstance(expr, ast.Literal) and type(expr.value) in (int, float, str, bool):
        return constant(expr.value), expr.value
    if isinstance(expr, ast.ListExpr):  # a list is a tuple in the config
        items = [render(item) for item in expr.items]
        return pyast.Tuple([code for code, _ in items], pyast.Load()), tuple(value for _, value in items)
    if isinstance(expr, ast.UnaryOp) and expr.op == "-":
        operand, a = render(expr.operand)
        if isinstance(a, bool) or not isinstance(a, (int, float)):
            raise _NotConfig
        return pyast.UnaryOp(pyast.USub(), operand), -a
    if isinstance(expr, ast.BinOp) and expr.op in OPERATORS:
        (left, a), (right, b) = render(expr.left), render(expr.right)
        if isinstance(a, bool) or isinstance(b, bool):
            raise _NotConfig
        try:
            return binary(left, _OPERATOR_NODES[expr.op](), right), OPERATORS[expr.op](a, b)
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
            return binary(left, pyast.FloorDiv(), right), a // b
        return binary(left, pyast.Div(), right), a / b
    if isinstance(expr, ast.BinOp) and expr.op == "**":
        exponent = _literal_number(expr.right)
        base, a = render(expr.left)
        if exponent is None or abs(exponent) > MAX_EXPONENT or isinstance(a, bool) or not isinstance(a, (int, float)) \
                or a <= 0:
            raise _NotConfig
        return binary(base, pyast.Pow(), constant(exponent)), a ** exponent
    if isinstance(expr, ast.Call) and expr.callee.id in MATH and len(expr.args) == 1 and not expr.kwargs:
        argument, a = render(expr.args[0])
        if isinstance(a, bool) or not isinstance(a, (int, float)) or (expr.callee.id != "exp" and a <= 0):
            raise _NotConfig
        return call(f"math.{expr.callee.id}", argument), MATH[expr.callee.id](a)
    if isinstance(expr, ast.Call) and expr.callee.id in BOUNDS and len(expr.args) >= 2 and not expr.kwargs:
        arguments = [render(argument) for argument in expr.args]
        if any(isinstance(a, bool) or not isinstance(a, (int, float)) for _, a in arguments):
            raise _NotConfig
        return call(expr.callee.id, *(code for code, _ in arguments)), BOUNDS[expr.callee.id](
            *(a for _, a in arguments))
    raise _NotConfig


# What a layer's condition may compute (`(i + 1) % sliding_window_pattern != 0`).
_CONDITION_NODES: dict[str, type[pyast.AST]] = {
    **_OPERATOR_NODES, "==": pyast.Eq, "!=": pyast.NotEq, "<": pyast.Lt, "<=": pyast.LtE, ">": pyast.Gt,
    ">=": pyast.GtE, "and": pyast.And, "or": pyast.Or}


def config_condition(expr: ast.Expr, fields: dict[str, Constant], index: str) -> Optional[pyast.expr]:
    """A condition over the layer's index (`index`) and parameters as Python over `config`
    (`(i + 1) % config.sliding_window_pattern != 0`), or None where it reads anything else."""
    if isinstance(expr, ast.Name):
        return variable(index) if expr.id == index else dotted(f"config.{expr.id}") if expr.id in fields else None
    if isinstance(expr, ast.Literal):
        return constant(expr.value)
    if isinstance(expr, ast.Index):
        items, index_code = config_condition(expr.value, fields, index), config_condition(expr.index, fields, index)
        return None if items is None or index_code is None else pyast.Subscript(items, index_code, pyast.Load())
    if isinstance(expr, ast.UnaryOp):
        operand = config_condition(expr.operand, fields, index)
        if operand is None:
            return None
        return pyast.UnaryOp(pyast.Not() if expr.op == "not" else pyast.USub(), operand)
    if isinstance(expr, ast.BinOp) and expr.op in _CONDITION_NODES:
        left, right = config_condition(expr.left, fields, index), config_condition(expr.right, fields, index)
        if left is None or right is None:
            return None
        node = _CONDITION_NODES[expr.op]()
        if isinstance(node, pyast.operator):
            return binary(left, node, right)
        if isinstance(node, pyast.boolop):
            return pyast.BoolOp(node, [left, right])
        assert isinstance(node, pyast.cmpop)
        return pyast.Compare(left, [node], [right])
    return None


def _literal_number(expr: ast.Expr) -> Optional[int | float]:
    """The number a literal (`2`, `0.5`) or a negated literal (`-0.5`) writes, else None."""
    if isinstance(expr, ast.UnaryOp) and expr.op == "-":
        value = _literal_number(expr.operand)
        return None if value is None else -value
    if isinstance(expr, ast.Literal) and isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool):
        return expr.value
    return None


class ConfigNames:
    """Sizes as the config names them, by value: a whole number is the one parameter of that value, if one
    only. For shape comments, and a graph input's width: module arguments follow the spec's expressions."""

    def __init__(self, fields: dict[str, Constant]) -> None:
        self.fields = fields
        by_value: dict[int, list[str]] = {}
        for name, value in fields.items():
            if isinstance(value, int) and not isinstance(value, bool):
                by_value.setdefault(value, []).append(name)
        self.names = {value: names[0] for value, names in by_value.items() if len(names) == 1}

    def size(self, value: object) -> pyast.expr:
        """`config.d_model` for 512 where only d_model is 512; else the literal."""
        if isinstance(value, int) and not isinstance(value, bool) and value in self.names:
            return dotted(f"config.{self.names[value]}")
        return constant(value)

    def shape(self, shape: TensorType) -> tuple[tuple[str, ...], str]:
        """`[batch, src_len, d_model]`: the spec's dimension names, and parameters for sizes (not for a 1,
        which is no size but a dimension broadcast: a mask's over heads); and the element type."""
        return tuple(self.names.get(d, str(d)) if isinstance(d, int) and d != 1 else str(d)
                     for d in shape.dims), shape.dtype
