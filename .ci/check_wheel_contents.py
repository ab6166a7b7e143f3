"""Check that a wheel holds exactly the files of the folders pyproject.toml maps to packages: every
module and every data file the code reads (a grammar left out of package-data fails here, not on a
user's machine), and nothing else (no stale build leftovers).

    python .ci/check_wheel_contents.py REPO_ROOT WHEEL

The source side is what git tracks or would track (untracked files that are not ignored).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def expected_files(root: Path) -> set[str]:
    """The wheel paths of the project's files: folder/x.py -> package/as/path/x.py."""
    with open(root / "pyproject.toml", "rb") as file:
        folders = tomllib.load(file)["tool"]["setuptools"]["package-dir"]
    expected = set()
    for package, folder in folders.items():
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "--cached", "--others", "--exclude-standard",
                                 "-z", "--", folder], capture_output=True, text=True, check=True).stdout
        for name in filter(None, listed.split("\0")):
            if (root / name).is_file():  # a file deleted but not yet committed is still listed
                expected.add(package.replace(".", "/") + "/" + str(Path(name).relative_to(folder)))
    return expected


def wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name for name in archive.namelist() if ".dist-info/" not in name and not name.endswith("/")}


def main() -> int:
    root, wheel = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    expected, found = expected_files(root), wheel_files(wheel)
    missing, extra = sorted(expected - found), sorted(found - expected)
    for name in missing:
        fix = ("setup.py finds packages by their __init__.py" if name.endswith(".py")
               else "add it to [tool.setuptools.package-data] in pyproject.toml")
        print(f"{wheel.name}: missing {name} ({fix})")
    for name in extra:
        print(f"{wheel.name}: {name} is not a file of the source tree")
    if missing or extra:
        return 1
    print(f"{wheel.name}: {len(found)} files, exactly the source tree's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
