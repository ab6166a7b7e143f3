"""One class for the layers of a stack that differ by their index: `if` statements of the layer's block
that read the index (`if (i + 1) % sliding_window_pattern != 0 { ... }`) become `if` statements of the
class's constructor over the config and the index it is given, nested as the spec nests them, instead of a
class per layer. Where the two branches make one module by calls that differ only in a keyword whose None
turns its option off (an attention's sliding window), the constructor makes one call, that keyword chosen by
the condition. Where the layers' forwards differ too (a hybrid's kinds), `layer_kinds` says which `if`s tell
the kinds apart, and compiler/layer_branches.py merges their forwards.

The layers' classes are built first (compiler/lower.py), one syntax tree per layer; a module that differs
between layers is attributed to the `if` of the block whose branch makes it. Anything else (a difference no
such `if` explains, a condition that reads more than the index and parameters) leaves them apart.

A branch no layer takes at the spec's values is written too, from the model built with that branch forced
(compiler/lower.py; `Truths` counts its layers after the stack's own), so a config edited to take it (more
layers, another `layer_types`) builds what the same `--set` compiles. Where that model does not check, the
constructor refuses the branch by name (`branch_guards`).
"""

from __future__ import annotations

import ast as pyast
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Optional, Union

from . import ast
from .config import config_condition
from .diagnostics import Span
from .evaluate import Constant, ConstantError, evaluate
from .forward import where
from .ir import Instance
from .python_code import (Note, assign, call, concatenated, constant, if_statement, note_of, noted, statements_in,
                          text_of, variable)


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


def layer_kinds(truths: Truths, kinds: list[str], differing: list[Span]) -> Optional[Choice]:
    """Where the layers of a stack are of a few kinds (a hybrid's Mamba-2 and attention layers), the `if`
    statements of the block (over the index and parameters) that say which layer (`kinds`: each one's, by
    position, as `truths` counts them) is which: each makes in its branches what the kinds compute differently
    (`differing`: where the spec writes it), and splits the layers it is asked about into two that both occur.
    None where no such statements explain the kinds."""
    candidates = []
    pending = list(truths.block.body)
    while pending:
        statement = pending.pop(0)
        if isinstance(statement, ast.If):
            condition = config_condition(statement.condition, truths.fields, truths.index)
            if condition is not None and any(branch and _holds(branch, span) for span in differing
                                             for branch in (statement.then, statement.orelse)):
                candidates.append((statement, condition))
            pending += [*statement.then, *statement.orelse]
    taking = {id(statement): [truths.of(statement, position) for position in range(len(kinds))]
              for statement, _ in candidates}

    def choose(layers: list[int]) -> Optional[Choice]:
        found = {kinds[layer] for layer in layers}
        if len(found) == 1:
            return found.pop()
        for statement, condition in candidates:
            truth = taking[id(statement)]
            taken = [layer for layer in layers if truth[layer] is True]
            others = [layer for layer in layers if truth[layer] is False]
            if not taken or not others or len(taken) + len(others) != len(layers):
                continue
            yes, no = choose(taken), choose(others)
            if yes is not None and no is not None:
                return condition, statement.span, yes, no
        return None

    return choose(list(range(len(kinds))))


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


@dataclass(frozen=True)
class Truths:
    """Which branch of each of a block's `if` statements (over the index and parameters) each layer takes: at
    the spec's values, or, for the layers of a model built with untaken branches taken (positions from
    `count` on, the same layers again), as `forced` (id of the `if` -> branch) says."""

    block: ast.Block
    index: str
    fields: dict[str, Constant]
    count: int
    forced: Mapping[int, bool] = field(default_factory=dict)

    def of(self, statement: ast.If, position: int) -> Optional[bool]:
        if position >= self.count and id(statement) in self.forced:
            return self.forced[id(statement)]
        return _value(statement.condition, self.index, position % self.count, self.fields)


# A layer's modules as its constructor makes them: attribute -> `self.<attribute> = ...` (compiler/lower.py).
Modules = dict[str, pyast.Assign]


