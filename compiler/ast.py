"""The typed syntax tree of a spec file. Every node keeps the span it was parsed from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from .diagnostics import Span

# --- expressions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Literal:
    value: Union[int, float, bool, str]
    span: Span


@dataclass(frozen=True)
class Name:
    id: str
    span: Span


@dataclass(frozen=True)
class ListExpr:
    items: tuple["Expr", ...]
    span: Span


@dataclass(frozen=True)
class Index:
    """`layer_types[i]`: an item of a list, by a whole number from 0."""

    value: "Expr"
    index: "Expr"
    span: Span


@dataclass(frozen=True)
class BinOp:
    op: str  # "+", "-", "*", "/", "//", "%", "**", comparisons, "and", "or"
    left: "Expr"
    right: "Expr"
    span: Span
    op_span: Span


@dataclass(frozen=True)
class UnaryOp:
    op: str  # "-" or "not"
    operand: "Expr"
    span: Span


@dataclass(frozen=True)
class Keyword:
    name: str
    value: "Expr"
    span: Span


@dataclass(frozen=True)
class Call:
    """`callee(args, key = value) as label`: an op, a block, or a callable argument."""

    callee: Name
    args: tuple["Expr", ...]
    kwargs: tuple[Keyword, ...]
    label: Optional[Name]
    span: Span


@dataclass(frozen=True)
class Lambda:
    """`h => expr`: a one-argument function, passed to blocks such as the residual sublayer."""

    param: Name
    body: "Expr"
    span: Span


Expr = Union[Literal, Name, ListExpr, Index, BinOp, UnaryOp, Call, Lambda]

# --- statements (block bodies) ---------------------------------------------------------------


@dataclass(frozen=True)
class Assign:
    target: Name
    value: Expr
    span: Span


@dataclass(frozen=True)
class Return:
    value: Expr
    span: Span


@dataclass(frozen=True)
class Repeat:
    """`repeat i in N as name { ... }`: N stacked copies of the body, each with its own weights; `i` is
    the layer's index (0 to N - 1), a constant in the body."""

    count: Expr
    label: Optional[Name]
    body: tuple["Stmt", ...]
    span: Span
    index: Optional[Name] = None


@dataclass(frozen=True)
class If:
    """A compile-time choice: the condition must be a constant (usually a parameter)."""

    condition: Expr
    then: tuple["Stmt", ...]
    orelse: tuple["Stmt", ...]
    span: Span


Stmt = Union[Assign, Return, Repeat, If]

# --- declarations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    name: Name
    value: Expr
    span: Span
    is_override: bool  # `set name = ...` rather than `param name = ...`
    choices: Optional[Expr] = None  # `param pooling = "cls" in ["cls", "mean"]`: the values it may take


@dataclass(frozen=True)
class Block:
    name: Name
    params: tuple[Name, ...]
    body: tuple[Stmt, ...]
    span: Span


@dataclass(frozen=True)
class Remove:
    """`remove encoder`: a derived model drops blocks of its base (e.g. a language model)."""

    names: tuple[Name, ...]
    span: Span


@dataclass(frozen=True)
class Entry:
    key: Name
    value: Expr
    span: Span


@dataclass(frozen=True)
class Section:
    name: Name
    entries: tuple[Entry, ...]
    span: Span


@dataclass(frozen=True)
class Path:
    parts: tuple[str, ...]
    span: Span

    def __str__(self) -> str:
        return ".".join(self.parts)


@dataclass(frozen=True)
class Tie:
    """`tie a.weight, b.weight`: the later parameters become the first one."""

    paths: tuple[Path, ...]
    condition: Optional[Expr]
    span: Span


@dataclass(frozen=True)
class Import:
    path: str
    span: Span


@dataclass(frozen=True)
class Model:
    name: Name
    base: Optional[Name]
    params: tuple[Param, ...]
    blocks: tuple[Block, ...]
    removed: tuple[Remove, ...]
    sections: tuple[Section, ...]
    ties: tuple[Tie, ...]
    span: Span


@dataclass(frozen=True)
class SpecFile:
    path: str
    imports: tuple[Import, ...]
    model: Model
    source: str = field(repr=False)
