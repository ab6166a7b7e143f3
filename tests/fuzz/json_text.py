"""JSON documents to mutate, written back as text that a JSON library would never write: numbers it cannot
hold (`1e999`, `NaN`, a 5,000-digit integer), the same key twice in one object, anything spelled raw.

A document is what json.loads gives (dicts, lists, strings, numbers, booleans, None), where any value may
also be a `Raw` (text written as it is) and any object a `Pairs` (a list of key-value pairs, keys free to
repeat). Paths name a place in a document: a tuple of keys and list indices.
"""

from __future__ import annotations

import copy
import json
from typing import Any

Path = tuple  # of str (object keys) and int (list indices)


class Raw(str):
    """JSON text written as it is."""


class Pairs(list):
    """A JSON object as (key, value) pairs, in order; a key may come twice."""


def dump(value: Any) -> str:
    """`value` as JSON text: ASCII (other characters as escapes, lone surrogates included), Raw as written."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Pairs):
        return "{" + ", ".join(f"{json.dumps(key)}: {dump(item)}" for key, item in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(key)}: {dump(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dump(item) for item in value) + "]"
    return json.dumps(value)


def shown(value: Any, limit: int = 70) -> str:
    """A value as a failure's description quotes it: its JSON text, clipped."""
    text = dump(value)
    return text if len(text) <= limit else f"{text[:limit - 20]}...({len(text):,} characters)"


def paths(document: Any, below: Path = ()) -> list[Path]:
    """Every place in `document` below its root, parents before children."""
    found: list[Path] = []
    if isinstance(document, (Pairs, Raw)):       # written as they are: nothing below them to change
        return found
    if isinstance(document, dict):
        items = list(document.items())
    elif isinstance(document, list):
        items = list(enumerate(document))
    else:
        return found
    for key, value in items:
        found.append((*below, key))
        found.extend(paths(value, (*below, key)))
    return found


def name_of(path: Path) -> str:
    """`rope_parameters.factor`, `added_tokens[0].id`: a path as a reader writes it."""
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else str(key))
    return json.dumps(text)[1:-1] if not text.isprintable() else text


def at(document: Any, path: Path) -> Any:
    for key in path:
        document = document[key]
    return document


def replaced(document: Any, path: Path, value: Any) -> Any:
    """A copy of `document` with the value at `path` replaced by `value`."""
    changed = copy.deepcopy(document)
    at(changed, path[:-1])[path[-1]] = value
    return changed


def removed(document: Any, path: Path) -> Any:
    """A copy of `document` without the value at `path`."""
    changed = copy.deepcopy(document)
    del at(changed, path[:-1])[path[-1]]
    return changed


def renamed(document: Any, path: Path, new_key: str) -> Any:
    """A copy of `document` with the object key at `path` renamed, in its place."""
    changed = copy.deepcopy(document)
    parent = at(changed, path[:-1])
    items = [(new_key if key == path[-1] else key, value) for key, value in parent.items()]
    parent.clear()
    for key, value in items:
        parent[key] = value
    return changed


def with_pairs(document: Any, path: Path, pairs: list[tuple[str, Any]]) -> Any:
    """A copy of `document` whose object at `path` (the root for `()`) is `pairs` (keys may repeat)."""
    if not path:
        return Pairs(pairs)
    return replaced(document, path, Pairs(pairs))
