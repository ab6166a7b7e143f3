"""Package discovery only: every piece of metadata, and the folder mapping, is in pyproject.toml.

The top-level folders install under the xspec namespace (compiler/ is xspec.compiler, runtime/ is
xspec.runtime). pyproject.toml's own `find` cannot add that prefix, so a hand-written list would have to
name every subpackage; here each mapped folder is walked instead, and no subpackage can be left out.
"""

from pathlib import Path

from setuptools import find_packages, setup

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

HERE = Path(__file__).resolve().parent


def package_folders() -> dict[str, str]:
    """pyproject.toml's [tool.setuptools.package-dir]: installed package name -> folder here."""
    with open(HERE / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["tool"]["setuptools"]["package-dir"]


def all_packages(folders: dict[str, str]) -> list[str]:
    found = set()
    for package, folder in folders.items():
        found.add(package)
        found.update(f"{package}.{sub}" for sub in find_packages(str(HERE / folder)))
    return sorted(found)


setup(packages=all_packages(package_folders()))
