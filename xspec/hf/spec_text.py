"""The imported spec as text: the family's shipped spec extended with the checkpoint's values, each
`set` line commented with the config key it came from, and the shipped specs it imports copied beside it
(so the run directory is self-contained and can be moved)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from xspec.base.errors import UserError
from xspec.hf.config_reader import Setting


def _shipped_specs() -> Path:
    """The shipped specs: installed with the package (xspec/specs/), or a checkout's specs/ folder."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "specs"
    return installed if installed.is_dir() else package.parent / "specs"


SPECS = _shipped_specs()
FAMILY_DIR = "modern"
_IMPORT = re.compile(r'^import\s+"([^"]+)"', re.MULTILINE)
BLOCK_SIZE = 512            # tokens a fine-tuning block predicts, unless the model takes fewer


def family_spec(name: str) -> Path:
    path = SPECS / FAMILY_DIR / f"{name}.xspec"
    if not path.is_file():
        raise UserError(f"{path}: the shipped spec of family {name} is missing (the installed package, or "
                        "the checkout, lacks its specs/ folder)")
    return path


def copy_family(name: str, out: Path) -> str:
    """Copies the family's spec and every spec it imports into out/specs/, keeping their relative paths;
    returns the path model.xspec imports."""
    pending, seen = [family_spec(name)], set()
    while pending:
        path = pending.pop().resolve()
        if path in seen:
            continue
        seen.add(path)
        target = out / "specs" / path.relative_to(SPECS)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        pending += [path.parent / found for found in _IMPORT.findall(path.read_text(encoding="utf-8"))]
    return f"specs/{FAMILY_DIR}/{name}.xspec"


def literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if ("e" in repr(value) or "." in repr(value)) else f"{value}.0"
    if isinstance(value, int):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


KEYWORDS = {"and", "as", "block", "else", "extends", "false", "if", "import", "in", "model", "not", "or", "param",
            "remove", "repeat", "return", "set", "tie", "true"}


def model_name(source: Path) -> str:
    """The checkpoint directory's name as a spec identifier (Qwen3-0.6B: Qwen3_0_6B)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", source.resolve().name).strip("_")[:64] or "imported"
    name = name if name[0].isalpha() else f"m_{name}"
    return f"{name}_import" if name in KEYWORDS else name


def spec_text(name: str, family: str, imported: str, settings: list[Setting], source: str, model_type: str,
              max_positions: int) -> str:
    lines = [f"# Imported by `xspec import` from {source} (config.json model_type \"{model_type}\"): the shipped",
             f"# {family} spec with this checkpoint's values, each commented with the config.json key it came from.",
             "# Chat templates are not imported.",
             f'import "{imported}"', "", f"model {name} extends {family} {{"]
    width = max(len(f"set {s.param} = {literal(s.value)}") for s in settings)
    for s in settings:
        text = f"set {s.param} = {literal(s.value)}"
        lines.append(f"  {text.ljust(width)}  # {s.source}")
    block = min(BLOCK_SIZE, max_positions)
    lines += ["", "  data {", f"    max_tokens = {max_positions}   # max_position_embeddings",
              f"    block_size = {block}   # tokens a fine-tuning block predicts", "  }", "}", ""]
    return "\n".join(lines)
