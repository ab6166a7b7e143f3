"""How many intra-op threads a run on the CPU uses: the cores it may run on (its affinity) less those busy
when it starts, measured from /proc/stat over a moment. Two threads fighting for one free core cost
several times more than the core itself (with one of two cores kept busy, a 2-thread training run ran
6.3x slower than on a quiet machine, a 1-thread run 1.6x: docs/runtime.md), so a run takes only the free
cores. `--threads N` or XSPEC_THREADS chooses instead (xspec/base/process.py applies it). A training run
chooses again when its time per token says the machine changed, or every minute (ThreadWatch).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from xspec.base.errors import UserError

THREADS_VARIABLE = "XSPEC_THREADS"
PROC_STAT = Path("/proc/stat")
SAMPLE_SECONDS = 0.3


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str
    from_free_cores: bool = False  # chosen from the load, not asked for: a run may choose again

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


def read_proc_stat() -> str:
    """/proc/stat's text: every CPU's time, in ticks, by kind (raises OSError where there is none)."""
    return PROC_STAT.read_text(encoding="ascii")


def measure_busy_cores(cpus: list[int]) -> Optional[float]:
    """Cores of `cpus` busy over SAMPLE_SECONDS now; None where /proc/stat cannot be read."""
    try:
        before = read_proc_stat()
        time.sleep(SAMPLE_SECONDS)
        return busy_cores(before, read_proc_stat(), cpus)
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
    return ThreadChoice(free, f"{len(cpus)} cores allowed, {busy:.1f} busy with other work when the run started",
                        from_free_cores=True)


def _at_most(threads: int, cpus: list[int], asked: str) -> int:
    if threads > len(cpus):
        raise UserError(f"{asked}: this process may use {len(cpus)} core{'s' if len(cpus) != 1 else ''}, so at most "
                        f"{len(cpus)} thread{'s' if len(cpus) != 1 else ''}")
    return threads


@dataclass(frozen=True)
class _Look:
    """A moment of the run: the clock, /proc/stat's text (None: unreadable) and this process's CPU time."""

    when: float
    stat: Optional[str]
    own_cpu: float


class ThreadWatch:
    """Chooses a run's threads again while it computes, where they were chosen from the free cores. Each
    update reports its seconds per token; when the median of the last WINDOW moves CHANGE times away from
    the median after the last choice (another process started or stopped), or RECHECK_SECONDS have passed,
    the cores other work kept busy over those WINDOW updates decide: all the cores' busy time
    (/proc/stat) less this process's own CPU time. `apply` sets the thread count (torch.set_num_threads)."""

    WINDOW = 8
    CHANGE = 1.4
    RECHECK_SECONDS = 60.0

    def __init__(self, threads: int, apply: Callable[[int], None], cpus: Optional[list[int]] = None,
                 read_stat: Callable[[], str] = read_proc_stat,
                 clock: Callable[[], float] = time.monotonic, own_cpu: Callable[[], float] = time.process_time):
        self.threads, self.apply, self.cpus = threads, apply, cpus if cpus is not None else allowed_cores()
        self.read_stat, self.clock, self.own_cpu = read_stat, clock, own_cpu
        self.recent: list[float] = []
        self.looks: list[_Look] = []  # before and after each of the last WINDOW updates
        self.baseline: Optional[float] = None
        self.seen = 0
        self.chosen_at = clock()

    def observe(self, seconds_per_token: float) -> Optional[str]:
        """One update's time; a line for the log when the thread count changed. The first WINDOW updates
        only warm up (allocations, first kernels)."""
        self.seen += 1
        self.looks = [*self.looks, self._look()][-(self.WINDOW + 1):]
        if self.seen <= self.WINDOW:
            return None
        self.recent = (self.recent + [seconds_per_token])[-self.WINDOW:]
        if len(self.recent) < self.WINDOW:
            return None
        median = statistics.median(self.recent)
        if self.baseline is None:
            self.baseline = median
        changed = max(median / self.baseline, self.baseline / median) >= self.CHANGE
        if not changed and self.clock() - self.chosen_at < self.RECHECK_SECONDS:
            return None
        return self._choose_again(f"{median / self.baseline:.1f}x the time per token" if changed else "a minute on")

    def _look(self) -> _Look:
        try:
            stat: Optional[str] = self.read_stat()
        except OSError:
            stat = None
        return _Look(self.clock(), stat, self.own_cpu())

    def _choose_again(self, why: str) -> Optional[str]:
        first, last = self.looks[0], self.looks[-1]
        self.recent, self.baseline, self.chosen_at = [], None, self.clock()
        elapsed = last.when - first.when
        if first.stat is None or last.stat is None or elapsed <= 0:
            return None
        others = max(0.0, busy_cores(first.stat, last.stat, self.cpus) - (last.own_cpu - first.own_cpu) / elapsed)
        free = max(1, len(self.cpus) - round(others))
        if free == self.threads:
            return None
        line = (f"threads: {self.threads} -> {free} ({why}; {others:.1f} of {len(self.cpus)} cores busy with "
                "other work)")
        self.threads = free
        self.apply(free)
        return line
