"""Generated syntax trees (compiler/python_code.py) printed as a person would write them: each statement as
`ast.unparse` writes it, its note as a comment, docstrings in triple quotes, a blank line between a
class's methods; and a statement too long for LINE_LIMIT wrapped where its syntax allows: a call's (or a
tuple's) items packed on the lines after its head, an argument too long for a line wrapped so too, long
arithmetic split at its operators, a long `and` or `or` one operand a line, a long class check's classes
packed two levels in, a long string at the pieces it was built of. The printed text parses back to the
tree it came from (`print_checked`)."""

from __future__ import annotations

import ast
from typing import Optional, Sequence

from .python_code import note_of, text_of

INDENT = "    "
LINE_LIMIT = 100  # generated lines are shorter than this


def print_checked(statements: Sequence[ast.stmt]) -> str:
    """Top-level statements as text, which must parse to the same tree: a printer that changed the code
    would be a compiler bug, caught here rather than in a user's model."""
    text = "\n".join(print_statements(statements)) + "\n"
    expected = ast.unparse(ast.Module(list(statements), []))
    assert ast.dump(ast.parse(text)) == ast.dump(ast.parse(expected)), "the printed code is not the code built"
    return text


def print_statements(statements: Sequence[ast.stmt], indent: str = "", in_class: bool = False) -> list[str]:
    """Statements at `indent`; in a class body, its docstring and each method after the first statement
    set apart by a blank line (a function's body has none)."""
    lines: list[str] = []
    for number, statement in enumerate(statements):
        after_docstring = number == 1 and _is_docstring(statements[0])
        if in_class and lines and (after_docstring or isinstance(statement, (ast.FunctionDef, ast.ClassDef))):
            lines.append("")
        lines += _statement(statement, indent)
    return lines


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) \
        and isinstance(statement.value.value, str)


def docstring_text(text: str) -> str:
    """A docstring in triple quotes: quotes and backslashes escaped (the lowering made it printable)."""
    return '"""' + text.replace("\\", "\\\\").replace('"', '\\"') + '"""'


def _commented(lines: list[str], statement: ast.AST) -> list[str]:
    note = note_of(statement)
    return lines if note is None else [f"{lines[0]}  # {note}", *lines[1:]]


def _fits(text: str, statement: ast.AST) -> bool:
    note = note_of(statement)
    return len(text) + (len(f"  # {note}") if note is not None else 0) < LINE_LIMIT


def _statement(statement: ast.stmt, indent: str) -> list[str]:
    if _is_docstring(statement):
        assert isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) \
            and isinstance(statement.value.value, str)
        return [indent + line if number == 0 else line
                for number, line in enumerate(docstring_text(statement.value.value).split("\n"))]
    if isinstance(statement, ast.ClassDef):
        return _class(statement, indent)
    if isinstance(statement, ast.FunctionDef):
        header = f"{indent}def {statement.name}({text_of(statement.args)}):"
        return [*_commented([header], statement), *print_statements(statement.body, indent + INDENT)]
    if isinstance(statement, ast.For):
        header = f"{indent}for {text_of(statement.target)} in {text_of(statement.iter)}:"
        return [*_commented([header], statement), *print_statements(statement.body, indent + INDENT)]
    if isinstance(statement, ast.If):
        return _if(statement, indent)
    one = indent + _one_line(statement)
    if isinstance(statement, ast.ImportFrom) and not _fits(one, statement):  # the names in parentheses
        return _packed(f"{indent}from {statement.module} import (", [text_of(a) for a in statement.names],
                       indent + INDENT, ")")
    head, value = _simple(statement)
    if value is None or _fits(one, statement):
        return _commented([one], statement)
    if isinstance(statement, ast.Assign) and note_of(statement) is None and _splits_at_operators(value) \
            and _trailing_call(value) is None:  # a config's computed field (a commented line keeps its code)
        return _operators(head, value, indent)
    return _commented(_layout(value, indent, head, split=True), statement)


