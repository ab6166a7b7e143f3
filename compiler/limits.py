"""Bounds on what a spec can make the compiler do.

Specs are untrusted input: a file from a colleague, a checkpoint from the internet. Every construct
that could make compilation slow or large has a bound here, and exceeding one is a diagnostic at
the construct (code `too-large` or `too-deep`), never a hang, a MemoryError or a RecursionError.
Together they keep any spec's compilation under two seconds and well under 1 GB on a laptop;
`bench/worst_case.py` measures the worst constructs at these bounds. Real models sit far inside
them: the paper's base model is 4 KB of spec text, nested 12 deep, and expands to ~160 ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .diagnostics import Span

# --- source text -------------------------------------------------------------------------------
MAX_SOURCE_BYTES = 64 * 1024        # a spec and everything it imports (the base model is 4 KB)
MAX_SOURCE_TOKENS = 20_000          # ... and its tokens (the base model has 500): parsing costs ~25 us each
MAX_RESOLVED_BYTES = 80 * 1024      # a self-contained spec (a run's or a checkpoint's): the source, values inlined
MAX_RESOLVED_TOKENS = 24_000
MAX_FILES = 64                      # files one spec may import, directly or not
MAX_SYNTAX_DEPTH = 64               # nesting of statements and expressions in the syntax tree

# --- constant values ---------------------------------------------------------------------------
MAX_INT = 2**63 - 1                 # integers are sizes and counts: int64 is every framework's limit
MAX_STRING = 4096                   # characters in a string value
MAX_LIST_ITEMS = 1024               # items in a list value
MAX_EXPONENT_BITS = 63              # `a ** b` of integers may not exceed MAX_INT: checked before computing

# --- expanding blocks into the op graph -------------------------------------------------------
MAX_REPEAT = 10_000                 # layers in one `repeat`
MAX_NESTING = 100                   # block calls, function calls and expressions nested while expanding
MAX_MODULES = 20_000                # op nodes and module instances the model expands to
MAX_STEPS = 500_000                 # expressions and statements evaluated while expanding

# --- diagnostics -------------------------------------------------------------------------------
MAX_ERRORS = 50                     # compilation stops after this many errors, as C compilers do
MAX_HINT_CANDIDATES = 500           # names a "did you mean" hint compares against


class LimitExceeded(Exception):
    """A bound was crossed while expanding; compilation of the model stops there."""

    def __init__(self, span: Span, message: str, hint: str | None = None, code: str = "too-large") -> None:
        super().__init__(message)
        self.span, self.message, self.hint, self.code = span, message, hint, code


@dataclass
class Budget:
    """The work one compilation may do while expanding blocks, charged as it happens."""

    modules: int = 0
    steps: int = 0

    def module(self, span: Span) -> None:
        self.modules += 1
        if self.modules > MAX_MODULES:
            raise LimitExceeded(span, f"the model expands to more than {MAX_MODULES:,} ops and modules",
                                "a repeat count or a block called in a loop is much larger than intended")

    def step(self, span: Span) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise LimitExceeded(span, f"expanding the model takes more than {MAX_STEPS:,} evaluation steps",
                                "a repeat count or a block called in a loop is much larger than intended")
