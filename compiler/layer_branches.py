"""One class for the layers of a hybrid stack, whose kinds compute differently (attention in some layers, a
Mamba-2 or gated delta-net mixer in others), as transformers writes Bamba's, Nemotron-H's and Qwen3-Next's
decoder layers: the constructor keeps the layer's kind (`self.layer_type = config.layer_types[i]`) and makes
the modules of that kind; the forward runs the steps all kinds share once and branches on the kind where
they differ (`if self.layer_type == 'full_attention':`).

The kinds' forwards are merged as programs (compiler/ir.py), not as text: steps that compute the same code
on the same values are one step (its comment naming each spec line it stands for); the steps between are the
arms of a `branch` step, which yields under one name what the steps after it read. The constructor is made
from every layer's modules (compiler/layer_choice.py), each in the spec's `if` that makes it.
"""

from __future__ import annotations

import ast as pyast
import copy
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Hashable, Optional

from .diagnostics import Span
from .ir import Const, Instance, Node, Operand, Program, Step
from .python_code import assign, text_of

if TYPE_CHECKING:
    from .graph import BuiltGraph


@dataclass
class _Region:
    """The steps of each program between two steps they share: an arm each."""

    mine: list[Step] = field(default_factory=list)
    theirs: list[Step] = field(default_factory=list)
    joins: list[tuple[str, str]] = field(default_factory=list)  # (my value, theirs) read after the region

    def made(self, ref: str, side: int) -> bool:
        return any(ref in step.outputs for step in (self.mine if side == 0 else self.theirs))


@dataclass
class _Diff:
    """Two programs aligned: the steps they share, and between them (and after the last) the regions where
    they differ."""

    shared: list[Step]  # regions[k] comes before shared[k]; the last region before the results
    regions: list[_Region]
    renamed: dict[str, str]  # their value -> mine, where shared steps or parameters make both


def _aligned(mine: Program, theirs: Program, signature: Callable[[Step], Hashable]) -> Optional[_Diff]:
    if list(mine.params) != list(theirs.params) or len(mine.results) != len(theirs.results):
        return None
    diff = _Diff([], [_Region()], {theirs.params[name]: ref for name, ref in mine.params.items()})
    i = j = 0
    for a, b in _common(mine.steps, theirs.steps, signature):
        region = diff.regions[-1]
        region.mine += mine.steps[i:a]
        region.theirs += theirs.steps[j:b]
        step, other = mine.steps[a], theirs.steps[b]
        if list(step.inputs) == list(other.inputs) and \
                _read(list(zip(step.inputs.values(), other.inputs.values())), diff.regions, diff.renamed):
            diff.renamed.update(zip(other.outputs, step.outputs))
            also = tuple(span for span in (other.span, *other.also) if span not in (step.span, *step.also))
            diff.shared.append(replace(step, also=(*step.also, *also)) if also else step)
            diff.regions.append(_Region())
        else:  # other values: not the same step
            region.mine.append(step)
            region.theirs.append(other)
        i, j = a + 1, b + 1
    diff.regions[-1].mine += mine.steps[i:]
    diff.regions[-1].theirs += theirs.steps[j:]
    return diff if _read(list(zip(mine.results, theirs.results)), diff.regions, diff.renamed) else None


def differing_steps(mine: Program, theirs: Program, signature: Callable[[Step], Hashable]) -> Optional[list[Step]]:
    """The steps of either program the other does not share (what makes two kinds of layer compute
    differently); None where they do not align."""
    diff = _aligned(mine, theirs, signature)
    return None if diff is None else [step for region in diff.regions for step in (*region.mine, *region.theirs)]


def merged_program(mine: Program, theirs: Program, condition: pyast.expr, span: Span,
                   signature: Callable[[Step], Hashable]) -> Optional[Program]:
    """One program that computes `mine` where `condition` holds and `theirs` where it does not: the steps
    both share once, those between in a branch step. `signature` says which steps may be the same (the same
    code); they are where they also read the same values. None where an arm reads a value another arm made,
    or the programs take other parameters."""
    diff = _aligned(mine, theirs, signature)
    if diff is None:
        return None
    known = set(mine.params.values()) | {ref for step in diff.shared for ref in step.outputs}
    steps: list[Step] = []
    for k, region in enumerate(diff.regions):
        if region.mine or region.theirs:
            branch = _branch(region, mine, theirs, condition, span, diff.renamed)
            if not all(_reads_within(arm, known) for arm in branch.programs()):
                return None
            steps.append(branch)
            known |= set(branch.outputs)
        if k < len(diff.shared):
            steps.append(diff.shared[k])
    return Program(dict(mine.params), steps, mine.results, {**theirs.hints, **mine.hints})


