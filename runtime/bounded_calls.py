"""Calls into a tokenizer library, each run by one worker thread with a time budget, which both libraries
(`tokenizers`, sentencepiece) allow by releasing the GIL while they work: a call that stalls is Overtime,
never a hang (the thread is left to finish or to end with the process), and whatever a call raises, a native
panic included, is CallFailed with one line saying why; the library's own report to stderr is held back."""

from __future__ import annotations

import os
import queue
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from typing import BinaryIO, Callable, Iterator, TypeVar

from xspec.base.errors import UserError
from xspec.base.text import printable

READ_TIMEOUT_S = 60.0               # making a tokenizer from its file (64 MiB at most; 2 MB: 0.05 s)

T = TypeVar("T")


class Overtime(Exception):
    """The call was still running when its budget ran out."""


class CallFailed(Exception):
    """The call raised; `reason` says what, in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def bounded(call: Callable[[], T], seconds: float) -> T:
    """call()'s result, run by the worker thread and waited for at most `seconds` (else Overtime: the worker
    is left to finish it, or to end with the process, and the next call gets a new one); whatever it
    raises, a native panic included, is CallFailed."""
    return bounded_timed(call, seconds)[0]


def bounded_timed(call: Callable[[], T], seconds: float) -> tuple[T, float]:
    """As bounded, with the CPU time the worker thread spent on the call: a measure of the call alone, which
    neither other processes nor this process's other threads (an abandoned call among them) change."""
    outcome: list = []
    finished = threading.Event()
    with _calls.lock, _failure_report_held_back() as failed:
        if _calls.worker is None:
            _calls.worker = _start_worker()
        _calls.worker.put((call, outcome, finished))
        if not finished.wait(seconds):
            _calls.worker = None
            raise Overtime
        done, value, cpu = outcome[0]
        failed.append(not done)
    if done:
        return value, cpu
    _reraise_interrupt(value)
    raise CallFailed(_reason(value))


class _Calls:
    """The worker thread's queue, and what the calls share; made anew in a forked child, which has neither
    the thread nor a lock another thread may have held."""

    def __init__(self) -> None:
        self.lock = threading.Lock()                    # one call at a time: one worker, one stderr
        self.worker: queue.SimpleQueue | None = None
        self.held: BinaryIO | None = None               # where stderr goes during a call


_calls = _Calls()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: globals().update(_calls=_Calls()))


def _start_worker() -> queue.SimpleQueue:
    calls: queue.SimpleQueue = queue.SimpleQueue()

    def serve() -> None:
        while True:
            call, outcome, finished = calls.get()
            start = time.thread_time()
            try:
                # Both libraries work on the calling thread for one text: its CPU time is the call's.
                outcome.append((True, call(), time.thread_time() - start))
            except BaseException as error:      # a pyo3 PanicException is no Exception
                outcome.append((False, error, time.thread_time() - start))
            finished.set()

    threading.Thread(target=serve, name="xspec-tokenizer", daemon=True).start()
    return calls


def _is_panic(error: BaseException) -> bool:
    # pyo3_runtime.PanicException cannot be imported by name: it is known by its class's name.
    return type(error).__name__ == "PanicException"


def _reraise_interrupt(error: BaseException) -> None:
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        raise error


def _reason(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    text = printable(lines[0][:200]) if lines else type(error).__name__
    return f"the tokenizers library panicked: {text}" if _is_panic(error) else text


@contextmanager
def _failure_report_held_back() -> Iterator[list[bool]]:
    """While a call runs, what the process writes to stderr (fd 2) is held in a temporary file and passed on
    afterwards, unless the call failed (True appended to the list): the library then wrote its own report
    there (Rust's panic report, a backtrace with RUST_BACKTRACE set; sentencepiece's log), which the error
    raised instead says in one line. (_calls.lock held.)"""
    failed: list[bool] = []
    held = _held_file()
    saved = _duplicated_stderr() if held is not None else None
    if held is None or saved is None:
        yield failed
        return
    sys.stderr.flush()
    os.dup2(held.fileno(), 2)
    try:
        yield failed
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        held.seek(0)
        written = held.read()
        held.seek(0)
        held.truncate()
        if written and not any(failed):
            _write_all(2, written)


def _held_file() -> BinaryIO | None:
    """The temporary file stderr goes to during a call (one for the process); None where none can be made."""
    if _calls.held is None:
        try:
            _calls.held = tempfile.TemporaryFile()
        except OSError:
            return None
    return _calls.held


def _duplicated_stderr() -> int | None:
    try:
        return os.dup(2)
    except OSError:                 # no stderr at all: nothing to hold back
        return None


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def read_bounded(load: Callable[[], T], refusal: str) -> T:
    """What `load` makes of a tokenizer's file, or a UserError starting with `refusal` saying why (the library
    raises assorted types for a file it cannot read, a panic among them)."""
    try:
        return bounded(load, READ_TIMEOUT_S)
    except Overtime:
        raise UserError(f"{refusal} (reading it takes more than {READ_TIMEOUT_S:.0f} s)") from None
    except CallFailed as failed:
        raise UserError(f"{refusal} ({failed.reason})") from None
