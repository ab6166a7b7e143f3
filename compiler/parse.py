"""Stage 1, parse: spec text -> typed AST (compiler/ast.py), or a syntax diagnostic."""

from __future__ import annotations

import functools
from pathlib import Path as FilePath
from typing import Optional

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from . import ast
from .diagnostics import Diagnostics, Span

# What the parser's terminal names mean to a person, for "expected ..." messages.
_TERMINAL_WORDS = {
    "NAME": "a name", "NUMBER": "a number", "STRING": "a string", "INT": "an integer",
    "LBRACE": "'{'", "RBRACE": "'}'", "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'",
    "COMMA": "','", "EQUAL": "'='", "DOT": "'.'", "_SEMI": "';'", "SUB": "'-'", "NOT": "'not'",
    "TRUE": "'true'", "FALSE": "'false'", "ADD_OP": "'+'", "MUL_OP": "'*'", "POW": "'**'",
}


@functools.cache
def _parser() -> Lark:
    grammar = (FilePath(__file__).parent / "grammar.lark").read_text()
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def parse_text(text: str, file: str, diagnostics: Diagnostics) -> Optional[ast.SpecFile]:
    """Parse one spec file. A syntax error is reported (the first one: LALR cannot resync reliably)."""
    diagnostics.sources[file] = text
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as error:
        diagnostics.error("syntax", _error_span(error, file, text), _describe(error))
        return None
    imports, model = _ToAst(file).transform(tree)
    return ast.SpecFile(path=file, imports=tuple(imports), model=model, source=text)


def parse_expression(text: str, file: str, diagnostics: Diagnostics) -> Optional[ast.Expr]:
    """Parse a lone expression (a `--set` value) by wrapping it in a parameter declaration."""
    wrapped = parse_text(f"model m {{ param v = {text} }}", file, diagnostics)
    return None if wrapped is None else wrapped.model.params[0].value


def _error_span(error: UnexpectedInput, file: str, text: str) -> Span:
    line, col = getattr(error, "line", -1), getattr(error, "column", -1)
    if isinstance(error, UnexpectedEOF) or line < 1:
        lines = text.splitlines() or [""]
        line, col = len(lines), len(lines[-1]) + 1
    width = len(error.token) if isinstance(error, UnexpectedToken) and error.token else 1
    return Span(file, line, col, line, col + max(width, 1))


def _describe(error: UnexpectedInput) -> str:
    if isinstance(error, UnexpectedCharacters):
        return f"unexpected character {error.char!r}"
    if isinstance(error, UnexpectedEOF):
        return "unexpected end of file"
    assert isinstance(error, UnexpectedToken)
    got = "end of file" if error.token.type == "$END" else f"'{error.token}'"
    expected = sorted({_TERMINAL_WORDS.get(t, f"'{t.lower()}'") for t in error.expected if not t.startswith("__")})
    if not expected:
        return f"unexpected {got}"
    shown = ", ".join(expected[:6]) + (", ..." if len(expected) > 6 else "")
    return f"unexpected {got}; expected {shown}"


def _span(file: str, meta) -> Span:
    return Span(file, meta.line, meta.column, meta.end_line, meta.end_column)


def _token_span(file: str, token: Token) -> Span:
    return Span(file, token.line, token.column, token.end_line, token.end_column)


