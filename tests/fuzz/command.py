"""An xspec command run in process on a hostile input directory, and the contract it keeps, checked in one
function (`broken_promises`) that every input fuzz test uses.

The command succeeds, or fails with exit status 1 or 2 and one line on stderr, `xspec: error: ...` (or a
spec's diagnostics); never the internal error's status 70, a traceback, or output that native code wrote
past Python (a Rust panic's message); its messages hold no control characters (they are escaped); it
ends within CASE_CPU_SECONDS of CPU time; it reads no file outside the directories it was given (an
audit hook sees Python's opens, a bait file's access time the others'), and writes nothing outside its
output: the watched folders are the same afterwards but for it.
"""

from __future__ import annotations

import io
import os
import re
import signal
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

from xspec import cli

CASE_CPU_SECONDS = 15.0         # a first import of transformers' classes counts too: the warm-up pays it
WATCHDOG_CPU_SECONDS = 30.0     # then the command is interrupted (where Python code runs)
WATCHDOG_WALL_SECONDS = 60.0    # and where it waits (a blocking read of a pipe)
INTERNAL_ERROR = 70
SPEC_DIAGNOSTIC = re.compile(r"^.+:\d+:\d+: error: .+ \[[\w-]+\]$")
PROJECT_FRAME = re.compile(r'^  File "(?P<file>[^"]*/(?:xspec|compiler|runtime)/[^"]+)", line (?P<line>\d+), '
                           r"in (?P<function>\S+)$")


@dataclass(frozen=True)
class Place:
    """Where a case's command may read and write."""

    watched: tuple[Path, ...]           # folders whose every change is checked
    reads: tuple[Path, ...]             # folders and files it may read (its inputs, its output)
    writes: tuple[Path, ...]            # folders it may write, and siblings named after them (".OUT.*")
    baits: tuple[Path, ...] = ()        # files outside its inputs that it must not read

    def may_write(self, path: str) -> bool:
        return any(_inside(path, str(w)) or _inside(path, str(w.parent / f".{w.name}")) for w in self.writes)

    def may_read(self, path: str) -> bool:
        return self.may_write(path) or any(_inside(path, str(r)) for r in self.reads)

    def is_watched(self, path: str) -> bool:
        return any(_inside(path, str(w)) for w in self.watched)


def _inside(path: str, folder: str) -> bool:
    """`path` is `folder`, under it, or (for a sibling prefix such as ".out") a name starting with it."""
    return path == folder or path.startswith(folder.rstrip("/") + "/") or \
        (os.path.basename(folder).startswith(".") and path.startswith(folder))


@dataclass
class Result:
    argv: list[str]
    status: int
    stdout: str
    stderr: str
    native: str                         # what was written to file descriptors 1 and 2 past sys.stdout/stderr
    cpu_seconds: float
    interrupted: str = ""               # why the watchdog stopped it
    opened: list[tuple[str, bool]] = field(default_factory=list)     # (path, for writing) of every open
    changed: list[tuple[str, str]] = field(default_factory=list)     # (event, path) removed, renamed, made...
    traceback: str = ""                 # of the exception behind an internal error


# --- watching what a command touches ------------------------------------------------------------------

class _Watch:
    def __init__(self) -> None:
        self.opened: list[tuple[str, bool]] = []
        self.changed: list[tuple[str, str]] = []


_WATCH: Optional[_Watch] = None
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# The events that change a path: the positions of each path argument and of its dir_fd (None: has none).
_CHANGES = {"os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.rename": ((0, 2), (1, 3)),
            "os.symlink": ((1, 2),), "os.link": ((1, 3),), "os.truncate": ((0, None),), "os.chmod": ((0, 2),),
            "os.utime": ((0, 3),), "shutil.rmtree": ((0, 1),), "shutil.copyfile": ((1, None),),
            "shutil.move": ((0, None), (1, None)), "os.chown": ((0, 3),)}


def _path(value, dir_fd=None) -> Optional[str]:
    """The absolute path an audit event's argument names (relative to `dir_fd`, else to the working folder)."""
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        return None
    if isinstance(dir_fd, int) and not os.path.isabs(value):
        return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), value)
    return os.path.abspath(value)


