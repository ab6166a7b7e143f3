"""One class for the layers of a stack that differ by their index: `if` statements of the layer's block
that read the index (`if (i + 1) % sliding_window_pattern != 0 { ... }`) become `if` statements of the
class's constructor over the config and the index it is given, instead of a class per kind of layer.
Where the two branches make one module of classes that differ only by a piece whose option may be None
(a sliding window), the constructor makes one call, that option chosen by the condition.

The layers' classes are written first (compiler/lower.py), one per layer; they merge where they differ
only in modules that such an `if` makes, their forwards the same. Anything else (a difference no such `if`
explains, a condition that reads more than the index and parameters) leaves them apart.

A branch no layer takes at the spec's values is not in the file, so a config edited to take it (more
layers, another `layer_types`) would build a model the spec does not describe. The constructor refuses
it by name instead (`branch_guards`).
"""

from __future__ import annotations

import ast as pyast
from dataclasses import dataclass
from typing import Mapping, Optional

from . import ast
from .config import condition_source, config_condition
from .diagnostics import Span
from .evaluate import Constant, ConstantError, evaluate
from .forward import where
from .ir import Instance
from .wrap import INDENT, LINE_LIMIT


@dataclass(frozen=True)
class _Layer:
    header: str
    attributes: dict[str, str]  # attribute -> its constructor's line, in order
    forward: str  # the rest of the class, from the blank line after the constructor


def _split(body: str) -> Optional[_Layer]:
    """A layer class as lower.py writes it (`class {NAME}(nn.Module):`, a constructor of one line per
    module, a blank line, the forward), read from its syntax tree: None where it is not so."""
    lines = body.rstrip("\n").split("\n")
    try:
        tree = pyast.parse(body.replace("{NAME}", "Layer", 1))
    except SyntaxError:
        return None
    cls = tree.body[0] if len(tree.body) == 1 and isinstance(tree.body[0], pyast.ClassDef) else None
    init = cls.body[0] if cls is not None and cls.body and isinstance(cls.body[0], pyast.FunctionDef) else None
    if init is None or init.name != "__init__" or len(init.body) < 1:
        return None
    attributes = {}
    for statement in init.body[1:]:  # after super().__init__()
        target = statement.targets[0] if isinstance(statement, pyast.Assign) and len(statement.targets) == 1 \
            else None
        if not (isinstance(target, pyast.Attribute) and isinstance(target.value, pyast.Name)
                and target.value.id == "self" and statement.lineno == statement.end_lineno):
            return None
        attributes[target.attr] = lines[statement.lineno - 1]
    end = init.end_lineno or init.lineno
    if end >= len(lines) or lines[end] != "":
        return None
    return _Layer(lines[0], attributes, "\n".join(lines[end:]))


def branch_guards(block: ast.Block, index: str, count: int, fields: dict[str, Constant]) -> list[str]:
    """The constructor's lines that refuse a layer whose `if` (of the block's own statements, over the
    index and parameters) takes a branch none of the `count` layers takes at the spec's values: one `if`
    for them all where it fits a line."""
    refused: list[tuple[pyast.expr, Span]] = []  # (the untaken branch's condition, the spec's `if`)
    for statement in block.body:
        condition = config_condition(statement.condition, fields, index) if isinstance(statement, ast.If) else None
        if condition is None:
            continue
        assert isinstance(statement, ast.If)
        taken = {_value(statement.condition, index, layer, fields) for layer in range(count)}
        if len(taken) != 1 or None in taken:
            continue
        tree = pyast.parse(condition_source(condition), mode="eval").body
        refused.append((tree if taken == {False} else pyast.UnaryOp(pyast.Not(), tree), statement.span))
    if not refused:
        return []
    either = pyast.BoolOp(pyast.Or(), [tree for tree, _ in refused]) if len(refused) > 1 else refused[0][0]
    test = [f"{INDENT * 2}if {pyast.unparse(either)}:  # {', '.join(where(span) for _, span in refused)}"]
    if len(test[0]) >= LINE_LIMIT and len(refused) > 1:  # `(A` and `or B):`, an operand and its `if` a line
        operands = [f"({pyast.unparse(tree)})" if isinstance(tree, pyast.BoolOp) and isinstance(tree.op, pyast.Or)
                    else pyast.unparse(tree) for tree, _ in refused]
        test = [f"{INDENT * 2}if ({operands[0]}", *(f"{INDENT * 4}or {operand}" for operand in operands[1:])]
        test[-1] += "):"
        test = [f"{line}  # {where(span)}" for line, (_, span) in zip(test, refused)]
    first = pyast.JoinedStr([pyast.Constant("layer "), pyast.FormattedValue(pyast.Name(index), -1),
                             pyast.Constant(" takes a branch this file was generated without: ")])
    raising = f"{INDENT * 3}raise ValueError("
    refusal = [raising + pyast.unparse(first),
               " " * len(raising) + repr("compile the spec with these values (xspec compile --set)") + ")"]
    return [*test, *refusal]