@v_args(meta=True, inline=True)
class _ToAst(Transformer):
    """Lark tree -> ast dataclasses. Each method receives the node's `meta` (its position)."""

    def __init__(self, file: str) -> None:
        super().__init__()
        self.file = file

    def _name(self, token: Token) -> ast.Name:
        return ast.Name(str(token), _token_span(self.file, token))

    # file and model ---------------------------------------------------------------------
    def start(self, meta, *items):
        return list(items[:-1]), items[-1]

    def import_decl(self, meta, path):
        return ast.Import(_unquote(path), _span(self.file, meta))

    def model_decl(self, meta, name, base, *members):
        kinds: dict[type, list] = {ast.Param: [], ast.Block: [], ast.Remove: [], ast.Section: [], ast.Tie: []}
        for member in members:
            for tie in member if isinstance(member, list) else [member]:
                kinds[type(tie)].append(tie)
        return ast.Model(
            name=self._name(name), base=self._name(base) if base else None,
            params=tuple(kinds[ast.Param]), blocks=tuple(kinds[ast.Block]), removed=tuple(kinds[ast.Remove]),
            sections=tuple(kinds[ast.Section]), ties=tuple(kinds[ast.Tie]),
            span=_span(self.file, meta),
        )

    def param_decl(self, meta, name, value):
        return ast.Param(self._name(name), value, _span(self.file, meta), is_override=False)

    def set_decl(self, meta, name, value):
        return ast.Param(self._name(name), value, _span(self.file, meta), is_override=True)

    def block_decl(self, meta, name, *rest):
        *params, body = rest
        names = tuple(self._name(p) for p in params if p is not None)
        return ast.Block(self._name(name), names, body, _span(self.file, meta))

    def remove_decl(self, meta, *names):
        return ast.Remove(tuple(self._name(n) for n in names), _span(self.file, meta))

    def section(self, meta, name, *entries):
        return ast.Section(self._name(name), tuple(entries), _span(self.file, meta))

    def entry(self, meta, key, value):
        return ast.Entry(self._name(key), value, _span(self.file, meta))

    def tie_decl(self, meta, *paths):
        return ast.Tie(tuple(paths), None, _span(self.file, meta))

    def tie_if(self, meta, condition, *ties):
        return [ast.Tie(t.paths, condition, t.span) for t in ties]

    def path(self, meta, *parts):
        return ast.Path(tuple(str(p) for p in parts), _span(self.file, meta))

    # statements -------------------------------------------------------------------------
    def body(self, meta, *stmts):
        return tuple(stmts)

    def assign(self, meta, target, value):
        return ast.Assign(self._name(target), value, _span(self.file, meta))

    def return_stmt(self, meta, value):
        return ast.Return(value, _span(self.file, meta))

    def repeat_stmt(self, meta, count, label, body):
        return ast.Repeat(count, self._name(label) if label else None, body, _span(self.file, meta))

    def if_stmt(self, meta, condition, then, orelse=None):
        if isinstance(orelse, ast.If):
            orelse = (orelse,)
        return ast.If(condition, then, orelse or (), _span(self.file, meta))

    # expressions ------------------------------------------------------------------------
    def lambda_(self, meta, param, body):
        return ast.Lambda(self._name(param), body, _span(self.file, meta))

    def binop(self, meta, left, op, right):
        return ast.BinOp(str(op), left, right, _span(self.file, meta), _token_span(self.file, op))

    def unop(self, meta, op, operand):
        return ast.UnaryOp(str(op), operand, _span(self.file, meta))

    def number(self, meta, token):
        text = str(token).replace("_", "")
        is_float = any(c in text for c in ".eE")
        return ast.Literal(float(text) if is_float else int(text), _span(self.file, meta))

    def string(self, meta, token):
        return ast.Literal(_unquote(token), _span(self.file, meta))

    def true(self, meta, _token):
        return ast.Literal(True, _span(self.file, meta))

    def false(self, meta, _token):
        return ast.Literal(False, _span(self.file, meta))

    def name(self, meta, token):
        return self._name(token)

    def list(self, meta, *items):
        return ast.ListExpr(tuple(i for i in items if i is not None), _span(self.file, meta))

    def call(self, meta, callee, *rest):
        *arguments, label = rest
        args = tuple(a for a in arguments if a is not None and not isinstance(a, ast.Keyword))
        kwargs = tuple(a for a in arguments if isinstance(a, ast.Keyword))
        return ast.Call(self._name(callee), args, kwargs, self._name(label) if label else None,
                        _span(self.file, meta))

    def kwarg(self, meta, name, value):
        return ast.Keyword(str(name), value, _span(self.file, meta))


# Lark calls the rule `lambda`, a Python keyword; route it to the method above.
setattr(_ToAst, "lambda", _ToAst.lambda_)


def _unquote(token: str) -> str:
    """The text of a string literal, with only \\\\ and \\" escapes (spec strings are plain data)."""
    return str(token)[1:-1].replace('\\"', '"').replace("\\\\", "\\")
