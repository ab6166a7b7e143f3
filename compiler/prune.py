"""The prelude's classes cut to what a spec uses.

A statement of a prelude class whose first line ends in `# with: FEATURE, ...` serves those features
only (an option of attention, a kind of rotary scaling, a sliding-window cache). So does a line of a
signature or a call that holds only parameters or keyword arguments, each with its comma, and such a
tag (`rotary=None,  # with: rotary`). A statement tagged `# without: FEATURE, ...` is the plain variant
that a model using none of them gets instead; it comes before the general one, which overrides it when
the prelude runs as it is (every feature on, as the tests import it).

Lowering copies a class without the tagged statements and lines it does not keep (and without the tags),
its tagged signatures and calls packed again; the generated-code checker (compiler/codecheck.py)
accepts a copy whose AST is the prelude's with tagged statements and arguments left out, and nothing
else changed.

Read as text: compiling a spec does not import torch.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .wrap import outer_call, packed, split_arguments

# The files whose classes generated code may copy, in the order a module defines them.
PRELUDES = tuple(Path(__file__).with_name(name) for name in ("prelude.py", "prelude_rotary.py",
                                                              "prelude_attention.py", "prelude_experts.py"))
TAG = re.compile(r"\s+# (with|without): ([a-z0-9_]+(?:, [a-z0-9_]+)*)$")


@dataclass(frozen=True)
class Tagged:
    """Lines of a prelude class that serve some features: kept where the model uses one of them
    (`# with:`), or where it uses none of them (`# without:`, the plain variant of a `# with:` one)."""

    first: int  # from 0, in the class's lines
    last: int
    features: frozenset[str]
    without: bool = False

    def kept(self, used: frozenset[str]) -> bool:
        return bool(self.features & used) != self.without


@dataclass(frozen=True)
class PreludeClass:
    name: str
    node: ast.ClassDef  # its AST, line numbers those of `lines`
    lines: tuple[str, ...]  # its source, the first line `class ...:`
    tagged: tuple[Tagged, ...]
    removable: frozenset[int]  # the AST line numbers of its tagged statements
    arguments: frozenset[int]  # the AST line numbers of its tagged lines of arguments
    spans: tuple[tuple[int, int], ...]  # (first line, last line), from 0, of each signature or call holding them

    @property
    def bases(self) -> tuple[str, ...]:
        """The classes it extends by name (another prelude class, or `nn.Module`: not a bare name)."""
        return tuple(base.id for base in self.node.bases if isinstance(base, ast.Name))

    def source(self, features: frozenset[str]) -> str:
        """The class without the tagged statements and arguments none of `features` asks for, tags
        removed."""
        dropped = {line for tag in self.tagged if not tag.kept(features) for line in range(tag.first, tag.last + 1)}
        repacked = dict(self.spans)  # packed whether or not they lost arguments: one layout for every copy
        kept: list[str] = []
        index = 0
        while index < len(self.lines):
            line, last = self.lines[index], repacked.get(index)
            if last is not None and index not in dropped:  # a signature or call with tagged arguments
                kept += _repacked([TAG.sub("", s) for number, s in enumerate(self.lines[index:last + 1], index)
                                   if number not in dropped])
                index = last + 1
                continue
            if index not in dropped and (line.strip() or not kept or kept[-1].strip()):
                kept.append(TAG.sub("", line))  # a blank line stays single where a method between two went
            index += 1
        return "\n".join(kept).rstrip() + "\n"


def _repacked(lines: list[str]) -> list[str]:
    """A signature or call (`def f(a, b):`, `out = f(a, b)`) over `lines`, packed again: its arguments
    under its opening parenthesis, as few lines as fit."""
    text = " ".join(line.strip() for line in lines)
    indent = lines[0][:len(lines[0]) - len(lines[0].lstrip())]
    tail = "):" if text.endswith("):") else ")"
    opening = outer_call(text[:len(text) - len(tail) + 1])
    assert opening is not None, f"not a signature or call: {text!r}"
    items = split_arguments(text[opening + 1:len(text) - len(tail)])
    return packed(indent + text[:opening + 1], items, tail)


@functools.cache
def prelude_classes() -> dict[str, PreludeClass]:
    classes = {}
    for path in PRELUDES:
        text = path.read_text(encoding="utf-8")
        lines = text.split("\n")
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef):
                classes[node.name] = _prelude_class(node, lines)
    return classes


def _prelude_class(node: ast.ClassDef, file_lines: list[str]) -> PreludeClass:
    start = node.lineno - 1
    lines = tuple(file_lines[start:node.end_lineno])
    tagged, removable = [], set()
    statements = [s for s in ast.walk(node) if isinstance(s, ast.stmt) and s is not node]
    for statement in statements:
        match = TAG.search(file_lines[statement.lineno - 1])
        if match is None:
            continue
        first = min([statement.lineno, *(d.lineno for d in getattr(statement, "decorator_list", ()))]) - 1
        while first - 1 > start and file_lines[first - 1].strip().startswith("#"):
            first -= 1  # the comment above the statement goes with it
        assert statement.end_lineno is not None
        tagged.append(Tagged(first - start, statement.end_lineno - 1 - start, frozenset(match.group(2).split(", ")),
                             without=match.group(1) == "without"))
        removable.add(statement.lineno)
    # Tagged lines that begin no statement: arguments of a signature or a call.
    arguments = {number for number in range(node.lineno, (node.end_lineno or 0) + 1)
                 if TAG.search(file_lines[number - 1]) and number not in {s.lineno for s in statements}}
    spans = set()
    for number in sorted(arguments):
        match = TAG.search(file_lines[number - 1])
        assert match and file_lines[number - 1][:match.start()].endswith(",") and match.group(1) == "with", \
            f"{node.name}, line {number}: a line of arguments tagged `# with:` ends with its comma"
        tagged.append(Tagged(number - 1 - start, number - 1 - start, frozenset(match.group(2).split(", "))))
        spans.add(_holder(node, number))
    return PreludeClass(node.name, node, lines, tuple(tagged), frozenset(removable), frozenset(arguments),
                        tuple(sorted((first - 1 - start, last - 1 - start) for first, last in spans)))


def _holder(node: ast.ClassDef, number: int) -> tuple[int, int]:
    """The AST lines of the innermost signature or call that line `number` is an argument line of."""
    holders = []
    for inner in ast.walk(node):
        if isinstance(inner, ast.FunctionDef):
            parts: list[ast.arg | ast.expr] = [*inner.args.args, *inner.args.kwonlyargs, *inner.args.defaults,
                                               *(d for d in inner.args.kw_defaults if d is not None)]
            holders.append((inner.lineno, max([inner.lineno, *(part.end_lineno or part.lineno for part in parts)])))
        elif isinstance(inner, ast.Call) and inner.end_lineno is not None:
            holders.append((inner.lineno, inner.end_lineno))
    inside = [(first, last) for first, last in holders if first < number <= last]
    assert inside, f"{node.name}, line {number}: a tagged line that is neither a statement nor arguments"
    return min(inside, key=lambda span: span[1] - span[0])


def is_pruned_copy(prelude: PreludeClass, copy: ast.ClassDef) -> bool:
    """Whether `copy` is the prelude class with some of its tagged statements and arguments left out."""
    return _same(prelude.node, copy, prelude)


def _same(original: object, copy: object, prelude: PreludeClass) -> bool:
    if not isinstance(original, ast.AST):
        return original == copy
    if type(original) is not type(copy):
        return False
    if isinstance(original, ast.arguments):
        assert isinstance(copy, ast.arguments)
        return _same_parameters(original, copy, prelude)
    for field, value in ast.iter_fields(original):
        other = getattr(copy, field, None)
        if isinstance(value, list):
            if not isinstance(other, list) or not _same_items(value, other, prelude):
                return False
        elif not _same(value, other, prelude):
            return False
    return True


def _same_items(original: list, copy: list, prelude: PreludeClass) -> bool:
    """`copy` is `original` less some removable items (each kept one the same, recursively): tagged
    statements, and arguments (parameters, their defaults, keywords) on tagged lines."""
    index = 0
    for item in original:
        if index < len(copy) and _same(item, copy[index], prelude):
            index += 1
        elif not _removable(item, prelude):
            return False
    return index == len(copy)


def _same_parameters(original: ast.arguments, copy: ast.arguments, prelude: PreludeClass) -> bool:
    """A signature less some parameters on tagged lines, each with its default: compared as (parameter,
    default) pairs, so that a default left out is never matched to another parameter's equal one."""
    def pairs(arguments: ast.arguments) -> list[tuple[ast.arg, Optional[ast.expr]]]:
        missing: list[Optional[ast.expr]] = [None] * (len(arguments.args) - len(arguments.defaults))
        return list(zip(arguments.args, missing + list(arguments.defaults)))

    if (original.posonlyargs or copy.posonlyargs or original.kwonlyargs or copy.kwonlyargs
            or not _same(original.vararg, copy.vararg, prelude) or not _same(original.kwarg, copy.kwarg, prelude)):
        return False
    copied, index = pairs(copy), 0
    for name, default in pairs(original):
        if index < len(copied) and _same(name, copied[index][0], prelude) and _same(default, copied[index][1], prelude):
            index += 1
        elif name.lineno not in prelude.arguments:
            return False
    return index == len(copied)


def _removable(item: object, prelude: PreludeClass) -> bool:
    if isinstance(item, ast.stmt):
        return item.lineno in prelude.removable
    return isinstance(item, (ast.expr, ast.arg, ast.keyword)) and item.lineno in prelude.arguments
