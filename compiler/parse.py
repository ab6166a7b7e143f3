"""Stage 1, parse: spec text -> typed AST (compiler/ast.py), or a syntax diagnostic."""

from __future__ import annotations

import functools
import re
from collections import OrderedDict
from typing import Any, Optional

from lark import Lark, Token, Transformer, Tree, v_args
from lark.tree import Meta
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from xspec.base.text import printable

from . import ast
from .diagnostics import Diagnostics, Span
from .evaluate import ConstantError, check_value
from .limits import MAX_INT, MAX_SYNTAX_DEPTH
from .parser_tables import grammar_parser

# What the parser's terminal names mean to a person, for "expected ..." messages.
_TERMINAL_WORDS = {
    "NAME": "a name", "NUMBER": "a number", "STRING": "a string", "INT": "an integer",
    "LBRACE": "'{'", "RBRACE": "'}'", "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'",
    "COMMA": "','", "EQUAL": "'='", "DOT": "'.'", "_SEMI": "';'", "SUB": "'-'", "NOT": "'not'",
    "TRUE": "'true'", "FALSE": "'false'", "ADD_OP": "'+'", "MUL_OP": "'*'", "POW": "'**'",
}


@functools.cache
def _parser() -> Lark:
    return grammar_parser()  # tables precomputed when they fit this grammar and Lark (parser_tables.py)


def parse_text(text: str, file: str, diagnostics: Diagnostics) -> Optional[ast.SpecFile]:
    """Parse one spec file. A syntax error is reported (the first one: LALR cannot resync reliably)."""
    parsed = _parse(text, file, diagnostics, "start")
    if parsed is None:
        return None
    imports, model = parsed
    return ast.SpecFile(path=file, imports=tuple(imports), model=model, source=text)


def parse_expression(text: str, file: str, diagnostics: Diagnostics) -> Optional[ast.Expr]:
    """Parse a lone expression (a `--set` value)."""
    return _parse(text, file, diagnostics, "expr")


# Roughly the grammar's tokens, to bound the parser's work before it starts (comments are not tokens).
_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|#[^\n]*|[A-Za-z0-9_]+|\*\*|//|[=!<>]=|=>|\S')


def count_tokens(text: str) -> int:
    """About how many tokens the parser will read in `text` (never far below: each costs ~25 us)."""
    return sum(1 for match in _TOKEN.finditer(text) if not match.group().startswith("#"))


# What the files parsed last parsed to, by (file, rule, text): a process that compiles specs over the same
# files (a sweep, loading runs, a test suite) parses each once. The trees are immutable; only a parse
# without errors is kept.
PARSED_KEPT = 64
_parsed: OrderedDict[tuple[str, str, str], Any] = OrderedDict()


def _parse(text: str, file: str, diagnostics: Diagnostics, start: str):
    diagnostics.sources[file] = text
    key = (file, start, text)
    if key in _parsed:
        _parsed.move_to_end(key)
        return _parsed[key]
    result = _parsed_anew(text, file, diagnostics, start)
    if result is not None:
        _parsed[key] = result
        while len(_parsed) > PARSED_KEPT:
            _parsed.popitem(last=False)
    return result


def _parsed_anew(text: str, file: str, diagnostics: Diagnostics, start: str):
    try:
        tree = _parser().parse(text, start=start)
    except UnexpectedInput as error:
        diagnostics.error("syntax", _error_span(error, file, text), _describe(error))
        return None
    deepest = _too_deep(tree)
    if deepest is not None:  # every later pass recurses over the tree: bound its depth first
        diagnostics.error("too-deep", _span(file, deepest.meta), f"statements and expressions nest more than "
                          f"{MAX_SYNTAX_DEPTH} levels deep here", "name intermediate values to flatten the nesting")
        return None
    transformer = _ToAst(file)
    result = transformer.transform(tree)
    for problem in transformer.errors:
        diagnostics.error(problem.code, problem.span, problem.message, problem.hint)
    return None if transformer.errors else result


