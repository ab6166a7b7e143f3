"""Generated code as Python syntax trees: the builders lowering writes with, and the comment a statement
carries. Lowering builds `ast` nodes from checked identifiers and constants, never text to be read back;
compiler/python_print.py prints them.

A statement's comment is a `Note`, kept on the node as `note` (the `ast` module ignores it: `ast.dump`
and `ast.unparse` see the code alone, so two classes that differ only in their comments compare equal).
"""

from __future__ import annotations

import ast
import keyword
from dataclasses import dataclass, replace
from typing import Optional, Sequence, TypeVar, Union

from xspec.base.text import printable

Code = ast.expr
Noted = TypeVar("Noted", bound=ast.AST)


@dataclass(frozen=True)
class Note:
    """A statement's comment: the spec line it comes from (`base.xspec:33`), after the shape its value
    has in the spec's dimension names where it changes (`[batch, tgt_len, vocab]`), or any other text."""

    text: str
    shape: Optional[tuple[str, ...]] = None
    dtype: str = "float"  # a shape's element type, named where it is not float (`long[batch, len]`)

    def __str__(self) -> str:
        if self.shape is None:
            return self.text
        dims = "[" + ", ".join(self.shape) + "]"
        return f"{'' if self.dtype == 'float' else self.dtype}{dims}  {self.text}"

    def merged(self, other: Note) -> Note:
        """This note naming both instances' dimensions where a class serves two (`[batch, src_len|tgt_len,
        d_model]`)."""
        if self.shape is None or other.shape is None or len(self.shape) != len(other.shape):
            return self
        dims = tuple(mine if theirs in mine.split("|") else f"{mine}|{theirs}"
                     for mine, theirs in zip(self.shape, other.shape))
        return replace(self, shape=dims)


def noted(statement: Noted, note: Union[Note, str, None]) -> Noted:
    """`statement` (or a part of one) with its comment. A line number too: `ast.unparse` reads one of
    an assignment, a loop and a def (for their type comments), and `text_of` adds none."""
    statement.lineno = 1  # type: ignore[attr-defined]
    statement.note = Note(note) if isinstance(note, str) else note  # type: ignore[attr-defined]
    return statement


def note_of(statement: ast.AST) -> Optional[Note]:
    return getattr(statement, "note", None)


def statements_in(node: ast.AST) -> list[ast.AST]:
    """`node` and the statements inside it, in order: the nodes that carry notes."""
    found, pending = [], [node]
    while pending:
        current = pending.pop()
        found.append(current)
        inner = [*getattr(current, "body", ()), *getattr(current, "orelse", ())]
        pending += reversed([statement for statement in inner if isinstance(statement, ast.stmt)])
    return found


def identifier(name: str) -> str:
    assert name.isidentifier() and not keyword.iskeyword(name), f"not a plain identifier: {name!r}"
    return name


def variable(text: str) -> ast.Name:
    return ast.Name(identifier(text), ast.Load())


def dotted(path: str) -> Code:
    """`nn.Linear`, `self.layers`: a name and its attributes (each part an identifier)."""
    first, *rest = path.split(".")
    code: Code = variable(first)
    for part in rest:
        code = ast.Attribute(code, identifier(part), ast.Load())
    return code


def attribute(value: Code, attr: str) -> ast.Attribute:
    return ast.Attribute(value, identifier(attr), ast.Load())


def constant(value: object) -> Code:
    """A constant (a tuple of constants as a tuple). A negative number stays one constant, which
    `ast.unparse` writes as `-0.5` without parentheses (`x ** -0.5`); generated code never raises one to
    a power, where that would read as `-(2 ** x)` (`binary` refuses it)."""
    if isinstance(value, tuple):
        return ast.Tuple([constant(item) for item in value], ast.Load())
    assert value is None or isinstance(value, (bool, int, float, str)), f"not a constant: {value!r}"
    return ast.Constant(value)


def call(function: Union[str, Code], *args: Code, **keywords: Code) -> ast.Call:
    """`function(*args, **keywords)`; a dotted name for `function` (`nn.Linear`) is built, not read."""
    func = dotted(function) if isinstance(function, str) else function
    return ast.Call(func, list(args), [ast.keyword(identifier(k), v) for k, v in keywords.items()])


def binary(left: Code, operator: ast.operator, right: Code) -> ast.BinOp:
    negative = isinstance(left, ast.Constant) and isinstance(left.value, (int, float)) and str(left.value)[0] == "-"
    assert not (negative and isinstance(operator, ast.Pow)), "a negative constant raised to a power"
    return ast.BinOp(left, operator, right)


