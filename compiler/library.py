"""The op library generated code uses (xspec/nn/), as the compiler sees it: every class of its files,
read as text (compiling a spec imports neither torch nor the library). A generated file imports the
classes it uses from `xspec.nn`; a standalone one copies each whole, with the classes it extends, and the
generated-code checker (compiler/codecheck.py) accepts a copy whose AST is the library's.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .code_reads import attributes_read

MODULE = "xspec.nn"  # where generated files import the library from
# Its files, in the order a standalone file defines their classes.
FILES = ("embeddings.py", "norms.py", "gating.py", "pooling.py", "rotary.py", "attention.py",
         "latent_attention.py", "convolution.py", "delta_rule.py", "state_space.py", "experts.py", "contracts.py")


@dataclass(frozen=True)
class LibraryClass:
    name: str
    node: ast.ClassDef
    source: str  # from `class ...:` to its last line

    @property
    def bases(self) -> tuple[str, ...]:
        """The classes it extends by name (another library class, or `nn.Module`: not a bare name)."""
        return tuple(base.id for base in self.node.bases if isinstance(base, ast.Name))

    @property
    def needs(self) -> tuple[str, ...]:
        """The names it extends or its code reads (Attention's mask rule is AttentionMask's)."""
        read = (node.id for statement in self.node.body for node in ast.walk(statement) if isinstance(node, ast.Name))
        return tuple(dict.fromkeys([*self.bases, *read]))


def library_files() -> tuple[Path, ...]:
    """The library's files, found as Python finds the package (without importing it: that imports torch)."""
    spec = importlib.util.find_spec(MODULE)
    assert spec is not None and spec.submodule_search_locations, f"{MODULE} is not installed"
    folder = Path(list(spec.submodule_search_locations)[0])
    return tuple(folder / name for name in FILES)


@functools.cache
def library_classes() -> dict[str, LibraryClass]:
    classes = {}
    for path in library_files():
        text = path.read_text(encoding="utf-8")
        lines = text.split("\n")
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef):
                source = "\n".join(lines[node.lineno - 1:node.end_lineno]) + "\n"
                classes[node.name] = LibraryClass(node.name, node, source)
    return classes


def with_bases(names: set[str]) -> list[str]:
    """`names` and the library classes they extend or read, in the order the library's files define them."""
    classes = library_classes()
    used, pending = set(names), list(names)
    while pending:
        for base in classes[pending.pop()].needs:
            if base in classes and base not in used:
                used.add(base)
                pending.append(base)
    return [name for name in classes if name in used]


def is_copy(library: LibraryClass, copy: ast.ClassDef) -> bool:
    """Whether `copy` is the library class, statement for statement (line numbers aside)."""
    return ast.dump(library.node) == ast.dump(copy)


# The modules of torch.nn that generated code or the library makes and that set tensors in reset_parameters().
TORCH_RESETTABLE = ("Linear", "LayerNorm", "RMSNorm", "Embedding", "Conv1d")


def resetting_classes(used: set[str], torch_made: set[str]) -> tuple[list[str], list[str]]:
    """The classes whose modules set tensors in `reset_parameters()`, of those a model made of the library
    classes `used` (generated code constructs them all: they construct none of each other) and the torch.nn
    classes `torch_made` holds, with those the library classes make: torch.nn's (TORCH_RESETTABLE order) and
    the library's (its order) that define the method or extend a class that does, each unless a listed class
    it extends covers it."""
    classes = library_classes()
    # and those the library's classes (with the classes they extend) make
    torch_names = {*torch_made, *attributes_read(*(classes[name].node for name in with_bases(used)), owner="nn")}

    @functools.cache
    def resets(name: str) -> bool:
        node = classes[name].node
        own = any(isinstance(item, ast.FunctionDef) and item.name == "reset_parameters" for item in node.body)
        torch_base = any(isinstance(b, ast.Attribute) and b.attr in TORCH_RESETTABLE for b in node.bases)
        return own or torch_base or any(resets(base) for base in classes[name].bases if base in classes)

    def ancestors(name: str) -> set[str]:  # its library bases, theirs, and the torch.nn classes they extend
        node, found = classes[name].node, set()
        for base in node.bases:
            if isinstance(base, ast.Attribute):
                found.add(f"nn.{base.attr}")
            elif isinstance(base, ast.Name) and base.id in classes:
                found |= {base.id} | ancestors(base.id)
        return found

    torch_listed = [name for name in TORCH_RESETTABLE if name in torch_names]
    listed = {f"nn.{name}" for name in torch_listed} | {name for name in used if resets(name)}
    # a class an isinstance check of a listed ancestor covers is not listed again
    return torch_listed, [name for name in classes if name in listed and not ancestors(name) & listed]