def _too_deep(tree: Tree) -> Optional[Tree]:
    """The first node nested deeper than MAX_SYNTAX_DEPTH, found without recursion."""
    pending = [(tree, 1)]
    while pending:
        node, depth = pending.pop()
        if depth > MAX_SYNTAX_DEPTH:
            return node
        # Children pushed last-first, so the first too deep node in the text is the one reported.
        pending.extend((child, depth + 1) for child in reversed(node.children) if isinstance(child, Tree))
    return None


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
    # A string token may hold control characters (an escape sequence a terminal would obey): shown escaped.
    got = "end of file" if error.token.type == "$END" else f"'{printable(str(error.token))}'"
    expected = sorted({_TERMINAL_WORDS.get(t, f"'{t.lower()}'") for t in error.expected if not t.startswith("__")})
    if not expected:
        return f"unexpected {got}"
    shown = ", ".join(expected[:6]) + (", ..." if len(expected) > 6 else "")
    return f"unexpected {got}; expected {shown}"


def _span(file: str, meta: Meta) -> Span:
    return Span(file, meta.line, meta.column, meta.end_line, meta.end_column)


def _token_span(file: str, token: Token) -> Span:
    # The lexer's tokens carry their position (lark types it optional, for tokens made by hand).
    line, column, end_line, end_column = token.line, token.column, token.end_line, token.end_column
    assert line is not None and column is not None and end_line is not None and end_column is not None
    return Span(file, line, column, end_line, end_column)


@v_args(meta=True, inline=True)
class _ToAst(Transformer):
    """Lark tree -> ast dataclasses. Each method receives the node's `meta` (its position)."""

    def __init__(self, file: str) -> None:
        super().__init__()
        self.file = file
        self.errors: list[ConstantError] = []  # literals out of range; reported after the transform

    def _name(self, token: Token) -> ast.Name:
        return ast.Name(str(token), _token_span(self.file, token))

    # file and model ---------------------------------------------------------------------
    def start(self, meta, *items):
        return list(items[:-1]), items[-1]

    def import_decl(self, meta, path):
        try:
            return ast.Import(unquote(str(path)), _span(self.file, meta))
        except ValueError as error:
            self.errors.append(ConstantError("syntax", _span(self.file, meta), str(error)))
            return ast.Import("", _span(self.file, meta))

    def model_decl(self, meta: Meta, name: Token, base: Optional[Token], *members: object) -> ast.Model:
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

    def param_decl(self, meta, name, value, choices=None):
        return ast.Param(self._name(name), value, _span(self.file, meta), is_override=False, choices=choices)

    def set_decl(self, meta, name, value, choices=None):
        return ast.Param(self._name(name), value, _span(self.file, meta), is_override=True, choices=choices)

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

    def repeat_stmt(self, meta, index, count, label, body):
        return ast.Repeat(count, self._name(label) if label else None, body, _span(self.file, meta),
                          self._name(index) if index else None)

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
        text, span = str(token).replace("_", ""), _span(self.file, meta)
        if any(c in text for c in ".eE"):
            return self._literal(float(text), span)
        digits = text.lstrip("0") or "0"  # int() refuses more than 4300 digits, leading zeros included
        if len(digits) > len(str(MAX_INT)):  # int() of thousands of digits is itself slow
            self.errors.append(ConstantError("too-large", span, f"integer literal of {len(digits)} digits "
                                             f"is out of range (at most {MAX_INT:,})"))
            return ast.Literal(0, span)
        return self._literal(int(digits), span)

    def string(self, meta, token):
        span = _span(self.file, meta)
        try:
            value = unquote(str(token))
        except ValueError as error:
            self.errors.append(ConstantError("syntax", span, str(error), r'strings know two escapes: \\ and \"'))
            return ast.Literal("", span)
        return self._literal(value, span)

    def _literal(self, value, span: Span) -> ast.Literal:
        try:
            check_value(value, span)
        except ConstantError as error:
            self.errors.append(error)
        return ast.Literal(value, span)

    def true(self, meta, _token):
        return ast.Literal(True, _span(self.file, meta))

    def false(self, meta, _token):
        return ast.Literal(False, _span(self.file, meta))

    def name(self, meta, token):
        return self._name(token)

    def index(self, meta, value, index):
        return ast.Index(value, index, _span(self.file, meta))

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


def unquote(literal: str) -> str:
    """The text of a string literal. Strings are plain data: the only escapes are \\\\ and \\"."""
    return _ESCAPE.sub(_unescape, literal[1:-1])


def quote(text: str) -> str:
    """The string literal whose `unquote` is `text`."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


_ESCAPE = re.compile(r"\\(.)", re.DOTALL)


def _unescape(match: re.Match) -> str:
    if match.group(1) not in ('"', "\\"):
        raise ValueError(f"unknown escape {match.group(0)!r} in a string")
    return match.group(1)