def product(*factors: Code) -> Code:
    """`a * b * c`."""
    code = factors[0]
    for factor in factors[1:]:
        code = ast.BinOp(code, ast.Mult(), factor)
    return code


def assign(target: Union[str, Code], value: Code, note: Union[Note, str, None] = None) -> ast.Assign:
    """`target = value`; a dotted target (`self.norm`) is built for storing."""
    code = dotted(target) if isinstance(target, str) else target
    return noted(ast.Assign([_stored(code)], value), note)


def assign_many(targets: Sequence[str], value: Code, note: Union[Note, str, None] = None) -> ast.Assign:
    """`a, b = value` (one name: `a = value`)."""
    if len(targets) == 1:
        return assign(targets[0], value, note)
    stored = ast.Tuple([ast.Name(identifier(t), ast.Store()) for t in targets], ast.Store())
    return noted(ast.Assign([stored], value), note)


def _stored(code: Code) -> Code:
    if isinstance(code, ast.Name):
        return ast.Name(code.id, ast.Store())
    if isinstance(code, ast.Attribute):
        return ast.Attribute(code.value, code.attr, ast.Store())
    if isinstance(code, ast.Subscript):
        return ast.Subscript(code.value, code.slice, ast.Store())
    raise AssertionError(f"not a target: {ast.dump(code)}")


def returns(value: Optional[Code], note: Union[Note, str, None] = None) -> ast.Return:
    return noted(ast.Return(value), note)


def expression(value: Code, note: Union[Note, str, None] = None) -> ast.Expr:
    return noted(ast.Expr(value), note)


def docstring(text: str) -> ast.Expr:
    """A docstring holding `text`, each line's control characters shown (escaped), its line breaks kept."""
    return ast.Expr(ast.Constant("\n".join(printable(line) for line in text.split("\n"))))


def function(function_name: str, parameters: Sequence[str], body: list[ast.stmt],
             note: Union[Note, str, None] = None, defaults: Sequence[Code] = ()) -> ast.FunctionDef:
    """`def name(parameters):` (the last ones taking `defaults`)."""
    arguments = ast.arguments(posonlyargs=[], args=[ast.arg(identifier(p)) for p in parameters], vararg=None,
                              kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=list(defaults))
    return noted(ast.FunctionDef(identifier(function_name), arguments, body, [], None, type_comment=None), note)


def class_def(class_name: str, bases: Sequence[Code], body: list[ast.stmt], note: Union[Note, str, None] = None,
              decorators: Sequence[Code] = ()) -> ast.ClassDef:
    return noted(ast.ClassDef(class_name, list(bases), [], body, list(decorators)), note)


def for_loop(target: str, iterable: Code, body: Sequence[ast.stmt], note: Union[Note, str, None] = None) -> ast.For:
    return noted(ast.For(ast.Name(identifier(target), ast.Store()), iterable, list(body), [], type_comment=None), note)


def if_statement(test: Code, body: list[ast.stmt], orelse: Sequence[ast.stmt] = (),
                 note: Union[Note, str, None] = None) -> ast.If:
    return noted(ast.If(test, body, list(orelse)), note)


def super_init() -> ast.Expr:
    """`super().__init__()`, a module class's constructor's first statement."""
    return expression(call(ast.Attribute(call("super"), "__init__", ast.Load())))


def text_of(code: ast.AST) -> str:
    """The code as Python writes it on one line (only the parentheses Python needs)."""
    return ast.unparse(code)


def concatenated(*pieces: Union[str, ast.JoinedStr]) -> ast.JoinedStr:
    """One f-string made of `pieces` (strings and f-strings), as Python reads adjacent literals; printed
    as those pieces where it is too long for a line (compiler/python_print.py)."""
    values: list[ast.expr] = []
    for piece in pieces:
        for value in ([ast.Constant(piece)] if isinstance(piece, str) else piece.values):
            last = values[-1] if values else None
            if isinstance(value, ast.Constant) and isinstance(last, ast.Constant):
                values[-1] = ast.Constant(str(last.value) + str(value.value))
            else:
                values.append(value)
    joined = ast.JoinedStr(values)
    joined.pieces = [ast.Constant(p) if isinstance(p, str) else p for p in pieces]  # type: ignore[attr-defined]
    return joined