def _reads_within(arm: Program, known: set[str]) -> bool:
    """Whether an arm reads only values made before its branch or by its own steps (not another arm's)."""
    made = set(known)
    for step in arm.steps:
        if not step.reads() <= made | {ref for inner in step.programs() for s in inner.steps
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
    """The branch step of a region: my steps where `condition` holds, theirs (reading my values) where not."""
    outputs = tuple(a for a, _ in region.joins)
    yes = Program({}, list(region.mine), outputs, dict(mine.hints))
    no = Program({}, [step.reading(renamed) for step in region.theirs], tuple(b for _, b in region.joins),
                 dict(theirs.hints))
    return Step("branch", "", {}, outputs, span, body=yes, orelse=no, condition=condition)


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


@dataclass(frozen=True)
class KindFlag:
    """What a layer keeps of its kind: `self.<attribute> = <value>` (`self.layer_type =
    config.layer_types[i]`), and the forward's condition over it."""

    attribute: str
    value: pyast.expr
    note: str  # the spec line of the first condition that reads it


def kind_flags(condition: pyast.expr, index: str, flags: dict[str, KindFlag], taken: set[str], note: str,
               name: str) -> pyast.expr:
    """`condition` (over the config and the index) as the forward reads it, over what the layer keeps of its
    kind, which it adds to `flags` under names not `taken`: each list of the config the condition reads at
    the index, one attribute (`config.layer_types[i]` -> `self.layer_type`); a condition that reads more, its
    truth (`self.<name>`)."""
    def kept(key: str, base: str, value: pyast.expr, into: dict[str, KindFlag]) -> pyast.expr:
        if key not in flags and key not in into:
            attribute = base
            while attribute in taken or attribute in {flag.attribute for flag in into.values()}:
                attribute = f"{attribute}_kind"
            into[key] = KindFlag(attribute, copy.deepcopy(value), note)
        return pyast.Attribute(pyast.Name("self", pyast.Load()), (flags.get(key) or into[key]).attribute,
                               pyast.Load())

    listed: dict[str, KindFlag] = {}  # the lists the condition reads at the index, kept where it reads no more

    class Over(pyast.NodeTransformer):
        others = False  # the condition reads the config or the index otherwise

        def visit_Subscript(self, node: pyast.Subscript) -> pyast.AST:
            value, at = node.value, node.slice
            if isinstance(value, pyast.Attribute) and isinstance(value.value, pyast.Name) \
                    and value.value.id == "config" and isinstance(at, pyast.Name) and at.id == index:
                name = value.attr
                return kept(name, name[:-1] if name.endswith("s") and not name.endswith("ss") else name, node, listed)
            return self.generic_visit(node)

        def visit_Name(self, node: pyast.Name) -> pyast.AST:
            self.others = self.others or node.id in ("config", index)
            return node

    over = Over()
    rewritten = over.visit(copy.deepcopy(condition))
    truth: dict[str, KindFlag] = {}
    if over.others:
        rewritten = kept(text_of(condition), name, condition, truth)
    for key, flag in (truth if over.others else listed).items():
        flags[key] = flag
        taken.add(flag.attribute)
    return rewritten


def apart(layer: Instance, graph: BuiltGraph, prefix: str) -> tuple[Instance, dict[str, Node], dict[str, str]]:
    """A layer of another build of the model (one with untaken branches taken), its values and nodes renamed
    apart from this build's (`prefix` before each), to be written into the same forward: the layer, its nodes
    and its values' nodes (BuiltGraph.tensors), by their new names."""
    def own(ref: str) -> bool:
        return ref.startswith((f"{layer.path}.", f"{layer.path}:"))

    def renamed(ref: str) -> str:
        return prefix + ref if own(ref) else ref

    def operand(value: Operand) -> Operand:
        return renamed(value) if isinstance(value, str) else value

    def program(inner: Program) -> Program:
        return Program({name: renamed(ref) for name, ref in inner.params.items()},
                       [step_of(step) for step in inner.steps], tuple(operand(r) for r in inner.results),
                       {renamed(ref): hint for ref, hint in inner.hints.items()})

    def step_of(step: Step) -> Step:
        carried = tuple((None if before is None else renamed(before), None if loop is None else renamed(loop),
                         renamed(first), renamed(last)) for before, loop, first, last in step.carried)
        return replace(step, target=renamed(step.target) if step.kind == "op" else step.target,
                       inputs={port: operand(value) for port, value in step.inputs.items()},
                       outputs=tuple(renamed(ref) for ref in step.outputs), carried=carried,
                       body=program(step.body) if step.body is not None else None,
                       orelse=program(step.orelse) if step.orelse is not None else None)

    nodes = {renamed(node.id): replace(node, id=renamed(node.id),
                                       inputs={port: renamed(source) for port, source in node.inputs.items()})
             for node in graph.graph if own(node.id)}
    tensors = {renamed(ref): renamed(node_id) for ref, node_id in graph.tensors.items() if own(ref)}
    return replace(layer, program=program(layer.program)), nodes, tensors


def flag_statements(flags: list[KindFlag]) -> list[pyast.stmt]:
    return [assign(f"self.{flag.attribute}", flag.value, flag.note) for flag in flags]
