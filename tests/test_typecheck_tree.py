"""`.typecheck/xspec` is the package as it installs, made of links, for mypy: the folders map to module
names in pyproject.toml (compiler/ is xspec.compiler, runtime/ is xspec.runtime), which mypy cannot follow,
so it checks this tree instead. It must mirror the package exactly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / ".typecheck" / "xspec"


def expected_links() -> dict[str, Path]:
    entries = {p.name: p for p in (ROOT / "xspec").iterdir() if p.name != "__pycache__"}
    return {**entries, "compiler": ROOT / "compiler", "runtime": ROOT / "runtime"}


def test_the_tree_links_every_entry_of_the_package_and_the_two_mapped_folders():
    links = {p.name: p for p in TREE.iterdir()}
    assert sorted(links) == sorted(expected_links()), "relink .typecheck/xspec (see this test's docstring)"
    for name, target in expected_links().items():
        assert links[name].is_symlink() and not os.path.isabs(os.readlink(links[name])), name
        assert links[name].resolve() == target.resolve(), name


def test_mypy_checks_the_tree():
    try:
        import tomllib
    except ModuleNotFoundError:         # Python 3.10
        tomllib = pytest.importorskip("tomli")
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert settings["files"] == [".typecheck/xspec"]