def _value(condition: ast.Expr, index: str, layer: int, fields: dict[str, Constant]) -> Optional[bool]:
    """The condition's truth in layer `layer`; None where it is not a truth value the spec can compute."""
    def lookup(name: ast.Name) -> Constant:
        if name.id == index:
            return layer
        if name.id in fields:
            return fields[name.id]
        raise ConstantError("unknown-name", name.span, name.id)

    try:
        value = evaluate(condition, lookup)
    except ConstantError:
        return None
    return value if isinstance(value, bool) else None


def guarded_layer_class(body: str, index: str, guards: list[str]) -> Optional[str]:
    """One layer class (`body`, as lower.py writes it) whose constructor takes the index as `index` and
    refuses the branches `guards` name; None where it is not of lower.py's form."""
    written = _split(body)
    if written is None or index in ("self", "config"):
        return None
    lines = [*_indexed_constructor(written, index, guards), *written.attributes.values()]
    return "\n".join(lines) + "\n" + written.forward + "\n"


def _indexed_constructor(written: _Layer, index: str, guards: list[str]) -> list[str]:
    """The class line and the start of a constructor that takes the layer's index, its guards first."""
    return [written.header, f"{INDENT}def __init__(self, config, {index}):", f"{INDENT * 2}super().__init__()",
            *guards]


def layer_class_by_index(block: ast.Block, index: str, layers: list[Instance], bodies: list[str], keys: list[str],
                         fields: dict[str, Constant], pieces_of: dict[str, tuple[str, ...]],
                         optional: Mapping[str, str], guards: list[str]) -> Optional[str]:
    """The body of one class for `layers` (their bodies and shape-free keys as lower.py writes them), whose
    constructor takes the layer's index as `index` and chooses its modules by the block's conditions; None
    where they cannot be one class. `pieces_of` gives the library pieces of the file's combined classes,
    `optional` the pieces whose option may be None, with that option (OpDef.optional_pieces); `guards`
    refuse the branches no layer takes (`branch_guards`)."""
    parts, written = [_split(key) for key in keys], _split(bodies[0])
    if any(p is None for p in parts) or written is None or index in ("self", "config"):
        return None
    split = [p for p in parts if p is not None]
    first = split[0]
    if any(list(p.attributes) != list(first.attributes) for p in split):
        return None
    forward = _one_forward(written.forward, [p.forward for p in split])
    if forward is None:
        return None
    differing = [a for a in first.attributes if len({p.attributes[a] for p in split}) > 1]
    choices: dict[int, tuple[ast.If, dict[str, dict[bool, str]]]] = {}  # id(if) -> (if, attribute -> branch -> line)
    for attribute in differing:
        for layer, part in zip(layers, split):
            child = layer.children.get(attribute)
            found = _deciding_if(block.body, child.span) if child is not None else None
            if found is None:
                return None
            statement, taken = found
            chosen = choices.setdefault(id(statement), (statement, {}))[1].setdefault(attribute, {})
            if chosen.setdefault(taken, part.attributes[attribute]) != part.attributes[attribute]:
                return None  # layers in one branch differ: something else chose
    conditions = {}
    for key, (statement, branches) in choices.items():
        condition = config_condition(statement.condition, fields, index)
        if condition is None or any(len(lines) != 2 for lines in branches.values()):
            return None
        conditions[key] = condition_source(condition)
    lines = _indexed_constructor(written, index, guards)
    done: set[int] = set()
    for attribute, line in written.attributes.items():
        decided = next(((k, s, b) for k, (s, b) in choices.items() if attribute in b), None)
        if decided is None:
            lines.append(line)
            continue
        key, statement, branches = decided
        if key in done:
            continue
        done.add(key)
        merged = [_merged_choice(branch[True], branch[False], conditions[key], where(statement.span), pieces_of,
                                 optional) for branch in branches.values()]
        if all(line is not None for line in merged):  # one constructor call, its arguments chosen
            lines += [line for line in merged if line is not None]
            continue
        lines.append(f"{INDENT * 2}if {conditions[key]}:  # {where(statement.span)}")
        lines += [INDENT + branch[True] for branch in branches.values()]
        lines.append(f"{INDENT * 2}else:")
        lines += [INDENT + branch[False] for branch in branches.values()]
    return "\n".join(lines) + "\n" + forward + "\n"