def _one_line(statement: ast.stmt) -> str:
    """The statement as `ast.unparse` writes it, but a returned tuple without parentheses (`return x, v`)."""
    value = statement.value if isinstance(statement, ast.Return) else None
    if isinstance(value, ast.Tuple) and value.elts and not any(isinstance(e, ast.Starred) for e in value.elts):
        return "return " + ", ".join(text_of(element) for element in value.elts)
    return text_of(statement)


def _simple(statement: ast.stmt) -> tuple[str, Optional[ast.expr]]:
    """A simple statement's text before its expression, and the expression (None: nothing to wrap)."""
    if isinstance(statement, ast.Assign):
        return " = ".join(text_of(t) for t in statement.targets) + " = ", statement.value
    if isinstance(statement, ast.AnnAssign) and statement.value is not None:
        return f"{text_of(statement.target)}: {text_of(statement.annotation)} = ", statement.value
    if isinstance(statement, ast.Return):
        return "return ", statement.value
    if isinstance(statement, ast.Raise):
        return "raise ", statement.exc
    if isinstance(statement, ast.Expr):
        return "", statement.value
    return "", None


def _class(node: ast.ClassDef, indent: str) -> list[str]:
    decorators = [f"{indent}@{text_of(d)}" for d in node.decorator_list]
    bases = ", ".join(text_of(base) for base in node.bases)
    header = f"{indent}class {node.name}" + (f"({bases})" if bases else "") + ":"
    if len(header) < LINE_LIMIT or not node.bases:  # a long comment (a spec's file name) stays on the line
        lines = [header]
    else:  # the bases hang one level deeper than the body, as a long `def` line's arguments do
        lines = _packed(f"{indent}class {node.name}(", [text_of(base) for base in node.bases], indent + INDENT * 2,
                        "):")
    return [*decorators, *_commented(lines, node), *print_statements(node.body, indent + INDENT, in_class=True)]


def _if(node: ast.If, indent: str, keyword: str = "if") -> list[str]:
    """`if`, its body and its `else`; an `else` that is one `if` written `elif`."""
    lines = _if_header(node, indent, keyword) + print_statements(node.body, indent + INDENT)
    if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
        return lines + _if(node.orelse[0], indent, "elif")
    if node.orelse:
        lines += [f"{indent}else:", *print_statements(node.orelse, indent + INDENT)]
    return lines


def _if_header(node: ast.If, indent: str, keyword: str = "if") -> list[str]:
    """`if test:`; a long `and` or `or` one operand a line (`if (a` / `or b):`), an `and` inside an `or` one
    of its operands a line too, each operand of the test with its own comment where the statement names one
    per operand (`notes`)."""
    header = f"{indent}{keyword} {text_of(node.test)}:"
    test = node.test
    if not _fits(header, node) and isinstance(test, ast.Call) and test.args and isinstance(test.args[-1], ast.Tuple) \
            and not test.keywords:  # `if isinstance(module, (` and the classes, two levels in
        before = "".join(f"{text_of(argument)}, " for argument in test.args[:-1])
        return _commented(_packed(f"{indent}{keyword} {text_of(test.func)}({before}(",
                                  [text_of(element) for element in test.args[-1].elts], indent + INDENT * 2, ")):"),
                          node)
    if _fits(header, node) or not isinstance(test, ast.BoolOp):
        return _commented([header], node)
    word = "and" if isinstance(test.op, ast.And) else "or"
    groups = [_conjuncts(value) if word == "or" else [_operand(value)] for value in test.values]
    lines: list[str] = []
    starts: list[int] = []    # each operand's first line, where its note goes
    for group in groups:
        starts.append(len(lines))
        for place, piece in enumerate(group):
            joined = "and" if place else word
            lines.append(f"{indent}{keyword} ({piece}" if not lines else f"{indent}{INDENT * 2}{joined} {piece}")
    lines[-1] += "):"
    notes: Optional[list[str]] = getattr(node, "notes", None)
    if notes is not None and len(notes) == len(groups):
        for start, note in zip(starts, notes):
            lines[start] += f"  # {note}"
        return lines
    return _commented(lines, node)


