"""The prelude's classes cut to what a spec uses.

A statement of a prelude class whose first line ends in `# with: FEATURE, ...` serves those features
only (an option of attention, a kind of rotary scaling, a sliding-window cache). Lowering copies a
class without the tagged statements none of whose features the model uses (and without the tags);
the generated-code checker (compiler/codecheck.py) accepts a copy whose AST is the prelude's with
tagged statements left out, and nothing else changed.

Read as text: compiling a spec does not import torch.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

# The files whose classes generated code may copy, in the order a module defines them.
PRELUDES = tuple(Path(__file__).with_name(name) for name in ("prelude.py", "prelude_attention.py",
                                                              "prelude_experts.py"))
TAG = re.compile(r"\s+# with: ([a-z0-9_]+(?:, [a-z0-9_]+)*)$")


@dataclass(frozen=True)
class PreludeClass:
    name: str
    node: ast.ClassDef  # its AST, line numbers those of `lines`
    lines: tuple[str, ...]  # its source, the first line `class ...:`
    tagged: tuple[tuple[int, int, frozenset[str]], ...]  # (first line, last line, features), from 0
    removable: frozenset[int]  # the AST line numbers of its tagged statements

    def source(self, features: frozenset[str]) -> str:
        """The class without the tagged statements none of `features` asks for, tags removed."""
        dropped = {line for first, last, wanted in self.tagged if not wanted & features
                   for line in range(first, last + 1)}
        kept: list[str] = []
        for index, line in enumerate(self.lines):
            if index in dropped or (not line.strip() and kept and not kept[-1].strip()):
                continue  # a blank line stays single where a method between two was dropped
            kept.append(TAG.sub("", line))
        return "\n".join(kept).rstrip() + "\n"


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
    for statement in ast.walk(node):
        if not isinstance(statement, ast.stmt) or statement is node:
            continue
        match = TAG.search(file_lines[statement.lineno - 1])
        if match is None:
            continue
        first = min([statement.lineno, *(d.lineno for d in getattr(statement, "decorator_list", ()))]) - 1
        while first - 1 > start and file_lines[first - 1].strip().startswith("#"):
            first -= 1  # the comment above the statement goes with it
        assert statement.end_lineno is not None
        tagged.append((first - start, statement.end_lineno - 1 - start,
                       frozenset(match.group(1).split(", "))))
        removable.add(statement.lineno)
    return PreludeClass(node.name, node, lines, tuple(tagged), frozenset(removable))


def is_pruned_copy(prelude: PreludeClass, copy: ast.ClassDef) -> bool:
    """Whether `copy` is the prelude class with some of its tagged statements left out."""
    return _same(prelude.node, copy, prelude.removable)


def _same(original: ast.AST, copy: ast.AST, removable: frozenset[int]) -> bool:
    if type(original) is not type(copy):
        return False
    for field, value in ast.iter_fields(original):
        other = getattr(copy, field, None)
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            if not isinstance(other, list) or not _same_statements(value, other, removable):
                return False
        elif isinstance(value, list):
            if not isinstance(other, list) or len(value) != len(other) or any(
                    not _same(a, b, removable) for a, b in zip(value, other)):
                return False
        elif isinstance(value, ast.AST):
            if not isinstance(other, ast.AST) or ast.dump(value) != ast.dump(other):
                return False
        elif value != other:
            return False
    return True


def _same_statements(original: list[ast.stmt], copy: list[ast.stmt], removable: frozenset[int]) -> bool:
    """`copy` is `original` less some removable statements (each kept one the same, recursively)."""
    index = 0
    for statement in original:
        if index < len(copy) and _same(statement, copy[index], removable):
            index += 1
        elif statement.lineno not in removable:
            return False
    return index == len(copy)
