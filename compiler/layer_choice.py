"""One class for the layers of a stack that differ by their index: `if` statements of the layer's block
that read the index (`if (i + 1) % sliding_window_pattern != 0 { ... }`) become `if` statements of the
class's constructor over the config and the index it is given, instead of a class per kind of layer.
Where the two branches make one module by calls that differ only in a keyword whose None turns its
option off (an attention's sliding window), the constructor makes one call, that keyword chosen by the
condition.

The layers' classes are built first (compiler/lower.py), one syntax tree per layer; they merge where they
differ only in modules that such an `if` makes, their forwards the same. Anything else (a difference no such `if`
explains, a condition that reads more than the index and parameters) leaves them apart.

A branch no layer takes at the spec's values is written too, from the model built with that branch forced
(compiler/lower.py), so a config edited to take it (more layers, another `layer_types`) builds what the
same `--set` compiles. Where that model does not check, the constructor refuses the branch by name
(`branch_guards`).
"""

from __future__ import annotations

import ast as pyast
from dataclasses import dataclass
from typing import Iterator, Optional, Union

from . import ast
from .config import config_condition
from .diagnostics import Span
from .evaluate import Constant, ConstantError, evaluate
from .forward import where
from .ir import Instance
from .python_code import (Note, assign, call, class_def, concatenated, constant, function, note_of, noted,
                          statements_in, super_init, text_of, variable)


@dataclass(frozen=True)
class _Layer:
    """A layer class as compiler/lower.py builds it: its constructor's statements after
    `super().__init__()`, each `self.<attribute> = ...`, by attribute; and its forward."""

    cls: pyast.ClassDef
    attributes: dict[str, pyast.Assign]
    forward: pyast.FunctionDef


def _split(cls: pyast.ClassDef) -> Optional[_Layer]:
    """A layer class read as lower.py builds it (`__init__(self, config)` of one assignment per module, then
    `forward`): None where it is not so."""
    if len(cls.body) != 2 or not all(isinstance(method, pyast.FunctionDef) for method in cls.body):
        return None
    init, forward = cls.body
    assert isinstance(init, pyast.FunctionDef) and isinstance(forward, pyast.FunctionDef)
    attributes = {}
    for statement in init.body[1:]:  # after super().__init__()
        target = statement.targets[0] if isinstance(statement, pyast.Assign) and len(statement.targets) == 1 \
            else None
        if not (isinstance(target, pyast.Attribute) and isinstance(target.value, pyast.Name)
                and target.value.id == "self"):
            return None
        assert isinstance(statement, pyast.Assign)
        attributes[target.attr] = statement
    return _Layer(cls, attributes, forward)


@dataclass(frozen=True)
class Untaken:
    """A branch of one of a layer block's own `if` statements (over the index and parameters) that none of
    a stack's layers takes at the spec's values."""

    statement: ast.If
    branch: bool  # True: the `then` branch
    condition: pyast.expr  # the statement's condition as Python over the config and the index


def untaken_branches(block: ast.Block, index: str, count: int, fields: dict[str, Constant]) -> list[Untaken]:
    """The branches of `block`'s own `if` statements that none of `count` layers takes."""
    untaken = []
    for statement in block.body:
        condition = config_condition(statement.condition, fields, index) if isinstance(statement, ast.If) else None
        if condition is None:
            continue
        assert isinstance(statement, ast.If)
        taken = {_value(statement.condition, index, layer, fields) for layer in range(count)}
        if len(taken) == 1 and None not in taken:
            untaken.append(Untaken(statement, not taken.pop(), condition))
    return untaken


def branch_guards(untaken: list[Untaken], index: str) -> list[pyast.stmt]:
    """The constructor's statement that refuses a layer taking one of the `untaken` branches, where lowering
    could not write them (compiler/lower.py builds them otherwise): one `if` for them all."""
    if not untaken:
        return []
    refused = [item.condition if item.branch else pyast.UnaryOp(pyast.Not(), item.condition) for item in untaken]
    either = pyast.BoolOp(pyast.Or(), refused) if len(refused) > 1 else refused[0]
    message = concatenated(pyast.JoinedStr([pyast.Constant("layer "), pyast.FormattedValue(variable(index), -1),
                                            pyast.Constant(" takes a branch this file was generated without: ")]),
                           "compile the spec with these values (xspec compile --set)")
    guard = pyast.If(either, [pyast.Raise(call("ValueError", message), None)], [])
    spans = [where(item.statement.span) for item in untaken]
    noted(guard, ", ".join(spans))
    guard.notes = spans  # type: ignore[attr-defined]  # one an operand, if split
    return [guard]


# Which class each layer of a stack is, by the block's own conditions: a class's name, or (the condition
# over the config and the index, the spec's `if`, the choice where it holds, the choice where it does not).
Choice = Union[str, tuple[pyast.expr, Span, "Choice", "Choice"]]


