"""A block's `if` over one boolean parameter (`if norm_first { ... }`) stays a choice of its class, over the
config, as nn.TransformerEncoderLayer keeps `norm_first`: a config edited to flip the flag builds what the same
--set compiles. So does a string parameter the spec lists two values for (`param positions = "sinusoidal" in
["sinusoidal", "learned"]`), chosen by `if config.positions == "learned":`.

The model is built once more with the flag the other way (the `if`s that read it forced to their other
branch) and lowered, and the class each block instance has in the two builds is merged statement by
statement (compiler/lower.py): what both write alike once, what differs under `if config.<flag>:` in the
constructor and `if self.<flag>:` in the forward, the flag kept on the module. A flag is left as the spec's
value decides it where that would not be sound: another parameter's expression reads it (the other build
would not compute that one anew) or a tie's condition does, a class of the other build is none of this
one's, a class differs under two flags, or a class differs whose block does not read the flag (the other
build differs by something else: its untaken branches refused by the bound on builds). Only the blocks the
model uses are read: a base spec's block a derived one replaced makes no flag.
"""

from __future__ import annotations

import ast as pyast
import copy
import difflib
from typing import Optional, Sequence

from . import ast
from .body import ifs_in, reads
from .evaluate import Constant, ConstantError, evaluate
from .forward import where
from .python_code import assign, attribute, constant, dotted, if_statement, text_of, variable

# Flags whose other build lowering makes, at most (each a whole model's build and lowering).
MAX_FLAGS = 4


def flag_ifs(blocks: Sequence[ast.Block], expressions: dict[str, ast.Expr], ties: Sequence[ast.Tie],
             fields: dict[str, Constant], choices: dict[str, tuple[Constant, ...]]) -> dict[str, list[ast.If]]:
    """Each flag (a boolean field, or a string field of two listed values) that `if` statements read alone (`if
    norm_first`, `if positions == "learned"`), read by no other parameter's expression and no tie's condition
    (compiler/tie_choice.py leaves those decided): the statements."""
    found: dict[str, list[ast.If]] = {}
    for block in blocks:
        for statement in ifs_in(block.body):
            names = set(reads(statement.condition))
            if len(names) == 1 and flipped(name := names.pop(), fields, choices) is not None:
                found.setdefault(name, []).append(statement)
    derived = {read for field, expression in expressions.items() for read in reads(expression) if read != field}
    derived |= {read for tie in ties if tie.condition is not None for read in reads(tie.condition)}
    return dict([(field, ifs) for field, ifs in found.items() if field not in derived][:MAX_FLAGS])


def condition_fields(blocks: Sequence[ast.Block]) -> frozenset[str]:
    """The parameters the blocks' `if` statements read (`final_logit_softcapping > 0`). A number the forward
    computes from one is written as its value: a config edited across the condition would not take the other
    branch (only flags, booleans and strings, stay choices)."""
    return frozenset(name for block in blocks for statement in ifs_in(block.body)
                     for name in reads(statement.condition))


def flipped(field: str, fields: dict[str, Constant], choices: dict[str, tuple[Constant, ...]]
            ) -> Optional[Constant]:
    """The flag's value other than the spec's: a boolean's negation, a two-valued string's other value; None
    where the field is no flag."""
    value = fields.get(field)
    if isinstance(value, bool):
        return not value
    listed = choices.get(field, ())
    if isinstance(value, str) and len(listed) == 2 and value in listed and all(isinstance(v, str) for v in listed):
        return listed[1] if listed[0] == value else listed[0]
    return None


def condition(owner: pyast.expr, field: str, tested: Constant) -> pyast.expr:
    """`config.norm_first`, `self.positions == 'learned'`: the flag at `tested` (True for a boolean)."""
    read = attribute(owner, field)
    return read if tested is True else pyast.Compare(read, [pyast.Eq()], [constant(tested)])


def forcing(ifs: Sequence[ast.If], field: str, value: Constant) -> Optional[dict[int, bool]]:
    """The branch each of `ifs` takes with `field` at `value` (by the statement's id); None where a condition
    is no truth value then."""
    def lookup(name: ast.Name) -> Constant:
        if name.id != field:
            raise _OtherName
        return value

    forced = {}
    for statement in ifs:
        try:
            taken = evaluate(statement.condition, lookup)
        except (ConstantError, _OtherName):
            return None
        if not isinstance(taken, bool):
            return None
        forced[id(statement)] = taken
    return forced


class _OtherName(Exception):
    """A condition read a name other than the flag."""


def owns(block: ast.Block, ifs: Sequence[ast.If]) -> bool:
    """Whether one of `ifs` is the block's own."""
    own = set(map(id, ifs_in(block.body)))
    return any(id(statement) in own for statement in ifs)


def spec_line(ifs: Sequence[ast.If], block: Optional[ast.Block]) -> str:
    """Where a class's choice is written: its block's `if` among `ifs` (else the first of them)."""
    own = set(map(id, ifs_in(block.body))) if block is not None else set()
    return where(next((statement for statement in ifs if id(statement) in own), ifs[0]).span)


