"""The contract every spec text must keep, checked in one function that every fuzz test uses.

Any text either compiles, and then builds, runs a forward pass, and its resolved spec compiles again
to the same model; or it fails with diagnostics whose spans point into a file (or at the command
line, for overrides). Never another exception, never more than COMPILE_CPU_SECONDS of CPU time, and
never anything from the spec executed.
"""

from __future__ import annotations

import builtins
import signal
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

import xspec
from xspec.compiler.diagnostics import COMMAND_LINE, Diagnostic, printable

from .forward import check_interface, run_forward
from .signature import differences, signature

COMPILE_CPU_SECONDS = 2.0
# A compile still running after this much CPU time is interrupted (where Python code is running):
# a hang then fails one case instead of the whole run.
WATCHDOG_CPU_SECONDS = 20.0
# Models small enough to build and run for every case: a forward pass then costs milliseconds.
BUILD_MAX_BYTES = 4 * 2**20
BUILD_MAX_NODES = 400
# What a string from the spec would set if any compiler stage executed it (see grammar.HOSTILE_STRINGS).
CANARY = "xspec_fuzz_canary"


@dataclass(frozen=True)
class Outcome:
    compiled: bool
    ran: bool  # built, and ran a forward pass
    codes: tuple[str, ...]  # the codes of the diagnostics, when it did not compile


class ContractBroken(AssertionError):
    """A spec text broke the compiler's contract; the message carries the text to reproduce it."""

    def __init__(self, what: str, text: str, name: str, overrides: Optional[Mapping[str, Any]],
                 detail: str = "") -> None:
        # Control characters escaped, so that printing a failure cannot drive the terminal (repr is exact).
        shown = [what, "", f"--- spec ({name!r}, {len(text)} characters) ---", printable_lines(text)]
        if overrides:
            shown += ["--- overrides ---", repr(dict(overrides))]
        if detail:
            shown += ["--- detail ---", printable_lines(detail)]
        super().__init__("\n".join(shown))
        self.what, self.text, self.name, self.overrides = what, text, name, overrides


def printable_lines(text: str) -> str:
    return "\n".join(printable(line) for line in text.split("\n"))


class _Interrupted(BaseException):
    """Raised into a compile that ran past WATCHDOG_CPU_SECONDS (a BaseException: no handler eats it)."""


def check(text: str, name: str = "fuzz.xspec", overrides: Optional[Mapping[str, Any]] = None,
          allow_imports: bool = False) -> Outcome:
    """Compile `text` as the file `name` and check the contract; raise ContractBroken if it is broken."""

    def broken(what: str, detail: str = "") -> ContractBroken:
        return ContractBroken(what, text, name, overrides, detail)

    if hasattr(builtins, CANARY):
        delattr(builtins, CANARY)
    failure: Optional[xspec.SpecError] = None
    spec = None
    start = time.process_time()
    try:
        with _watchdog(WATCHDOG_CPU_SECONDS):
            spec = xspec.compile_source(text, name, overrides=overrides, allow_imports=allow_imports)
    except xspec.SpecError as error:
        failure = error
    except _Interrupted:
        raise broken(f"compile still running after {WATCHDOG_CPU_SECONDS} s of CPU time") from None
    except Exception as error:  # anything else is the bug this oracle looks for
        raise broken(f"compile raised {type(error).__name__}", traceback.format_exc()) from None
    seconds = time.process_time() - start
    if seconds > COMPILE_CPU_SECONDS:
        raise broken(f"compile took {seconds:.2f} s of CPU time (the limit is {COMPILE_CPU_SECONDS} s)")
    if hasattr(builtins, CANARY):
        raise broken("compiling executed text from the spec")

    if failure is not None:
        problems = _diagnostic_problems(failure.diagnostics, text, name, overrides, str(failure))
        if not any(d.severity == "error" for d in failure.diagnostics):
            problems.append("SpecError without an error record")
        if problems:
            raise broken("bad diagnostics: " + "; ".join(problems[:5]), str(failure))
        return Outcome(compiled=False, ran=False, codes=tuple(d.code for d in failure.diagnostics))

    assert spec is not None
    records = spec._compilation.diagnostics.records
    problems = _diagnostic_problems(records, text, name, overrides, spec.warnings)
    problems += [f"a compiled spec has an error record: {d.message}" for d in records if d.severity != "warning"]
    if problems:
        raise broken("bad warnings: " + "; ".join(problems[:5]), spec.warnings)

    _check_round_trip(spec, name, broken)
    try:
        check_interface(spec)
    except Exception as error:
        raise broken(f"the compiled spec's interface is broken: {type(error).__name__}: {error}",
                     traceback.format_exc()) from None
    ran = False
    validated = spec._compilation.validated
    if validated.bytes_needed <= BUILD_MAX_BYTES and spec.graph.number_of_nodes() <= BUILD_MAX_NODES:
        try:
            run_forward(spec)
        except AssertionError as error:
            raise broken(f"the built model disagrees with the compiled spec: {error}", spec.python_source) from None
        except Exception as error:
            raise broken(f"build or forward pass failed: {type(error).__name__}: {error}",
                         traceback.format_exc() + "\n--- generated module ---\n" + spec.python_source) from None
        ran = True
    if hasattr(builtins, CANARY):
        raise broken("building or running the model executed text from the spec")
    return Outcome(compiled=True, ran=ran, codes=())