def _one_forward(written: str, forwards: list[str]) -> Optional[str]:
    """The first layer's forward (`written`), if every layer's is the same code: a line whose spec line
    differs (a function each branch defines) names them all."""
    rows = [forward.split("\n") for forward in forwards]
    if any(len(row) != len(rows[0]) for row in rows):
        return None
    lines = written.split("\n")
    for number, versions in enumerate(zip(*rows)):
        code = {version.split("  # ", 1)[0] for version in versions}
        if len(code) > 1:
            return None
        pointers = list(dict.fromkeys(version.rsplit("  # ", 1)[-1] for version in versions if "  # " in version))
        if len(pointers) > 1 and lines[number].endswith(pointers[0]):
            lines[number] = lines[number].removesuffix(pointers[0]) + ", ".join(pointers)
    return "\n".join(lines)


def _deciding_if(body: tuple[ast.Stmt, ...], span: Span) -> Optional[tuple[ast.If, bool]]:
    """The `if` statement of `body` (not nested in another) one of whose branches holds `span`, and which."""
    for statement in body:
        if isinstance(statement, ast.If):
            for taken, branch in ((True, statement.then), (False, statement.orelse)):
                if branch and _holds(branch, span):
                    return statement, taken
    return None


def _holds(statements: tuple[ast.Stmt, ...], span: Span) -> bool:
    start, end = statements[0].span, statements[-1].span
    return span.file == start.file and (start.line, start.col) <= (span.line, span.col) \
        and (span.end_line, span.end_col) <= (end.end_line, end.end_col)


def _merged_choice(chosen: str, other: str, condition: str, pointer: str, pieces_of: dict[str, tuple[str, ...]],
                   optional_pieces: Mapping[str, str]) -> Optional[str]:
    """The constructor line of a module whose class the condition chooses, as one call where the two
    classes differ only by pieces whose option may be None (a sliding window, None in a global layer, as
    transformers writes `sliding_window if layer_type == "sliding_attention" else None`): the class with
    them, that option chosen by the condition (the line points to the spec's `if`). None where they
    differ otherwise."""
    first, second = _constructor_call(chosen), _constructor_call(other)
    if first is None or second is None:
        return None
    (target, call, code), (other_target, other_call, other_code) = first, second
    names = [c.func.id for c in (call, other_call) if isinstance(c.func, pyast.Name)]
    if target != other_target or len(names) != 2 or [pyast.dump(a) for a in call.args] != \
            [pyast.dump(a) for a in other_call.args]:
        return None
    pieces = [set(pieces_of.get(name, (name,))) for name in names]
    differing = pieces[0] ^ pieces[1]
    if not differing or not differing <= set(optional_pieces):
        return None
    cls = names[0] if pieces[0] >= pieces[1] else names[1] if pieces[1] >= pieces[0] else None
    if cls is None:
        return None
    optional = {optional_pieces[piece] for piece in differing}
    mine, theirs = _keywords(call, code), _keywords(other_call, other_code)
    arguments = [pyast.get_source_segment(code, a) or "" for a in call.args]
    for name in dict.fromkeys([*mine, *theirs]):
        a, b = mine.get(name), theirs.get(name)
        if a is not None and b is not None and a[1] == b[1]:
            arguments.append(f"{name}={a[0]}")
        elif name not in optional:  # another difference: the branches say it better
            return None
        else:
            arguments.append(f"{name}={a[0] if a else 'None'} if {condition} else {b[0] if b else 'None'}")
    return f"{INDENT * 2}{target} = {cls}({', '.join(arguments)})  # {pointer}"


def _constructor_call(line: str) -> Optional[tuple[str, pyast.Call, str]]:
    """`self.x = Cls(...)  # spec:line`: its target, call and code."""
    code = line.strip().partition("  # ")[0]
    try:
        statement = pyast.parse(code).body[0]
    except SyntaxError:
        return None
    if not (isinstance(statement, pyast.Assign) and isinstance(statement.value, pyast.Call)):
        return None
    return code[:code.index(" = ")], statement.value, code


def _keywords(call: pyast.Call, code: str) -> dict[str, tuple[str, str]]:
    """Each keyword argument's source and syntax tree."""
    return {k.arg: (pyast.get_source_segment(code, k.value) or "", pyast.dump(k.value))
            for k in call.keywords if k.arg is not None}