def layer_kinds(block: ast.Block, index: str, classes: list[str], fields: dict[str, Constant]) -> Optional[Choice]:
    """Where the layers of a stack are classes of a few kinds (a hybrid's Mamba-2 and attention layers, each
    a class of its own), the `if` statements of the block (over the index and parameters) that say which
    layer is which: each splits the layers it is asked about into two that both occur. None where no such
    statements explain the classes."""
    candidates = []
    pending = list(block.body)
    while pending:
        statement = pending.pop(0)
        if isinstance(statement, ast.If):
            condition = config_condition(statement.condition, fields, index)
            if condition is not None:
                candidates.append((statement, condition))
            pending += [*statement.then, *statement.orelse]
    truths = {id(statement): [_value(statement.condition, index, layer, fields) for layer in range(len(classes))]
              for statement, _ in candidates}

    def choose(layers: list[int]) -> Optional[Choice]:
        kinds = {classes[layer] for layer in layers}
        if len(kinds) == 1:
            return kinds.pop()
        for statement, condition in candidates:
            truth = truths[id(statement)]
            taken = [layer for layer in layers if truth[layer] is True]
            others = [layer for layer in layers if truth[layer] is False]
            if not taken or not others or len(taken) + len(others) != len(layers):
                continue
            yes, no = choose(taken), choose(others)
            if yes is not None and no is not None:
                return condition, statement.span, yes, no
        return None

    return choose(list(range(len(classes))))


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


def guarded_layer_class(cls: pyast.ClassDef, index: str, guards: list[pyast.stmt]) -> Optional[pyast.ClassDef]:
    """One layer class (`cls`, as lower.py builds it) whose constructor takes the index as `index` and
    refuses the branches `guards` name; None where it is not of lower.py's form."""
    written = _split(cls)
    if written is None or index in ("self", "config"):
        return None
    return _indexed_class(written, index, [*guards, *written.attributes.values()])


def _indexed_class(written: _Layer, index: str, statements: list[pyast.stmt]) -> pyast.ClassDef:
    """The layer's class with a constructor that takes the layer's index, of `statements`."""
    init = function("__init__", ["self", "config", index], [super_init(), *statements])
    return class_def(written.cls.name, written.cls.bases, [init, written.forward], note_of(written.cls))


def layer_class_by_index(block: ast.Block, index: str, layers: list[Instance], classes: list[pyast.ClassDef],
                         fields: dict[str, Constant], optional: set[str],
                         guards: list[pyast.stmt]) -> Optional[pyast.ClassDef]:
    """One class for `layers` (their classes as lower.py builds them), whose constructor takes the layer's
    index as `index` and chooses its modules by the block's conditions; None where they cannot be one
    class. `optional`: the constructors' keywords whose None turns an option off (OpDef.optional_keywords);
    `guards` refuse the branches no layer takes (`branch_guards`)."""
    parts = [_split(cls) for cls in classes]
    if any(p is None for p in parts) or index in ("self", "config"):
        return None
    split = [p for p in parts if p is not None]
    first = split[0]
    if any(list(p.attributes) != list(first.attributes) for p in split):
        return None
    forward = _one_forward([p.forward for p in split])
    if forward is None:
        return None
    code = {a: [text_of(p.attributes[a]) for p in split] for a in first.attributes}
    differing = [a for a in first.attributes if len(set(code[a])) > 1]
    # id(if) -> (if, attribute -> branch -> its assignment)
    choices: dict[int, tuple[ast.If, dict[str, dict[bool, pyast.Assign]]]] = {}
    for attribute in differing:
        for layer, part, dump in zip(layers, split, code[attribute]):
            child = layer.children.get(attribute)
            found = _deciding_if(block.body, child.span) if child is not None else None
            if found is None:
                return None
            statement, taken = found
            chosen = choices.setdefault(id(statement), (statement, {}))[1].setdefault(attribute, {})
            if text_of(chosen.setdefault(taken, part.attributes[attribute])) != dump:
                return None  # layers in one branch differ: something else chose
    conditions = {}
    for key, (statement, branches) in choices.items():
        condition = config_condition(statement.condition, fields, index)
        if condition is None or any(len(assignments) != 2 for assignments in branches.values()):
            return None
        conditions[key] = condition
    statements: list[pyast.stmt] = [*guards]
    done: set[int] = set()
    for attribute, assignment in first.attributes.items():
        decided = next(((k, s, b) for k, (s, b) in choices.items() if attribute in b), None)
        if decided is None:
            statements.append(assignment)
            continue
        key, statement, branches = decided
        if key in done:
            continue
        done.add(key)
        merged = [_merged_choice(branch[True], branch[False], conditions[key], where(statement.span), optional)
                  for branch in branches.values()]
        if all(assignment is not None for assignment in merged):  # one constructor call, its arguments chosen
            statements += [assignment for assignment in merged if assignment is not None]
            continue
        statements.append(pyast.If(conditions[key], [branch[True] for branch in branches.values()],
                                   [branch[False] for branch in branches.values()]))
        noted(statements[-1], where(statement.span))
    return _indexed_class(first, index, statements)


