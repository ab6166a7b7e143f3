"""One class for the layers of a hybrid stack, whose kinds compute differently (attention in some layers, a
Mamba-2 or gated delta-net mixer in others), as transformers writes Bamba's, Nemotron-H's and Qwen3-Next's
decoder layers: the constructor keeps the layer's kind (`self.layer_type = config.layer_types[i]`) and makes
the modules of that kind; the forward runs the steps all kinds share once and branches on the kind where
they differ (`if self.layer_type == 'full_attention':`).

The kinds' forwards are merged as programs (compiler/ir.py), not as text: steps of the same spec text that
compute the same code on the same values are one step; the steps between are the arms of a `branch` step,
which yields under one name what the steps after it read. Their constructors, made of the modules each
kind holds, merge the same way (compiler/lower.py builds them), the differing ones in the spec's `if`.
"""

from __future__ import annotations

import ast as pyast
import copy
from dataclasses import dataclass, field, replace
from typing import Callable, Hashable, Optional

from .diagnostics import Span
from .ir import Const, Operand, Program, Step
from .python_code import assign, if_statement, text_of


@dataclass
class _Region:
    """The steps of each program between two steps they share: an arm each."""

    mine: list[Step] = field(default_factory=list)
    theirs: list[Step] = field(default_factory=list)
    joins: list[tuple[str, str]] = field(default_factory=list)  # (my value, theirs) read after the region

    def made(self, ref: str, side: int) -> bool:
        return any(ref in step.outputs for step in (self.mine if side == 0 else self.theirs))


def merged_program(mine: Program, theirs: Program, condition: pyast.expr, span: Span,
                   signature: Callable[[Step], Hashable]) -> Optional[Program]:
    """One program that computes `mine` where `condition` holds and `theirs` where it does not: the steps
    both share once, those between in a branch step. `signature` says which steps may be the same (the same
    spec text and code); they are where they also read the same values. None where an arm reads a value
    another arm made, or the programs take other parameters."""
    if list(mine.params) != list(theirs.params) or len(mine.results) != len(theirs.results):
        return None
    renamed: dict[str, str] = {theirs.params[name]: ref for name, ref in mine.params.items()}
    shared: list[Step] = []  # regions[k] comes before shared[k]; the last region before the results
    regions: list[_Region] = [_Region()]
    i = j = 0
    for a, b in _common(mine.steps, theirs.steps, signature):
        region = regions[-1]
        region.mine += mine.steps[i:a]
        region.theirs += theirs.steps[j:b]
        step, other = mine.steps[a], theirs.steps[b]
        if list(step.inputs) == list(other.inputs) and \
                _read(list(zip(step.inputs.values(), other.inputs.values())), regions, renamed):
            renamed.update(zip(other.outputs, step.outputs))
            shared.append(step)
            regions.append(_Region())
        else:  # other values: not the same step
            region.mine.append(step)
            region.theirs.append(other)
        i, j = a + 1, b + 1
    regions[-1].mine += mine.steps[i:]
    regions[-1].theirs += theirs.steps[j:]
    if not _read(list(zip(mine.results, theirs.results)), regions, renamed):
        return None
    known = set(mine.params.values()) | {ref for step in shared for ref in step.outputs}
    steps: list[Step] = []
    for k, region in enumerate(regions):
        if region.mine or region.theirs:
            branch = _branch(region, mine, theirs, condition, span, renamed)
            if not all(_reads_within(arm, known) for arm in branch.programs()):
                return None
            steps.append(branch)
            known |= set(branch.outputs)
        if k < len(shared):
            steps.append(shared[k])
    return Program(dict(mine.params), steps, mine.results, {**theirs.hints, **mine.hints})


def _reads_within(arm: Program, known: set[str]) -> bool:
    """Whether an arm reads only values made before its branch or by its own steps (not another arm's)."""
    made = set(known)
    for step in arm.steps:
        if not {ref for ref in step.reads()} <= made | {ref for inner in step.programs() for s in inner.steps
                                                         for ref in s.outputs} | _params(step):
            return False
        made |= set(step.outputs)
    return all(ref in made for ref in arm.results if isinstance(ref, str))


def _params(step: Step) -> set[str]:
    return {ref for inner in step.programs() for ref in inner.params.values()} | \
        {loop for _, loop, _, _ in step.carried if loop is not None}


def _read(reads: list[tuple[Operand, Operand]], regions: list[_Region], renamed: dict[str, str]) -> bool:
    """Whether a shared step reading `reads` (my value, theirs) reads the same in both programs: a value made
    before both, or one the two arms of a region make (joined: the region yields it). Joins are recorded
    only where every read is the same."""
    joins: list[tuple[_Region, tuple[str, str]]] = []
    for a, b in reads:
        if isinstance(a, Const) or isinstance(b, Const):
            if not (isinstance(a, Const) and isinstance(b, Const) and a.value == b.value):
                return False
            continue
        home = next((region for region in regions if region.made(a, 0)), None)
        if home is None:
            if renamed.get(b) != a:
                return False
            continue
        if not home.made(b, 1) or any(theirs != b for mine, theirs in home.joins if mine == a):
            return False
        joins.append((home, (a, b)))
    for home, pair in joins:
        if pair not in home.joins:
            home.joins.append(pair)
    return True


