"""JSON from files xspec did not write (config.json, tokenizer files, manifests, progress records, run
records), read strictly: UTF-8, no NaN or Infinity, no number that overflows to infinity (`1e999`), no key
given twice (which value would count?), nesting within Python's stack. Each problem is one UserError
naming the file; checking what the values mean is the reader's job, where it knows the keys."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from xspec.base.errors import UserError
from xspec.base.files import read_regular_file
from xspec.base.text import printable, shown


class _Refused(ValueError):
    pass


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:40]} is too large for a 64-bit float")
    return value


def _constant(word: str) -> None:
    raise _Refused(f"{word} is not a JSON number")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _Refused(f"the key {printable(key[:80])!r} is given twice in one object")
        result[key] = value
    return result


def parse_json(data: bytes | str, origin: str) -> Any:
    """The JSON value `data` holds; `origin` (a file name, or a file and key) names it in errors."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text, parse_float=_number, parse_constant=_constant, object_pairs_hook=_object)
    except UnicodeDecodeError as error:
        raise UserError(f"{origin}: not UTF-8 (byte {error.start})") from None
    except _Refused as error:
        raise UserError(f"{origin}: not JSON xspec reads ({error})") from None
    except RecursionError:
        raise UserError(f"{origin}: not JSON xspec reads (nested too deeply)") from None
    except ValueError as error:        # json.JSONDecodeError, and ints past Python's digit limit
        raise UserError(f"{origin}: not JSON ({printable(str(error).splitlines()[0])})") from None


def read_json(path: Path, max_bytes: int) -> Any:
    """The JSON value of the regular file at `path`, at most `max_bytes` long."""
    return parse_json(read_regular_file(path, max_bytes), shown(path))
