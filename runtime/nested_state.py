"""Nested state dicts (an optimizer's, a scheduler's) stored in safetensors files: no pickle.

`encode(state)` returns (tensors, structure): every tensor goes into `tensors` under the path of
keys that led to it (`optimizer/state/0/exp_avg`), and `structure` is JSON for the rest, with a
reference where each tensor was. In the JSON,

    null, true/false, numbers, strings   stand for themselves
    [a, b, ...]                          is a list
    {"tuple": [a, b, ...]}               is a tuple
    {"dict": [[key, value], ...]}        is a dict whose keys are strings or integers (an
                                         optimizer's state is keyed by parameter index)
    {"tensor": "name"}                   is the tensor stored under that name

`decode(tensors, structure)` rebuilds the state and refuses, with a `StateFormatError` saying
where, anything `encode` does not write: an unknown form, a missing or unreferenced tensor, a
structure nested deeper than `MAX_DEPTH`. `mismatch` compares a decoded state with the one a fresh
optimizer or scheduler produces, so a state that would only fail later, mid-training, is refused
before it is loaded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

MAX_DEPTH = 32          # an optimizer's state is 4 levels deep
_SCALARS = (bool, int, float, str)


class StateFormatError(ValueError):
    """The stored structure is not one that `encode` writes."""


def encode(state: Any) -> tuple[dict[str, torch.Tensor], str]:
    """(tensors by name, the JSON structure that refers to them). Tensors are copied to the CPU,
    contiguous and unshared, as safetensors requires."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(value: Any, path: tuple[str, ...]) -> Any:
        if isinstance(value, torch.Tensor):
            name = _unused_name("/".join(path) or "tensor", tensors)
            tensors[name] = value.detach().to("cpu", copy=True).contiguous()
            return {"tensor": name}
        if value is None or isinstance(value, _SCALARS):
            return value
        if isinstance(value, list):
            return [walk(v, (*path, str(i))) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {"tuple": [walk(v, (*path, str(i))) for i, v in enumerate(value)]}
        if isinstance(value, dict):
            for key in value:
                if isinstance(key, bool) or not isinstance(key, (str, int)):
                    raise TypeError(f"{_where(path)}: dict key {key!r} is neither a string nor an integer")
            return {"dict": [[key, walk(v, (*path, str(key)))] for key, v in value.items()]}
        raise TypeError(f"{_where(path)}: cannot store a {type(value).__name__}")

    return tensors, json.dumps(walk(state, ()))


def _unused_name(name: str, taken: Mapping[str, Any]) -> str:
    """Keys containing "/" could make two paths alike; the structure names each tensor, so any
    unused name will do."""
    unique, n = name, 1
    while unique in taken:
        unique, n = f"{name}~{n}", n + 1
    return unique


def decode(tensors: Mapping[str, torch.Tensor], structure: str) -> Any:
    """The state `encode` was given, rebuilt from its tensors and structure."""
    try:
        tree = json.loads(structure)
    except RecursionError:
        raise StateFormatError(f"the structure is nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as error:
        raise StateFormatError(f"the structure is not JSON ({error})") from None
    used: set[str] = set()

    def build(node: Any, path: tuple[str, ...]) -> Any:
        if len(path) > MAX_DEPTH:
            raise StateFormatError(f"{_where(path)}: nested more than {MAX_DEPTH} levels deep")
        if node is None or isinstance(node, _SCALARS):
            return node
        if isinstance(node, list):
            return [build(v, (*path, str(i))) for i, v in enumerate(node)]
        if not (isinstance(node, dict) and len(node) == 1):
            raise StateFormatError(f"{_where(path)}: expected a value, a list or one of "
                                   '{"tuple": ...}, {"dict": ...}, {"tensor": ...}')
        ((form, body),) = node.items()
        if form == "tensor":
            return _tensor(body, tensors, used, path)
        if form == "tuple" and isinstance(body, list):
            return tuple(build(v, (*path, str(i))) for i, v in enumerate(body))
        if form == "dict" and isinstance(body, list):
            return _dict(body, path, build)
        raise StateFormatError(f"{_where(path)}: unknown form {form!r} (or its body is not a list)")

    state = build(tree, ())
    unused = sorted(set(tensors) - used)
    if unused:
        raise StateFormatError(f"tensor {unused[0]!r} is stored but not part of the state")
    return state


def _tensor(name: Any, tensors: Mapping[str, torch.Tensor], used: set[str], path: tuple[str, ...]) -> torch.Tensor:
    if not isinstance(name, str) or name not in tensors:
        raise StateFormatError(f"{_where(path)}: refers to a tensor {name!r} that is not stored")
    if name in used:
        raise StateFormatError(f"{_where(path)}: tensor {name!r} is referred to twice")
    used.add(name)
    return tensors[name]


def _dict(pairs: list, path: tuple[str, ...], build) -> dict:
    result: dict = {}
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise StateFormatError(f"{_where(path)}: a dict entry is not a [key, value] pair")
        key, value = pair
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise StateFormatError(f"{_where(path)}: dict key {key!r} is neither a string nor an integer")
        if key in result:
            raise StateFormatError(f"{_where(path)}: dict key {key!r} appears twice")
        result[key] = build(value, (*path, str(key)))
    return result


def mismatch(expected: Any, found: Any, path: tuple[str, ...] = ()) -> str | None:
    """Where `found` differs in form from `expected` (dict keys, list lengths, kinds of values), or None.

    Numbers may differ in value but not in kind, except that an integer may stand for a float.
    """
    if isinstance(expected, dict):
        if not isinstance(found, dict):
            return f"{_where(path)}: expected a dict, found {_kind(found)}"
        if set(expected) != set(found):
            extra, missing = sorted(map(str, set(found) - set(expected))), sorted(map(str, set(expected) - set(found)))
            return f"{_where(path)}: " + (f"unexpected key {extra[0]!r}" if extra else f"no key {missing[0]!r}")
        return next((m for k in expected if (m := mismatch(expected[k], found[k], (*path, str(k))))), None)
    if isinstance(expected, (list, tuple)):
        if not isinstance(found, (list, tuple)) or len(found) != len(expected):
            return f"{_where(path)}: expected {len(expected)} items, found {_kind(found)}"
        return next((m for i, (e, f) in enumerate(zip(expected, found))
                     if (m := mismatch(e, f, (*path, str(i))))), None)
    if _kind(expected) != _kind(found) and not (_kind(expected) == "a float" and _kind(found) == "an integer"):
        return f"{_where(path)}: expected {_kind(expected)}, found {_kind(found)}"
    return None


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "a tensor"
    if isinstance(value, (list, tuple)):
        return f"{len(value)} items"
    names = {type(None): "null", bool: "true/false", int: "an integer", float: "a float", str: "a string",
             dict: "a dict"}
    return names.get(type(value), type(value).__name__)


def _where(path: tuple[str, ...]) -> str:
    return "/".join(path) or "the top level"