def renamed(tree: pyast.ClassDef, names: dict[str, str]) -> pyast.ClassDef:
    """A class of the other build, the classes it constructs named as this build names them (in place)."""
    for node in pyast.walk(tree):
        if isinstance(node, pyast.Name) and node.id in names:
            node.id = names[node.id]
    return tree


def merged_class(mine: pyast.ClassDef, other: pyast.ClassDef, field: str, tested: Constant, holds: bool,
                 pointer: str) -> Optional[pyast.ClassDef]:
    """One class of `mine` (the flag at the spec's value) and `other` (the flag the other way), each a
    constructor and a forward: the statements that differ chosen by whether the flag is `tested` (which holds
    for `mine` where `holds`). None where the two are not of that form, or the forward must read the flag and
    its name is an attribute the class already has."""
    parts = [_methods(cls) for cls in (mine, other)]
    if parts[0] is None or parts[1] is None:
        return None
    (my_init, my_forward), (other_init, other_forward) = parts[0], parts[1]
    if text_of(my_init.args) != text_of(other_init.args) or text_of(my_forward.args) != text_of(other_forward.args):
        return None
    init = _joined(_chosen(my_init.body[1:], other_init.body[1:], condition(variable("config"), field, tested),
                           holds, pointer))
    forward = _chosen(my_forward.body, other_forward.body, condition(variable("self"), field, tested), holds,
                      pointer)
    kept = [assign(f"self.{field}", dotted(f"config.{field}"), pointer)] if forward != my_forward.body else []
    made = {text_of(target) for init_ in (my_init, other_init) for statement in init_.body
            if isinstance(statement, pyast.Assign) for target in statement.targets}
    if kept and f"self.{field}" in made:
        return None
    merged = copy.copy(mine)
    merged.body = [*mine.body[:-2], _with_body(my_init, [my_init.body[0], *kept, *init]),
                   _with_body(my_forward, forward)]
    return merged


def _methods(cls: pyast.ClassDef) -> Optional[tuple[pyast.FunctionDef, pyast.FunctionDef]]:
    """A generated block class's constructor and forward, its last two statements."""
    if len(cls.body) < 2:
        return None
    init, forward = cls.body[-2], cls.body[-1]
    if not (isinstance(init, pyast.FunctionDef) and init.name == "__init__" and isinstance(forward, pyast.FunctionDef)
            and forward.name == "forward"):
        return None
    return init, forward


def _with_body(method: pyast.FunctionDef, body: list[pyast.stmt]) -> pyast.FunctionDef:
    changed = copy.copy(method)
    changed.body = body
    return changed


def _chosen(mine: list[pyast.stmt], other: list[pyast.stmt], flag: pyast.expr, holds: bool,
            pointer: str) -> list[pyast.stmt]:
    """The statements of both, those that differ under `if flag:` (its branch the one that holds there): each
    side runs its own statements in its own order, and the ones they share once."""
    matcher = difflib.SequenceMatcher(None, [text_of(s) for s in mine], [text_of(s) for s in other], autojunk=False)
    chosen: list[pyast.stmt] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            chosen += mine[i1:i2]
            continue
        then, otherwise = (mine[i1:i2], other[j1:j2]) if holds else (other[j1:j2], mine[i1:i2])
        if not then:
            chosen.append(if_statement(pyast.UnaryOp(pyast.Not(), flag), otherwise, (), pointer))
        elif otherwise and isinstance(then[-1], pyast.Return):  # the other side goes on after the `if`
            chosen += [if_statement(flag, then, (), pointer), *otherwise]
        else:
            chosen.append(if_statement(flag, then, otherwise, pointer))
    return chosen


def _joined(init: list[pyast.stmt]) -> list[pyast.stmt]:
    """A constructor's `if`s over the flag made one where only assignments of modules built from the config
    stand between (T5's `wi_0` and `wi_1` under one `if config.is_gated_act:`): those assignments read no
    attribute another sets, so moving one changes only the order the modules are registered in."""
    joined: list[pyast.stmt] = []
    for statement in init:
        at = len(joined) - 1
        while at >= 0 and _builds_from_config(joined[at]):
            at -= 1
        first = joined[at] if at >= 0 else None
        if not (isinstance(statement, pyast.If) and isinstance(first, pyast.If)
                and _flag_of(first.test) == _flag_of(statement.test)):
            joined.append(statement)
            continue
        same = text_of(first.test) == text_of(statement.test)
        merged = copy.copy(first)
        merged.body = [*first.body, *(statement.body if same else statement.orelse)]
        merged.orelse = [*first.orelse, *(statement.orelse if same else statement.body)]
        joined[at] = merged
    return joined


def _builds_from_config(statement: pyast.stmt) -> bool:
    """`self.x = Module(config...)`: an assignment that reads nothing of `self`."""
    return isinstance(statement, pyast.Assign) and \
        not any(isinstance(node, pyast.Name) and node.id == "self" for node in pyast.walk(statement.value))


def _flag_of(test: pyast.expr) -> str:
    """The flag an `if` tests, as code (`config.norm_first`), negated or not."""
    return text_of(test.operand if isinstance(test, pyast.UnaryOp) and isinstance(test.op, pyast.Not) else test)
