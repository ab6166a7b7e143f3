"""How many intra-op threads a run on the CPU uses: the cores it may run on (its affinity) less those busy
when it starts, measured from /proc/stat over a moment. Two threads fighting for one free core cost
several times more than the core itself (with one of two cores kept busy, a 2-thread training run ran
6.3x slower than on a quiet machine, a 1-thread run 1.6x: docs/runtime.md), so a run takes only the free
cores. `--threads N` or XSPEC_THREADS chooses instead (xspec/base/process.py applies it).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from xspec.base.errors import UserError

THREADS_VARIABLE = "XSPEC_THREADS"
PROC_STAT = Path("/proc/stat")
SAMPLE_SECONDS = 0.3


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str

    def describe(self) -> str:
        return f"{self.threads} thread{'s' if self.threads != 1 else ''} ({self.reason})"


def allowed_cores() -> list[int]:
    """The CPUs this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpu_times(stat: str) -> dict[int, tuple[int, int]]:
    """Each CPU's (idle, total) time in ticks from /proc/stat's text (idle counts iowait)."""
    times = {}
    for line in stat.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and len(fields) >= 5:
            ticks = [int(field) for field in fields]
            times[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))
    return times


def busy_cores(before: str, after: str, cpus: list[int]) -> float:
    """How many of `cpus` other work kept busy between two readings of /proc/stat."""
    first, second = cpu_times(before), cpu_times(after)
    busy = 0.0
    for cpu in cpus:
        if cpu in first and cpu in second:
            idle, total = (b - a for a, b in zip(first[cpu], second[cpu]))
            busy += 1 - idle / total if total > 0 else 0.0
    return busy


def measure_busy_cores(cpus: list[int]) -> Optional[float]:
    """Cores of `cpus` busy over SAMPLE_SECONDS now; None where /proc/stat cannot be read."""
    try:
        before = PROC_STAT.read_text(encoding="ascii")
        time.sleep(SAMPLE_SECONDS)
        return busy_cores(before, PROC_STAT.read_text(encoding="ascii"), cpus)
    except OSError:
        return None


def choose_threads(requested: Optional[int] = None) -> ThreadChoice:
    """`requested` (--threads), else XSPEC_THREADS, else the allowed cores that are free now (at least one).
    Never more threads than the cores the process may use: more only fight over them (and thousands make
    OpenMP fail to start them)."""
    cpus = allowed_cores()
    if requested is None:
        value = os.environ.get(THREADS_VARIABLE, "").strip()
        if value:
            if not value.isdigit() or int(value) < 1:
                raise UserError(f"{THREADS_VARIABLE}={value!r}: a number of threads, at least 1")
            asked = f"{THREADS_VARIABLE}={value}"
            return ThreadChoice(_at_most(int(value), cpus, asked), asked)
    elif requested < 1:
        raise UserError(f"--threads {requested}: a number of threads, at least 1")
    else:
        asked = f"--threads {requested}"
        return ThreadChoice(_at_most(requested, cpus, asked), asked)
    busy = measure_busy_cores(cpus)
    if busy is None:
        return ThreadChoice(len(cpus), f"{len(cpus)} cores allowed; their load cannot be read")
    free = max(1, len(cpus) - round(busy))
    return ThreadChoice(free, f"{len(cpus)} cores allowed, {busy:.1f} busy with other work when the run started")


def _at_most(threads: int, cpus: list[int], asked: str) -> int:
    if threads > len(cpus):
        raise UserError(f"{asked}: this process may use {len(cpus)} core{'s' if len(cpus) != 1 else ''}, so at most "
                        f"{len(cpus)} thread{'s' if len(cpus) != 1 else ''}")
    return threads