def _audit(event: str, args: tuple) -> None:
    watch = _WATCH
    if watch is None:
        return
    try:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None))[:3]
            # A relative path may be relative to a dir_fd the event does not give (shutil.rmtree's): left out.
            found = _path(path) if isinstance(path, (str, bytes, os.PathLike)) and os.path.isabs(path) else None
            if found is not None:
                writing = any(c in (mode or "") for c in "wax+") or bool((flags or 0) & _WRITE_FLAGS)
                watch.opened.append((found, writing))
        elif event in _CHANGES:
            for index, dir_fd in _CHANGES[event]:
                at = args[dir_fd] if dir_fd is not None and dir_fd < len(args) else None
                found = _path(args[index], at) if index < len(args) else None
                if found is not None:
                    watch.changed.append((event, found))
    except Exception:   # an audit hook that raises would fail the audited call: never
        pass


sys.addaudithook(_audit)


class _Interrupted(BaseException):
    """Raised into a command past the watchdog's limits (a BaseException: handlers of Exception miss it)."""


@contextmanager
def _watchdog(result: Result) -> Iterator[None]:
    def interrupt(signum, frame):
        result.interrupted = (f"still running after {WATCHDOG_CPU_SECONDS:g} s of CPU time" if signum == signal.SIGPROF
                              else f"still running after {WATCHDOG_WALL_SECONDS:g} s")
        raise _Interrupted()

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGPROF, signal.SIGALRM)}
    signal.setitimer(signal.ITIMER_PROF, WATCHDOG_CPU_SECONDS)
    signal.setitimer(signal.ITIMER_REAL, WATCHDOG_WALL_SECONDS)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextmanager
def _native_output() -> Iterator[list[str]]:
    """File descriptors 1 and 2 into a file for the block; the list gets what was written to them."""
    written: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as sink:
        saved = [os.dup(1), os.dup(2)]
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield written
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sink.seek(0)
            written.append(sink.read().decode("utf-8", "replace"))


@contextmanager
def _recording_tracebacks(result: Result) -> Iterator[None]:
    """The traceback of the exception the CLI's last resort reports in one line, kept in `result`."""
    original = getattr(cli, "internal_error_message", None)
    if original is None:
        yield
        return

    def recording(error, *args, **kwargs):
        result.traceback = traceback.format_exc()
        return original(error, *args, **kwargs)

    cli.internal_error_message = recording
    try:
        yield
    finally:
        cli.internal_error_message = original


def run(argv: list[str], cwd: Path) -> Result:
    """`xspec ARGV` in process, from folder `cwd`, everything it prints and touches recorded."""
    global _WATCH
    # As a terminal's streams are: UTF-8, stdout strict (a lone surrogate cannot be printed), stderr escaping.
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
    stderr = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)
    result = Result(list(argv), -1, "", "", "", 0.0)
    watch = _Watch()
    before = os.getcwd()
    os.chdir(cwd)
    start = time.process_time()
    try:
        with _native_output() as native, redirect_stdout(stdout), redirect_stderr(stderr), \
                _recording_tracebacks(result):
            _WATCH = watch
            try:
                with _watchdog(result):
                    result.status = cli.main(list(argv))
            except SystemExit as exit_:     # argparse
                result.status = exit_.code if isinstance(exit_.code, int) else 2
            except _Interrupted:
                result.status = -1
            finally:
                _WATCH = None
    finally:
        os.chdir(before)
    result.cpu_seconds = time.process_time() - start
    result.stdout, result.stderr = (stream.buffer.getvalue().decode("utf-8") for stream in (stdout, stderr))
    result.native = native[0]
    result.opened, result.changed = watch.opened, watch.changed
    return result


# --- what is on disk ------------------------------------------------------------------------------------

Snapshot = dict[str, tuple]


def snapshot(folders: tuple[Path, ...]) -> Snapshot:
    """Every entry under `folders`: its kind, size, modification time and (for a link) its target."""
    found: Snapshot = {}
    for folder in folders:
        for top, dirs, files in os.walk(folder):
            for name in dirs + files:
                path = os.path.join(top, name)
                try:
                    status = os.lstat(path)
                except OSError:
                    continue
                if os.path.isdir(path) and not os.path.islink(path):
                    found[path] = ("folder",)        # its time changes with what is made in it: not a change
                    continue
                target = os.readlink(path) if os.path.islink(path) else None
                found[path] = (status.st_mode >> 12, status.st_size, status.st_mtime_ns, target)
    return found


