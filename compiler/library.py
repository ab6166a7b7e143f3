"""The classes generated code may copy: every class of the prelude files, read as text (compiling a
spec does not import torch). A generated file copies a class whole, with the classes it extends; the
generated-code checker (compiler/codecheck.py) accepts a copy whose AST is the prelude's.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

# The files whose classes generated code may copy, in the order a module defines them.
PRELUDES = tuple(Path(__file__).with_name(name) for name in ("prelude.py", "prelude_rotary.py",
                                                              "prelude_attention.py", "prelude_experts.py"))


@dataclass(frozen=True)
class PreludeClass:
    name: str
    node: ast.ClassDef
    source: str  # from `class ...:` to its last line

    @property
    def bases(self) -> tuple[str, ...]:
        """The classes it extends by name (another prelude class, or `nn.Module`: not a bare name)."""
        return tuple(base.id for base in self.node.bases if isinstance(base, ast.Name))


@functools.cache
def prelude_classes() -> dict[str, PreludeClass]:
    classes = {}
    for path in PRELUDES:
        text = path.read_text(encoding="utf-8")
        lines = text.split("\n")
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef):
                source = "\n".join(lines[node.lineno - 1:node.end_lineno]) + "\n"
                classes[node.name] = PreludeClass(node.name, node, source)
    return classes


def with_bases(names: set[str]) -> list[str]:
    """`names` and the prelude classes they extend, in the order the prelude files define them."""
    classes = prelude_classes()
    used, pending = set(names), list(names)
    while pending:
        for base in classes[pending.pop()].bases:
            if base in classes and base not in used:
                used.add(base)
                pending.append(base)
    return [name for name in classes if name in used]


def is_copy(prelude: PreludeClass, copy: ast.ClassDef) -> bool:
    """Whether `copy` is the prelude class, statement for statement (line numbers aside)."""
    return ast.dump(prelude.node) == ast.dump(copy)
