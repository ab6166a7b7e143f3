"""Every option of a generated file is one its spec uses: no constructor parameter only ever given its
default, no attribute set and never read, no docstring naming something the file lacks. Read from the
file's syntax tree, for every shipped spec at its default sizes and, for the families with a real depth
that changes the code (layer kinds chosen by index), at that depth."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import xspec
from xspec.compiler.library import library_classes

SPECS = sorted(str(path) for path in Path("specs").rglob("*.xspec"))
# Real depths: Gemma 3 27B, Qwen3-30B-A3B, gpt-oss-20b, Mixtral 8x7B.
DEPTHS = [("specs/modern/gemma3.xspec", 62), ("specs/modern/qwen3_moe.xspec", 48),
          ("specs/modern/gpt_oss.xspec", 24), ("specs/modern/mixtral.xspec", 32)]
# Library modules composed of optional parts, as torchtitan's are, rather than of classes combined by
# inheritance: each states every option, and a spec sets those it uses (the router: its scoring, selection
# and weighting; the attention: its norms, positions, window, gate, sinks and how its weights are computed;
# latent attention: an embedding of its own where the stack passes it no rotary angles; a mask: its causality
# and window).
COMPOSED = {"Router", "Attention", "WrittenOutAttention", "LatentAttention", "AttentionMask"}
BACKTICKED = re.compile(r"`([A-Za-z_][A-Za-z_0-9]*)`")


def _source(spec: str, layers: int | None = None) -> str:
    overrides = {"layers": layers} if layers is not None else None
    # Standalone: the library classes the file uses are read with it, their options by its calls.
    return xspec.compile(spec, overrides=overrides).standalone_source


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _extends(classes: dict[str, ast.ClassDef], name: str) -> set[str]:
    """`name` and the file's classes that extend it, directly or not."""
    family, grown = {name}, True
    while grown:
        grown = False
        for node in classes.values():
            if node.name not in family and any(isinstance(b, ast.Name) and b.id in family for b in node.bases):
                family.add(node.name)
                grown = True
    return family


def _defaults(init: ast.FunctionDef) -> dict[str, tuple[int | None, ast.expr]]:
    """The constructor's parameters that have defaults: their position (None: keyword-only) and default."""
    positional = [a.arg for a in init.args.args[1:]]
    found: dict[str, tuple[int | None, ast.expr]] = {
        name: (positional.index(name), default)
        for name, default in zip(positional[len(positional) - len(init.args.defaults):], init.args.defaults)}
    for arg, default in zip(init.args.kwonlyargs, init.args.kw_defaults):
        if default is not None:
            found[arg.arg] = (None, default)
    return found


def unused_parameters(source: str) -> list[str]:
    tree = ast.parse(source)
    classes = _classes(tree)
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]
    model = next(node.value.id for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Name) and node.targets[0].id == "Model")  # type: ignore[attr-defined]
    found = []
    for cls in classes.values():
        init = next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
        if init is None or cls.name == model or cls.name in COMPOSED:  # the model's own `config=None` builds
            continue                                                      # the spec's defaults
        family = _extends(classes, cls.name)
        for name, (position, default) in _defaults(init).items():
            given = []
            for call in (c for c in calls if c.func.id in family):  # type: ignore[attr-defined]
                given += [k.value for k in call.keywords if k.arg == name]
                if position is not None and len(call.args) > position:
                    given.append(call.args[position])
            if all(ast.dump(value) == ast.dump(default) for value in given):
                found.append(f"{cls.name}({name}=...)")
    return found


def unread_attributes(source: str) -> list[str]:
    """Attributes set on `self` and read nowhere in the file (modules and parameters are state: a module's
    parameters are read by its forward through the module; an nn.Parameter is read as an attribute)."""
    stored, loaded = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            (stored if isinstance(node.ctx, ast.Store) else loaded).add(node.attr)
    return sorted(stored - loaded)


def names_docstrings_lack(source: str) -> list[str]:
    """Names in backticks in a docstring that the file's code lacks, and library classes a docstring names
    that the file does not define."""
    tree = ast.parse(source)
    names: set[str] = set()
    docstrings = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
            docstring = ast.get_docstring(node)
            if docstring:
                docstrings.append((node.name, docstring))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    defined = set(_classes(tree))
    found = []
    for owner, text in docstrings:
        found += [f"{owner}: `{name}`" for name in BACKTICKED.findall(text) if name not in names]
        found += [f"{owner}: {name}" for name in library_classes()
                  if re.search(rf"\b{name}\b", text) and name not in defined]
    return found


CASES = [(spec, None) for spec in SPECS] + DEPTHS


@pytest.mark.parametrize("spec, layers", CASES, ids=lambda value: str(value).removeprefix("specs/"))
def test_every_option_of_a_generated_file_is_used(spec: str, layers: int | None):
    source = _source(spec, layers)
    assert unused_parameters(source) == []
    assert unread_attributes(source) == []
    assert names_docstrings_lack(source) == []


def test_the_checks_find_what_they_look_for():
    """Each check on a file with one offence of its kind."""
    base = _source("specs/base.xspec")
    assert unused_parameters(base.replace("def __init__(self, vocab, dim, scale):",
                                          "def __init__(self, vocab, dim, scale, padding=None):")) \
        == ["ScaledEmbedding(padding=...)"]
    positions = "SinusoidalPositions(config.d_model, config.max_len)"  # its class's __init__ comes first
    assert unused_parameters(base.replace(positions, positions[:-1] + ", ratio=2)").replace(
        "def __init__(self, dim, max_len):", "def __init__(self, dim, max_len, ratio=2):", 1)) \
        == ["SinusoidalPositions(ratio=...)"]
    assert unread_attributes(base.replace("self.scale = scale", "self.scale, self.vocab = scale, vocab")) \
        == ["vocab"]
    assert names_docstrings_lack(base.replace('"""Token embeddings multiplied by `scale`',
                                              '"""Token embeddings multiplied by `factor`')) \
        == ["ScaledEmbedding: `factor`"]
    assert names_docstrings_lack(base.replace("(§3.4: sqrt(d_model))", "(§3.4; see RotaryEmbedding)")) \
        == ["ScaledEmbedding: RotaryEmbedding"]
