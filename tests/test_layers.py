"""The layers point one way: xspec/base and xspec/nn (the op library generated models import, with the
contracts the runtime asks of a model) import nothing of xspec outside themselves; the compiler imports
only those and itself; the runtime only those, the compiler and itself (compile, then run). The
application (the rest of xspec/: the API, the commands, viz, stats, hf, ...) sits on top and may import
them all.

Every import counts: at module level, inside functions, under `if TYPE_CHECKING:`, relative ones
(resolved against the file's package), and `importlib.import_module("...")` with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]

# folder -> (its package, the xspec packages it may import besides the standard library and others')
LAYERS = {
    "xspec/base": ("xspec.base", ("xspec.base",)),
    "xspec/nn": ("xspec.nn", ("xspec.nn",)),
    "compiler": ("xspec.compiler", ("xspec.base", "xspec.nn", "xspec.compiler")),
    "runtime": ("xspec.runtime", ("xspec.base", "xspec.nn", "xspec.compiler", "xspec.runtime")),
}


def module_name(path: Path, folder: str, package: str) -> str:
    """compiler/ops.py -> xspec.compiler.ops; runtime/prepared/__init__.py -> xspec.runtime.prepared."""
    parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in `tree`, the module `module` (a package's own
    name for its __init__.py). `from P import a` yields P.a where P is xspec itself (a is then a
    subpackage, `from xspec import base`), and P otherwise (a may be a name defined in P)."""
    own_package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = own_package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module is None or target == "xspec":   # `from . import x`, `from xspec import x`
                for alias in node.names:
                    yield node.lineno, f"{target}.{alias.name}"
            else:
                yield node.lineno, target
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and _call_name(node.func) in ("import_module", "__import__"):
            yield node.lineno, node.args[0].value


def _call_name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


def violations(folder: str, package: str, allowed: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        module = module_name(path, folder, package)
        for line, name in imported_modules(tree, module, path.name == "__init__.py"):
            if within(name, ("xspec",)) and not within(name, allowed):
                found.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    return found


@pytest.mark.parametrize("folder", list(LAYERS))
def test_layer_imports_only_what_is_below_it(folder):
    package, allowed = LAYERS[folder]
    assert (ROOT / folder).is_dir()
    found = violations(folder, package, allowed)
    assert not found, (f"{folder}/ may import of xspec only {', '.join(allowed)}:\n" + "\n".join(found))


def test_the_check_sees_every_kind_of_import():
    source = '''
import xspec
import xspec.stats.cost as cost
from xspec.hf.tokenizer import CheckpointTokenizer
from xspec import base, stats
from .. import summary
from ..runtime import inference
from .ops import OPS
from . import names


def later():
    import importlib
    from xspec.base.errors import UserError
    importlib.import_module("xspec.viz")

if TYPE_CHECKING:
    from xspec.hf.importer import Imported
'''
    found = [name for _, name in sorted(imported_modules(ast.parse(source), "xspec.compiler.x", is_package=False))]
    assert found == ["xspec", "xspec.stats.cost", "xspec.hf.tokenizer", "xspec.base", "xspec.stats", "xspec.summary",
                     "xspec.runtime", "xspec.compiler.ops", "xspec.compiler.names", "importlib", "xspec.base.errors",
                     "xspec.viz", "xspec.hf.importer"]
    allowed = LAYERS["compiler"][1]
    assert [name for name in found if within(name, ("xspec",)) and not within(name, allowed)] == [
        "xspec", "xspec.stats.cost", "xspec.hf.tokenizer", "xspec.stats", "xspec.summary", "xspec.runtime",
        "xspec.viz", "xspec.hf.importer"]
    # A package's __init__.py: `from . import x` is its own submodule.
    assert [name for _, name in imported_modules(ast.parse("from . import tasks\nfrom .. import base"),
                                                 "xspec.runtime.prepared", is_package=True)] == [
        "xspec.runtime.prepared.tasks", "xspec.runtime.base"]
