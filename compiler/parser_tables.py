"""The parser of compiler/grammar.lark with its LALR tables computed ahead of time.

Building the tables from the grammar takes about 0.1 s, at the start of every `xspec` command that
reads a spec. `grammar.tables.json` keeps them in the form Lark itself serializes a parser to (the
form its standalone generator uses), as JSON: plain data, never executed, never unpickled. The file
is used only if it was made from this very grammar, with these options, by the installed version of
Lark; otherwise the parser is built from the grammar as usual, just more slowly.

After editing the grammar, regenerate the tables (a test fails until then):

    python -m xspec.compiler.parser_tables
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional

import lark
from lark import Lark
from lark.grammar import Rule
from lark.lexer import TerminalDef

GRAMMAR = Path(__file__).with_name("grammar.lark")
TABLES = Path(__file__).with_name("grammar.tables.json")
OPTIONS: dict[str, Any] = {"parser": "lalr", "propagate_positions": True, "maybe_placeholders": True,
                           "start": ["start", "expr"]}


def grammar_parser() -> Lark:
    """The spec language's parser: from the precomputed tables when they fit, else built."""
    grammar = GRAMMAR.read_text(encoding="utf-8")
    return _from_tables(grammar) or Lark(grammar, **OPTIONS)


def fingerprint(grammar: str) -> dict[str, str]:
    """What the tables were made from; all of it must match for them to be used."""
    made_from = json.dumps({"grammar": grammar, "options": OPTIONS}, sort_keys=True)
    return {"source_sha256": hashlib.sha256(made_from.encode("utf-8")).hexdigest(), "lark": lark.__version__}


def _from_tables(grammar: str) -> Optional[Lark]:
    try:
        stored = json.loads(TABLES.read_text(encoding="utf-8"), object_hook=_decode)
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("made_from") != fingerprint(grammar):
        return None
    try:
        return Lark._load_from_dict(stored["data"], stored["memo"])
    except Exception:  # tables Lark cannot read are as good as none: build from the grammar
        return None


def write_tables() -> Path:
    grammar = GRAMMAR.read_text(encoding="utf-8")
    data, memo = Lark(grammar, **OPTIONS).memo_serialize([TerminalDef, Rule])
    stored = {"made_from": fingerprint(grammar), "data": data, "memo": memo}
    TABLES.write_text(json.dumps(_encode(stored), sort_keys=True, separators=(",", ":")) + "\n", encoding="utf-8")
    return TABLES


# JSON has neither tuples nor dictionaries with integer keys, and Lark's tables use both: tag them.

def _encode(value: Any) -> Any:
    if isinstance(value, tuple):
        return {"$tuple": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: _encode(v) for k, v in value.items()}
        return {"$items": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot store {type(value).__name__} in parser tables")


def _decode(obj: dict) -> Any:
    if "$tuple" in obj:
        return tuple(obj["$tuple"])
    if "$items" in obj:
        return {_hashable(k): v for k, v in obj["$items"]}
    return obj


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


if __name__ == "__main__":
    print(f"wrote {write_tables()}")