def _one_forward(forwards: list[pyast.FunctionDef]) -> Optional[pyast.FunctionDef]:
    """The first layer's forward, if every layer's is the same code: a statement whose spec line differs (a
    function each branch defines) names them all."""
    if len({text_of(forward) for forward in forwards}) > 1:
        return None
    for versions in zip(*(statements_in(forward) for forward in forwards)):
        notes = [note for note in map(note_of, versions) if note is not None]
        pointers = sorted(dict.fromkeys(note.text for note in notes), key=_line_order)
        if len(pointers) > 1 and note_of(versions[0]) is not None:
            noted(versions[0], Note(", ".join(pointers), notes[0].shape, notes[0].dtype))
    return forwards[0]


def _line_order(pointer: str) -> tuple[str, int]:
    """`file.xspec:12` in the order of its file and line."""
    file, _, line = pointer.rpartition(":")
    return (file, int(line)) if line.isdigit() else (pointer, 0)


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


def _merged_choice(chosen: pyast.Assign, other: pyast.Assign, condition: pyast.expr, pointer: str,
                   optional: set[str]) -> Optional[pyast.Assign]:
    """The constructor of a module the condition chooses, as one call where the two calls differ only by
    keywords whose None turns an option off (a sliding window, None in a global layer, as transformers
    writes `sliding_window if layer_type == "sliding_attention" else None`): that keyword chosen by the
    condition (the assignment points to the spec's `if`). None where they differ otherwise."""
    call_a, call_b = chosen.value, other.value
    if not (isinstance(call_a, pyast.Call) and isinstance(call_b, pyast.Call)) or \
            pyast.dump(chosen.targets[0]) != pyast.dump(other.targets[0]) or \
            pyast.dump(call_a.func) != pyast.dump(call_b.func) or \
            [pyast.dump(a) for a in call_a.args] != [pyast.dump(a) for a in call_b.args]:
        return None
    mine = {k.arg: k.value for k in call_a.keywords if k.arg is not None}
    theirs = {k.arg: k.value for k in call_b.keywords if k.arg is not None}
    keywords: dict[str, pyast.expr] = {}
    for name in dict.fromkeys([*mine, *theirs]):
        a, b = mine.get(name), theirs.get(name)
        if a is not None and b is not None and pyast.dump(a) == pyast.dump(b):
            keywords[name] = a
        elif name not in optional:  # another difference: the branches say it better
            return None
        else:
            keywords[name] = pyast.IfExp(condition, a or constant(None), b or constant(None))
    return assign(chosen.targets[0], pyast.Call(call_a.func, call_a.args, [
        pyast.keyword(name, value) for name, value in keywords.items()]), pointer)


def kind_names(block: ast.Block, choice: Choice) -> dict[str, str]:
    """A name for each class `choice` chooses, from what the branch that chooses it calls first (the
    op or block: `gated_delta_net`, `sparse_feed_forward`): class -> that name. Empty where two classes
    would take one name, or a branch calls nothing."""
    statements = {statement.span: statement for statement in _ifs(block.body)}
    named: dict[str, str] = {}

    def walk(part: Choice, branch: Optional[tuple[ast.Stmt, ...]]) -> bool:
        if isinstance(part, str):
            callee = _first_callee(branch or ())
            if callee is None:
                return False
            named[part] = callee
            return True
        _, span, yes, no = part
        statement = statements[span]
        return walk(yes, statement.then) and walk(no, statement.orelse)

    if isinstance(choice, str) or not walk(choice, None) or len(set(named.values())) != len(named):
        return {}
    return named


def _ifs(statements: tuple[ast.Stmt, ...]) -> Iterator[ast.If]:
    for statement in statements:
        if isinstance(statement, ast.If):
            yield statement
            yield from _ifs(statement.then)
            yield from _ifs(statement.orelse)


def _first_callee(statements: tuple[ast.Stmt, ...]) -> Optional[str]:
    """The op or block the statements call first (outermost first: `sparse_feed_forward` of
    `h => sparse_feed_forward(h) as ffn`)."""
    for statement in statements:
        for expression in _expressions(statement):
            if isinstance(expression, ast.Call):
                return expression.callee.id
    return None


def _expressions(node: object) -> Iterator[object]:
    """The expressions of a statement, each before the ones inside it."""
    yield node
    if isinstance(node, (ast.Assign, ast.Return)):
        yield from _expressions(node.value)
    elif isinstance(node, ast.Call):
        for argument in (*node.args, *(keyword.value for keyword in node.kwargs)):
            yield from _expressions(argument)
    elif isinstance(node, ast.Lambda):
        yield from _expressions(node.body)
    elif isinstance(node, ast.BinOp):
        yield from _expressions(node.left)
        yield from _expressions(node.right)
    elif isinstance(node, ast.UnaryOp):
        yield from _expressions(node.operand)


def chooses_alike(block: ast.Block, index: str, layer: int, other: int, fields: dict[str, Constant]) -> bool:
    """Whether every condition of `block` is known, and the same in layer `layer` as in `other`."""
    values = [(_value(statement.condition, index, layer, fields), _value(statement.condition, index, other, fields))
              for statement in _ifs(block.body)]
    return all(mine is not None and mine == theirs for mine, theirs in values)
