"""Argument types shared by the subcommands: a bad value is refused by argparse itself, naming the option
(`xspec translate: error: argument --beam: must be at least 1`), before any work starts."""

from __future__ import annotations

import argparse
import math
import re
from typing import Callable

from xspec.base.errors import UserError

# Counts and sizes on the command line: beyond this they are mistakes, not requests.
LARGEST_COUNT = 2**31 - 1


def int_at_least(least: int, most: int = LARGEST_COUNT) -> Callable[[str], int]:
    """An integer option in [least, most]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        if value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:,}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its own messages
    return parse


_BYTE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_BYTE_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?B)?", re.IGNORECASE)


def byte_size(least: int, most: int) -> Callable[[str], int]:
    """A size in bytes, written as transformers writes them (decimal units): 5GB, 500MB, 2.5GB, 1000000."""

    def parse(text: str) -> int:
        match = _BYTE_SIZE.fullmatch(text.strip())
        if match is None:
            raise argparse.ArgumentTypeError(f"expected a size such as 5GB, 500MB or 1000000, got {text!r}")
        value = int(float(match.group(1)) * _BYTE_UNITS[(match.group(2) or "").upper()])
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(f"must be between {least:,} and {most:,} bytes, got {value:,}")
        return value

    parse.__name__ = "size"
    return parse


def float_at_least(least: float, most: float = math.inf) -> Callable[[str], float]:
    """A finite number option in [least, most]."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least:g}, got {value:g}")
        if value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:g}, got {value:g}")
        return value

    parse.__name__ = "number"
    return parse


def add_debug_argument(parser: argparse.ArgumentParser) -> None:
    """--debug on a (sub)command's own parser, so that it may follow the command's name; SUPPRESS keeps a
    value given before the name."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show a Python traceback on errors")


def add_set_argument(parser: argparse.ArgumentParser, what: str = "") -> None:
    """--set KEY=VALUE, repeatable, the same in every command: `args.overrides`, read by parse_overrides."""
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="override a parameter (heads=16) or a section key (train.warmup_steps=400)" + what +
                             "; VALUE is a spec expression (2 * d_model, d_k, true); repeatable; "
                             "`xspec keys` lists the section keys")


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """KEY=VALUE pairs; the compiler reads each VALUE as a spec expression, where the key is defined."""
    overrides: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UserError(f"--set {pair}: expected KEY=VALUE, e.g. --set heads=16")
        overrides[key.strip()] = value.strip()
    return overrides


def add_device_argument(parser: argparse.ArgumentParser, note: str = "") -> None:
    """--device, with the same default in every command: CUDA when available, else the CPU."""
    parser.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: CUDA when available)" + note)


def add_process_arguments(parser: argparse.ArgumentParser) -> None:
    """--threads and --tcmalloc/--no-tcmalloc: what every command that computes takes (xspec/base/process.py)."""
    parser.add_argument("--threads", type=int_at_least(1), metavar="N",
                        help="CPU threads for torch, at most the cores the process may use (default: "
                             "XSPEC_THREADS, else the cores free when the command starts: on a busy machine, "
                             "fewer threads are much faster)")
    parser.add_argument("--tcmalloc", action=argparse.BooleanOptionalAction, default=True,
                        help="on a CPU, run with tcmalloc when it is installed (several times faster than glibc's "
                             "malloc here; default: on)")