def _conjuncts(value: ast.expr) -> list[str]:
    """An operand of an `or`: an `and`'s operands, each on a line of its own (precedence reads them back)."""
    if isinstance(value, ast.BoolOp) and isinstance(value.op, ast.And):
        return [_operand(v) for v in value.values]
    return [_operand(value)]


def _operand(value: ast.expr) -> str:
    return f"({text_of(value)})" if isinstance(value, ast.BoolOp) else text_of(value)


def _parts(code: ast.expr) -> Optional[tuple[str, list[tuple[str, ast.expr]], str]]:
    """A bracketed expression's opening text, its items (each with the text before it: `name=` of a
    keyword, `'key': ` of a dict's entry) and its closing text; None where it has none to wrap."""
    if isinstance(code, ast.Call) and (code.args or code.keywords):
        opener, close = f"{text_of(code.func)}(", ")"
        only = code.args[0] if len(code.args) == 1 and not code.keywords else None
        if isinstance(only, ast.Dict) and only.keys and None not in only.keys:  # nn.ModuleDict({...}): its entries
            return opener + "{", [(f"{text_of(k)}: ", v) for k, v in zip(only.keys, only.values)
                                  if k is not None], "})"
        if isinstance(only, ast.List) and only.elts:  # nn.ModuleList([...]): its items
            return opener + "[", [("", item) for item in only.elts], "])"
        items = [("", a) for a in code.args] + [(f"{k.arg}=", k.value) for k in code.keywords if k.arg is not None]
        return opener, items, close
    if isinstance(code, ast.Tuple) and code.elts:
        return "(", [("", item) for item in code.elts], ",)" if len(code.elts) == 1 else ")"
    return None


def _layout(code: ast.expr, indent: str, head: str = "", split: bool = False) -> list[str]:
    """`head` and `code` at `indent`: one line, or (too long, or `split`) a bracketed expression's opening
    on the first line and its items packed on the lines after it, an item too long for a line wrapped so
    too; a string built of pieces, the pieces one a line."""
    one = indent + head + text_of(code)
    if len(one) < LINE_LIMIT and not split:
        return [one]
    trailing = _trailing_call(code)
    if trailing is not None:  # `x + self.dropout(` and the call's arguments after it
        before, called = trailing
        return _layout(called, indent, head + before, split)
    parts = _parts(code)
    if parts is None:  # a name or an attribute chain: in parentheses on a line of its own, where that fits
        inner = indent + INDENT + text_of(code) + ")"
        return [indent + head + "(", inner] if head and len(inner) < LINE_LIMIT else [one]
    opener, items, close = parts
    pieces = _pieces(items)
    if pieces is not None:  # raise ValueError(f'...'\n                 '...')
        first = indent + head + opener
        return [first + pieces[0], *(" " * len(first) + piece for piece in pieces[1:-1]),
                " " * len(first) + pieces[-1] + close]
    inner = indent + INDENT
    lines, current = [indent + head + opener], ""
    for item_head, item in items:
        text = item_head + text_of(item)
        candidate = f"{current}, {text}" if current else text
        if len(inner + candidate) + len(close) + 1 < LINE_LIMIT:
            current = candidate
            continue
        if current:
            lines.append(f"{inner}{current},")
        if len(inner + text) + len(close) + 1 >= LINE_LIMIT and _parts(item) is not None:
            *middle, last = _layout(item, inner, item_head)
            lines += middle
            current = last[len(inner):]
        elif len(inner + text) + len(close) >= LINE_LIMIT and isinstance(item, ast.IfExp):
            *middle, last = _choice(item, inner, item_head)
            lines += middle
            current = last[len(inner):]
        else:
            current = text
    lines.append(f"{inner}{current}{close}")
    return lines