def _check_round_trip(spec: Any, name: str, broken) -> None:
    """The resolved spec (what a run directory keeps) compiles again, alone, to the same model."""
    resolved = spec.resolved_source
    try:
        again = xspec.compile_source(resolved, name, allow_imports=False)
    except xspec.SpecError as error:
        raise broken("the resolved spec does not compile again",
                     f"{error}\n--- resolved spec ---\n{resolved}") from None
    except Exception as error:
        raise broken(f"compiling the resolved spec raised {type(error).__name__}",
                     f"{traceback.format_exc()}\n--- resolved spec ---\n{resolved}") from None
    found = differences(signature(spec), signature(again))
    if found:
        raise broken("the resolved spec compiles to a different model: " + "; ".join(found[:5]),
                     f"--- resolved spec ---\n{resolved}")


def _diagnostic_problems(records: list[Diagnostic], text: str, name: str,
                         overrides: Optional[Mapping[str, Any]], rendered: str) -> list[str]:
    """What is wrong with a list of diagnostics and their rendering (nothing, normally)."""
    problems = []
    if "Traceback" in rendered:
        problems.append("the rendered diagnostics hold a traceback")
    if not all(line.isprintable() for line in rendered.split("\n")):  # a spec must not drive the terminal
        problems.append("the rendered diagnostics hold control characters")
    lines = text.split("\n")  # lines as the parser counts them
    for d in records:
        span = d.span
        where = f"{d.code} at {span.file!r}:{span.line}:{span.col}"
        if f"[{d.code}]" not in rendered:
            problems.append(f"{where} is not rendered")
        if span.file == COMMAND_LINE.file:
            if span != COMMAND_LINE:
                problems.append(f"{where}: a position on the command line, which has none")
            elif not overrides:
                problems.append(f"{where}: a command-line span without overrides")
            continue
        if not isinstance(span.file, str) or not span.file or span.line < 1 or span.col < 1:
            problems.append(f"{where}: not a position in a file")
        elif (span.end_line, span.end_col) < (span.line, span.col):
            problems.append(f"{where}: ends at {span.end_line}:{span.end_col}, before it starts")
        elif span.file == name and (span.line > len(lines) or span.col > len(lines[span.line - 1]) + 1):
            problems.append(f"{where}: outside the text ({len(lines)} lines)")
    return problems


@contextmanager
def _watchdog(seconds: float) -> Iterator[None]:
    """Interrupt the block after `seconds` of CPU time (checked between Python bytecodes)."""

    def interrupt(signum, frame):
        raise _Interrupted()

    previous = signal.signal(signal.SIGPROF, interrupt)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
