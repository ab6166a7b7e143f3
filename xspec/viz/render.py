"""Writing a diagram: DOT text as is, other formats through graphviz's `dot` program."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import graphviz

from xspec.base.errors import UserError
from xspec.base.files import write_atomically, write_bytes_atomically

RENDERED = ("svg", "png", "pdf")
FORMATS = ("dot", "gv") + RENDERED
INSTALL_HINT = ("graphviz's `dot` program is not installed; install the OS package `graphviz` "
                "(apt-get install graphviz, brew install graphviz, conda install graphviz) "
                "or write .dot")


def output_format(path: Path) -> str:
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise UserError(f"{path}: unknown output format {path.suffix or '(none)'}; "
                        f"use one of {', '.join('.' + f for f in FORMATS)}")
    return fmt


def write_diagram(dot: graphviz.Digraph, path: Path) -> Path:
    """`.dot`/`.gv` need nothing else; `.svg`, `.png` and `.pdf` need graphviz's `dot` program."""
    fmt = output_format(path)
    if fmt in ("dot", "gv"):
        return write_atomically(path, dot.source)
    if shutil.which("dot") is None:
        raise UserError(INSTALL_HINT)
    try:
        data = dot.pipe(format=fmt)
    except graphviz.ExecutableNotFound:
        raise UserError(INSTALL_HINT) from None
    except (graphviz.CalledProcessError, subprocess.CalledProcessError) as error:
        detail = error.stderr.decode(errors="replace").strip().splitlines() if error.stderr else []
        raise UserError(f"{path}: graphviz failed ({detail[-1] if detail else error})") from None
    return write_bytes_atomically(path, data)
