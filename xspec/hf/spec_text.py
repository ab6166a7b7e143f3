"""The imported spec as text: the family's shipped spec extended with the checkpoint's values, each
`set` line commented with the config key it came from, and the shipped specs it imports copied beside it
(so the run directory is self-contained and can be moved)."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from xspec.base.errors import UserError
from xspec.base.text import printable
from xspec.compiler.diagnostics import Diagnostics
from xspec.compiler.parse import parse_text
from xspec.hf.config_reader import Setting


def _shipped_specs() -> Path:
    """The shipped specs: installed with the package (xspec/specs/), or a checkout's specs/ folder."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "specs"
    return installed if installed.is_dir() else package.parent / "specs"


SPECS = _shipped_specs()
FAMILY_DIR = "modern"
BLOCK_SIZE = 512            # tokens a fine-tuning block predicts, unless the model takes fewer


def family_spec(name: str) -> Path:
    path = SPECS / FAMILY_DIR / f"{name}.xspec"
    if not path.is_file():
        raise UserError(f"{path}: the shipped spec of family {name} is missing (the installed package, or "
                        "the checkout, lacks its specs/ folder)")
    return path


@dataclass
class CopiedFamily:
    spec: str                  # the path model.xspec imports
    models: set[str]           # the models those files define: names the imported model may not take


def copy_family(name: str, out: Path) -> CopiedFamily:
    """Copies the family's spec and every spec it imports into out/specs/, keeping their relative paths."""
    pending, seen, models = [family_spec(name)], set(), set()
    while pending:
        path = pending.pop().resolve()
        if path in seen:
            continue
        seen.add(path)
        target = out / "specs" / path.relative_to(SPECS)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        parsed = parse_text(path.read_text(encoding="utf-8"), str(path), Diagnostics())
        assert parsed is not None, f"{path}: a shipped spec that does not parse"
        models.add(parsed.model.name.id)
        pending += [path.parent / found.path for found in parsed.imports]
    return CopiedFamily(f"specs/{FAMILY_DIR}/{name}.xspec", models)


def literal(value: Any) -> str:
    """A config value as spec text: config.json is read strictly (xspec/base/strict_json.py), so a number is
    finite, and the strings mapped are names the family's reader accepted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if ("e" in repr(value) or "." in repr(value)) else f"{value}.0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(literal(item) for item in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


SET_WIDTH = 80               # a longer `set` line (a per-layer list) is packed over several


def _packed(head: str, items: list[str], tail: str) -> list[str]:
    lines: list[str] = []
    line = head
    for item in items:
        if line.strip() != head.strip() and len(line) + len(item) + 2 > 100:
            lines.append(line.rstrip())
            line = " " * len(head)
        line += item + ", "
    return [*lines, line.removesuffix(", ") + tail]


KEYWORDS = {"and", "as", "block", "else", "extends", "false", "if", "import", "in", "model", "not", "or", "param",
            "remove", "repeat", "return", "set", "tie", "true"}


def model_name(source: Path, taken: set[str]) -> str:
    """The checkpoint directory's name as a spec identifier (Qwen3-0.6B: Qwen3_0_6B), other than a keyword
    and the `taken` names of the models it extends (a directory called llama imports as llama_import)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", source.resolve().name).strip("_")[:64] or "imported"
    name = name if name[0].isalpha() else f"m_{name}"
    return f"{name}_import" if name in KEYWORDS or name in taken else name


def spec_text(name: str, family: str, imported: str, settings: list[Setting], source: str, model_type: str,
              max_positions: int, decode: Sequence[Setting] = (), encoder_decoder: bool = False,
              encoder_only: bool = False) -> str:
    """`decode`: the decode section's keys, from generation_config.json, each commented with its key.
    `encoder_decoder`: a translation model, which fine-tunes on sentence pairs rather than blocks of text;
    `encoder_only`: a masked LM, which fine-tunes on lines of text and decodes nothing."""
    # A path may hold any character, a line break included: shown escaped, it stays inside its comment.
    origin = f"{printable(source)} (config.json model_type \"{model_type}\")"
    lines = [f"# Imported by `xspec import` from {origin}: the shipped",
             f"# {family} spec with this checkpoint's values, each commented with the config.json key it came from.",
             "# Chat templates are not imported.",
             f'import "{imported}"', "", f"model {name} extends {family} {{"]
    texts = [f"set {s.param} = {literal(s.value)}" for s in settings]
    packed = [isinstance(s.value, list) and len(text) > SET_WIDTH for s, text in zip(settings, texts)]
    width = max((len(text) for text, long in zip(texts, packed) if not long), default=0)
    for s, text, long in zip(settings, texts, packed):
        if long:  # a list: its items packed on lines under the opening bracket
            lines += _packed(f"  set {s.param} = [", [literal(v) for v in s.value], f"]  # {s.source}")
        else:
            lines.append(f"  {text.ljust(width)}  # {s.source}")
    lines += ["", "  data {", f"    max_tokens = {max_positions}   # max_position_embeddings"]
    if not encoder_decoder and not encoder_only:
        lines.append(f"    block_size = {min(BLOCK_SIZE, max_positions)}   # tokens a fine-tuning block predicts")
    lines.append("  }")
    if decode and not encoder_only:      # null (top_k 0): no filter, the section's default
        entries = [(f"{s.param} = {literal(s.value)}", s.source) for s in decode if s.value is not None]
        width = max(len(entry) for entry, _ in entries)
        lines += ["  decode {", *(f"    {entry.ljust(width)}  # {printable(source)}" for entry, source in entries),
                  "  }"]
    return "\n".join([*lines, "}", ""])