def indexed_constructor(truths: Truths, layers: list[Instance], modules: list[Modules],
                        optional: set[str]) -> Optional[list[pyast.stmt]]:
    """One constructor's statements for `layers` (each one's `modules`), after `super().__init__()`: each
    module the same in every layer made once, the others in the block's `if` statements that choose them,
    over the config and the index, nested as the spec nests them. Where two branches make one module by
    calls that differ only in a keyword whose None turns its option off (`optional`), one call, that keyword
    chosen. None where something else tells the layers apart."""
    if truths.index in ("self", "config"):
        return None
    order: list[str] = []
    for made in modules:  # every layer's modules, each after the one it follows in its own layer
        previous = None
        for name in made:
            if name not in order:
                order.insert(order.index(previous) + 1 if previous is not None else 0, name)
            previous = name
    return _chosen(truths, order, list(range(len(modules))), layers, modules, truths.block.body, optional)


def _chosen(truths: Truths, attributes: list[str], positions: list[int], layers: list[Instance],
            modules: list[Modules], scope: tuple[ast.Stmt, ...], optional: set[str]) -> Optional[list[pyast.stmt]]:
    """The statements that make `attributes` in the layers at `positions`, whose `if`s are those of `scope`."""
    statements: list[Union[pyast.stmt, int]] = []  # an int: the `if` of that id, made below
    decided: dict[int, tuple[ast.If, list[str]]] = {}
    for attribute in attributes:
        present = [p for p in positions if attribute in modules[p]]
        if not present:
            continue
        if len(present) == len(positions) and len({text_of(modules[p][attribute]) for p in present}) == 1:
            statements.append(modules[present[0]][attribute])
            continue
        children = [layers[p].children.get(attribute) for p in present]   # none: a module the forward holds
        found = [_deciding_if(scope, child.span) if child is not None else None for child in children]
        statements_found = {id(deciding[0]): deciding[0] for deciding in found if deciding is not None}
        if None in found or len(statements_found) != 1:
            return None  # the layers differ where no one `if` of this scope chooses
        statement = next(iter(statements_found.values()))
        if id(statement) not in decided:
            decided[id(statement)] = (statement, [])
            statements.append(id(statement))
        decided[id(statement)][1].append(attribute)
    made: list[pyast.stmt] = []
    for item in statements:
        if not isinstance(item, int):
            made.append(item)
            continue
        statement, chosen = decided[item]
        taking = [truths.of(statement, p) for p in positions]
        condition = config_condition(statement.condition, truths.fields, truths.index)
        if None in taking or condition is None:
            return None
        arms = [_chosen(truths, chosen, [p for p, taken in zip(positions, taking) if taken is branch], layers,
                        modules, body, optional)
                for branch, body in ((True, statement.then), (False, statement.orelse))]
        if arms[0] is None or arms[1] is None:
            return None
        made.append(_if_made(statement, condition, arms[0], arms[1], optional))
    return made


def _if_made(statement: ast.If, condition: pyast.expr, then: list[pyast.stmt], orelse: list[pyast.stmt],
             optional: set[str]) -> pyast.stmt:
    pointer = where(statement.span)
    if len(then) == len(orelse) == 1 and isinstance(then[0], pyast.Assign) and isinstance(orelse[0], pyast.Assign):
        one = _merged_choice(then[0], orelse[0], condition, pointer, optional)
        if one is not None:
            return one
    if not then:
        return if_statement(pyast.UnaryOp(pyast.Not(), condition), orelse, [], pointer)
    return if_statement(condition, then, orelse, pointer)


def one_forward(forwards: list[pyast.FunctionDef]) -> Optional[pyast.FunctionDef]:
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


def branch_name(block: ast.Block, span: Span) -> str:
    """What the `then` branch of the block's `if` at `span` is: the kind its condition compares a value with
    (`sliding_attention` of `use_sliding_window and layer_types[i] == "sliding_attention"`), else what the
    branch calls first (`gated_delta_net`), else `branch`."""
    statement = next((statement for statement in _ifs(block.body) if statement.span == span), None)
    if statement is None:
        return "branch"
    kind = _compared_text(statement.condition)
    return kind if kind is not None and kind.isidentifier() else _first_callee(statement.then) or "branch"


def _compared_text(condition: ast.Expr) -> Optional[str]:
    """The text a condition tests a value to equal (`x == "text"`), through `and`."""
    if isinstance(condition, ast.BinOp) and condition.op == "==":
        for side in (condition.right, condition.left):
            if isinstance(side, ast.Literal) and isinstance(side.value, str):
                return side.value
    if isinstance(condition, ast.BinOp) and condition.op == "and":
        return _compared_text(condition.right) or _compared_text(condition.left)
    return None


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