def set_baits(baits: tuple[Path, ...]) -> None:
    """Each bait's access time set before its modification time: a read (even by native code, even through
    a memory map) then moves it, on a file system mounted relatime or strictatime."""
    for bait in baits:
        if bait.exists():
            os.utime(bait, ns=(0, bait.stat().st_mtime_ns))


def baits_read(baits: tuple[Path, ...]) -> list[str]:
    return [str(bait) for bait in baits if bait.exists() and bait.stat().st_atime_ns != 0]


# --- the contract ----------------------------------------------------------------------------------------

def broken_promises(result: Result, place: Place, before: Snapshot, after: Snapshot, read_baits: list[str],
                    quiet_stdout: bool = True) -> list[str]:
    """Every way the command broke the contract (none, normally); each names its kind before a colon."""
    broken = []
    if result.interrupted:
        broken.append(f"hang: {result.interrupted}")
    elif result.status == INTERNAL_ERROR:
        broken.append(f"internal error: {_last_line(result.stderr)}")
    elif result.status not in (0, 1, 2):
        broken.append(f"exit status {result.status}")
    if result.cpu_seconds > CASE_CPU_SECONDS and not result.interrupted:
        broken.append(f"slow: {result.cpu_seconds:.1f} s of CPU time (the limit is {CASE_CPU_SECONDS:g} s)")
    if any("Traceback (most recent call last)" in text for text in (result.stdout, result.stderr, result.native)):
        broken.append("traceback: printed")
    if result.native.strip() and (result.status != 0 or "panicked" in result.native):
        broken.append(f"native output: {_clip(result.native.strip().splitlines()[0])}")
    if result.status in (1, 2) and not result.interrupted:
        broken += _error_message_problems(result)
    lines = result.stderr.splitlines() + (result.stdout.splitlines() if quiet_stdout else [])
    if not all(line.isprintable() for line in lines):
        shown = next(line for line in lines if not line.isprintable())
        broken.append(f"control characters: in the output: {_clip(ascii(shown))}")
    broken += _outside(result, place, before, after, read_baits)
    return broken


def _error_message_problems(result: Result) -> list[str]:
    lines = result.stderr.rstrip("\n").split("\n")
    if result.status == 2 and lines and SPEC_DIAGNOSTIC.match(lines[0]):
        return []
    if len(lines) == 1 and lines[0].startswith("xspec: error: "):
        return []
    return [f"error message: {len(lines)} lines, the last {_clip(ascii(lines[-1]))}"]


def _outside(result: Result, place: Place, before: Snapshot, after: Snapshot, read_baits: list[str]) -> list[str]:
    broken = [f"read outside: the bait {bait} was read" for bait in read_baits]
    for path, writing in result.opened:
        real = os.path.realpath(path)
        if writing and place.is_watched(path) and not place.may_write(path):
            broken.append(f"wrote outside: opened {path} for writing")
        elif not writing and not os.path.isdir(real) and (
                (place.is_watched(real) and not place.may_read(real)) or Path(real) in place.baits or
                (place.may_read(path) and not place.may_write(path) and not place.may_read(real))):
            broken.append(f"read outside: opened {path}" + (f" (a link to {real})" if real != path else ""))
    for event, path in result.changed:
        if event == "os.mkdir" and before.get(path) == ("folder",):
            continue        # makedirs(exist_ok=True) of a folder that is there
        if place.is_watched(path) and not place.may_write(path):
            broken.append(f"wrote outside: changed {path}")
    for path in sorted(set(before) | set(after)):
        if before.get(path) != after.get(path) and not place.may_write(path):
            how = "made" if path not in before else "removed" if path not in after else "changed"
            broken.append(f"wrote outside: {path} {how}")
    return list(dict.fromkeys(broken))


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return _clip(lines[-1]) if lines else "(nothing on stderr)"


def _clip(text: str, limit: int = 240) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def where_it_failed(traceback_text: str) -> str:
    """The innermost frame of xspec's own code in a traceback (`runtime/tokenizer.py:41 in __init__`)."""
    frames = [PROJECT_FRAME.match(line) for line in traceback_text.splitlines()]
    frames = [f for f in frames if f is not None]
    if not frames:
        return ""
    last = frames[-1]
    file = re.sub(r"^.*?/(?=(?:xspec|compiler|runtime)/)", "", last["file"])
    return f"{file}:{last['line']} in {last['function']}"
