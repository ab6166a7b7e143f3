"""Input fuzz cases on disk: a template directory copied and mutated in a folder of its own beside a bait,
each command run and checked (command.py), and the broken promises collected by class, so that one run
lists every distinct failure with its simplest reproduction instead of stopping at the first."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .command import Place, Result, baits_read, broken_promises, run, set_baits, snapshot, where_it_failed
from .inputs import BAIT, BAIT_NAME, Mutant, Template
from .tally import record_command

# XSPEC_FUZZ_REPORT=FILE appends every command run to FILE as a JSON line: the mutation, the command, its exit
# status and stderr, the promises it broke (for exploring what the commands make of the mutations).
REPORT = os.environ.get("XSPEC_FUZZ_REPORT")


def materialize(template: Template, mutant: Mutant, target: Path) -> list[Path]:
    """The template's files copied to `target` and changed as `mutant` says; returns the baits: files outside
    `target` that no command may read (the case folder's secret, copies a link leads to)."""
    shutil.copytree(template.path, target, symlinks=True)
    bait = target.parent / BAIT_NAME
    bait.write_bytes(b"not for reading\n" * 64)
    baits = [bait]
    for name, data in mutant.write.items():
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.replace(BAIT.encode(), str(bait).encode()))
        if not _inside(path, target):
            baits.append(path)
    for name in mutant.remove:
        _clear(target / name)
    for name, where in mutant.links.items():
        _clear(target / name)
        os.symlink(where.replace(BAIT, str(bait)), target / name)
    for name in mutant.fifos:
        _clear(target / name)
        os.mkfifo(target / name)
    for name in mutant.folders:
        _clear(target / name)
        (target / name).mkdir()
    return baits


def _inside(path: Path, folder: Path) -> bool:
    return os.path.abspath(path).startswith(os.path.abspath(folder) + os.sep)


def _clear(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


@dataclass
class Failure:
    group: str
    what: str                   # the mutation
    argv: list[str]
    promises: list[str]         # the promises it broke
    status: int
    stderr: str
    where: str                  # the innermost frame of xspec's code, for an exception

    def key(self) -> tuple[str, ...]:
        """Its class: the command, the promise broken, and where (the exception's frame, or the message's
        shape with paths and numbers left out)."""
        kind = self.promises[0].split(":", 1)[0]
        exception = _exception_name(self.stderr) if kind in ("internal error", "traceback") else ""
        shape = self.where or _shape(self.promises[0] if kind != "error message" else self.stderr)
        return (self.argv[0] if self.argv[0] != "data" else f"data {self.argv[1]}", kind, exception, shape)

    def shown(self, count: int) -> str:
        tail = [line for line in self.stderr.strip().splitlines()[-3:]]
        lines = [f"* {' / '.join(p for p in self.key() if p)} ({count} case{'s' if count > 1 else ''})",
                 f"  mutation: {self.what}", f"  command: xspec {' '.join(map(_quoted, self.argv))}",
                 f"  exit status {self.status}; broke: {'; '.join(self.promises[:3])}"]
        lines += [f"  stderr: {ascii(line)[1:-1]}" for line in tail]
        return "\n".join(lines)


def _quoted(argument: str) -> str:
    return argument if re.fullmatch(r"[\w./=:,+-]+", argument) else ascii(argument)


def _exception_name(stderr: str) -> str:
    found = re.search(r"internal error while processing .*?: (\w+(?:\.\w+)*)(?::|$| \(run with)", stderr)
    if found:
        return found[1]
    found = re.findall(r"^(\w+(?:\.\w+)*(?:Error|Exception|Warning))\b", stderr, re.MULTILINE)
    return found[-1] if found else ""


def _shape(text: str) -> str:
    text = re.sub(r"(/[^\s:'\"]+)+", "PATH", text.strip().splitlines()[-1] if text.strip() else "")
    return re.sub(r"\d+", "N", text)[:90]


@dataclass
class Cases:
    """The cases of one test: numbered folders under `root`, every command checked, failures by class."""

    group: str
    root: Path
    watched: tuple[Path, ...]
    numbers: itertools.count = field(default_factory=itertools.count)
    failures: dict[tuple, list[Failure]] = field(default_factory=dict)

    def folder(self) -> Path:
        folder = self.root / f"case-{next(self.numbers)}"
        folder.mkdir(parents=True)
        return folder

    def check(self, argv: list[str], place: Place, what: str, folder: Path, quiet_stdout: bool = True,
              after: Optional[Callable[[Result], list[str]]] = None) -> Result:
        """Runs `xspec ARGV` from the case's `folder` and checks the contract (and `after`'s promises)."""
        set_baits(place.baits)
        before = snapshot(place.watched)
        result = run(argv, folder)
        broken = broken_promises(result, place, before, snapshot(place.watched), baits_read(place.baits),
                                 quiet_stdout)
        broken += after(result) if after is not None else []
        record_command(self.group, result.status == 0, result.cpu_seconds)
        failure = Failure(self.group, what, argv, broken, result.status, result.stderr,
                          where_it_failed(result.traceback or result.stderr))
        if broken:
            self.failures.setdefault(failure.key(), []).append(failure)
        if REPORT:
            with open(REPORT, "a", encoding="utf-8") as report:
                report.write(json.dumps({**failure.__dict__, "key": failure.key() if broken else None}) + "\n")
        return result

    def done(self, folder: Path) -> None:
        shutil.rmtree(folder, ignore_errors=True)

    def report(self) -> str:
        """Every class of failure, each with its shortest reproduction; empty when none."""
        shown = []
        for failures in sorted(self.failures.values(), key=lambda f: -len(f)):
            simplest = min(failures, key=lambda f: (len(f.what), f.what))
            shown.append(simplest.shown(len(failures)))
        if not shown:
            return ""
        count = sum(len(f) for f in self.failures.values())
        return f"{count} commands broke the contract, in {len(shown)} classes:\n" + "\n".join(shown)