def _branch(region: _Region, mine: Program, theirs: Program, condition: pyast.expr, span: Span,
            renamed: dict[str, str]) -> Step:
    outputs = tuple(a for a, _ in region.joins)
    yes = Program({}, list(region.mine), outputs, dict(mine.hints))
    no = Program({}, [_renamed(step, renamed) for step in region.theirs], tuple(b for _, b in region.joins),
                 dict(theirs.hints))
    return Step("branch", "", {}, outputs, span, body=yes, orelse=no, condition=condition)


def _renamed(step: Step, renamed: dict[str, str]) -> Step:
    """`step` of their program reading my values where theirs are the same (made by shared steps)."""
    def operand(value: Operand) -> Operand:
        return renamed.get(value, value) if isinstance(value, str) else value

    def program(inner: Optional[Program]) -> Optional[Program]:
        if inner is None:
            return None
        return replace(inner, steps=[_renamed(s, renamed) for s in inner.steps],
                       results=tuple(operand(r) for r in inner.results))

    return replace(step, inputs={port: operand(value) for port, value in step.inputs.items()},
                   carried=tuple((None if before is None else renamed.get(before, before), loop, first, last)
                                 for before, loop, first, last in step.carried),
                   body=program(step.body), orelse=program(step.orelse))


def _common(mine: list[Step], theirs: list[Step], signature: Callable[[Step], Hashable]) -> list[tuple[int, int]]:
    """The pairs of steps of the two lists that may be one, in order: their longest common subsequence by
    signature (a layer's steps are tens)."""
    a, b = [signature(step) for step in mine], [signature(step) for step in theirs]
    longest = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) - 1, -1, -1):
        for j in range(len(b) - 1, -1, -1):
            longest[i][j] = longest[i + 1][j + 1] + 1 if a[i] == b[j] else max(longest[i + 1][j], longest[i][j + 1])
    pairs, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif longest[i + 1][j] >= longest[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs


def merged_statements(mine: list[pyast.stmt], theirs: list[pyast.stmt], condition: pyast.expr, note: str,
                      one_call: Callable[[pyast.Assign, pyast.Assign], Optional[pyast.Assign]]) -> list[pyast.stmt]:
    """Two constructors' statements as one: those both have once, the others in an `if` over `condition`
    (`one_call`: two assignments of one module as one call, where they differ only in an option)."""
    texts = [[text_of(statement) for statement in statements] for statements in (mine, theirs)]
    pairs = _common([Step("op", text, {}, (), _NOWHERE) for text in texts[0]],
                    [Step("op", text, {}, (), _NOWHERE) for text in texts[1]], lambda step: step.target)
    merged: list[pyast.stmt] = []
    i = j = 0
    for a, b in [*pairs, (len(mine), len(theirs))]:
        yes, no = mine[i:a], theirs[j:b]
        one = one_call(yes[0], no[0]) if len(yes) == len(no) == 1 and isinstance(yes[0], pyast.Assign) \
            and isinstance(no[0], pyast.Assign) else None
        if one is not None:
            merged.append(one)
        elif yes or no:
            merged.append(if_statement(copy.deepcopy(condition), yes or [pyast.Pass()], no, note))
        if a < len(mine):
            merged.append(mine[a])
        i, j = a + 1, b + 1
    return merged


_NOWHERE = Span("", 0, 0, 0, 0)


@dataclass(frozen=True)
class KindFlag:
    """What a layer keeps of its kind: `self.<attribute> = <value>` (`self.layer_type =
    config.layer_types[i]`), and the forward's condition over it."""

    attribute: str
    value: pyast.expr
    note: str  # the spec line of the first condition that reads it


def kind_flags(condition: pyast.expr, index: str, flags: dict[str, KindFlag], taken: set[str], note: str
               ) -> Optional[pyast.expr]:
    """`condition` (over the config and the index) as the forward reads it, over what the layer keeps of its
    kind: each list of the config it reads at the index, one attribute (`config.layer_types[i]` ->
    `self.layer_type`), added to `flags` (by list) under a name not `taken`. None where it reads anything
    else of the config or the index (a condition only the constructor can decide)."""
    failed = False

    class Over(pyast.NodeTransformer):
        def visit_Subscript(self, node: pyast.Subscript) -> pyast.AST:
            value, at = node.value, node.slice
            if isinstance(value, pyast.Attribute) and isinstance(value.value, pyast.Name) \
                    and value.value.id == "config" and isinstance(at, pyast.Name) and at.id == index:
                listed = value.attr
                if listed not in flags:
                    name = listed[:-1] if listed.endswith("s") and not listed.endswith("ss") else listed
                    while name in taken:
                        name = f"{name}_kind"
                    taken.add(name)
                    flags[listed] = KindFlag(name, copy.deepcopy(node), note)
                return pyast.Attribute(pyast.Name("self", pyast.Load()), flags[listed].attribute, pyast.Load())
            return self.generic_visit(node)

        def visit_Name(self, node: pyast.Name) -> pyast.AST:
            nonlocal failed
            failed = failed or node.id in ("config", index)
            return node

    rewritten = Over().visit(copy.deepcopy(condition))
    return None if failed else rewritten


def flag_statements(flags: list[KindFlag]) -> list[pyast.stmt]:
    return [assign(f"self.{flag.attribute}", flag.value, flag.note) for flag in flags]
