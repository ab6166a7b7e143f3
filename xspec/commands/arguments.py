"""Argument types shared by the subcommands: a bad value is refused by argparse itself, naming the option
(`xspec translate: error: argument --beam: must be at least 1`), before any work starts."""

from __future__ import annotations

import argparse
import math
from typing import Callable

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