def _choice(code: ast.IfExp, indent: str, head: str) -> list[str]:
    """A long `a if condition else b` in parentheses, its value, condition and alternative a line each."""
    under = indent + " " * (len(head) + 1)
    return [f"{indent}{head}({text_of(code.body)}", f"{under}if {text_of(code.test)}",
            f"{under}else {text_of(code.orelse)})"]


def _trailing_call(code: ast.expr) -> Optional[tuple[str, ast.expr]]:
    """Arithmetic that ends in a call (`x + self.dropout(...)`): the text before that call, and the call."""
    if not (isinstance(code, ast.BinOp) and type(code.op) in _SYMBOLS):
        return None
    last = code.right
    before = f"{text_of(code.left)} {_SYMBOLS[type(code.op)]} "
    deeper = _trailing_call(last)
    if deeper is not None:
        before, last = before + deeper[0], deeper[1]
    if _parts(last) is None or before + text_of(last) != text_of(code):  # parentheses: not a plain suffix
        return None
    return before, last


def _packed(first: str, items: list[str], inner: str, close: str) -> list[str]:
    """`first`, then `items` packed on lines at `inner`, the last line ending in `close`."""
    lines, current = [first], ""
    for item in items:
        candidate = f"{current}, {item}" if current else item
        if len(inner + candidate) + len(close) + 1 < LINE_LIMIT or not current:
            current = candidate
            continue
        lines.append(f"{inner}{current},")
        current = item
    lines.append(f"{inner}{current}{close}")
    return lines


def _pieces(items: list[tuple[str, ast.expr]]) -> Optional[list[str]]:
    """A lone string argument built of pieces (python_code.concatenated), as those pieces' literals."""
    if len(items) != 1 or items[0][0]:
        return None
    pieces: Optional[list[ast.expr]] = getattr(items[0][1], "pieces", None)
    return [text_of(piece) for piece in pieces] if pieces else None


# Binding strength of the operators arithmetic is split at; a split operation is parenthesized whole.
_PRECEDENCE = {ast.Add: 1, ast.Sub: 1, ast.Mult: 2, ast.Div: 2, ast.FloorDiv: 2, ast.Mod: 2, ast.Pow: 3}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}


def _splits_at_operators(code: ast.expr) -> bool:
    return isinstance(code, ast.BinOp) and type(code.op) in _SYMBOLS


def _operators(head: str, code: ast.expr, indent: str) -> list[str]:
    """`head` and long arithmetic in parentheses split at its operators, each operand on a line of its own
    (as far as it must be). It splits even where the expression alone would fit: the head is on its line."""
    laid = _laid_out(code, indent, 0, False, split=True)  # "(", the operands a level in, ... ")"
    return [f"{indent}{head}(", *laid[1:]]


def _laid_out(node: ast.expr, indent: str, outer: int, right: bool, split: bool = False, extra: int = 0) -> list[str]:
    """`node` at `indent`: one line, or (too long for one, or `split`) a parenthesized operation over
    several lines. `extra`: the characters its line gains around it (an operator before, parentheses
    closing after)."""
    strength = _PRECEDENCE.get(type(node.op), 0) if isinstance(node, ast.BinOp) else 0
    text = text_of(node)
    if isinstance(node, ast.BinOp) and (strength < outer or (right and strength == outer)):
        text = f"({text})"
    if not _splits_at_operators(node) or (not split and len(indent + text) + extra < LINE_LIMIT):
        return [indent + text]
    assert isinstance(node, ast.BinOp)
    inner, symbol = indent + INDENT, _SYMBOLS[type(node.op)]
    left = _laid_out(node.left, inner, strength, False)
    right_lines = _laid_out(node.right, inner, strength, True, extra=len(symbol) + 2 + extra)
    right_lines[0] = f"{inner}{symbol} {right_lines[0].lstrip()}"
    return [f"{indent}(", *left, *right_lines[:-1], right_lines[-1] + ")"]
