"""A run's CPU threads: the cores it may use less those other work keeps busy (from /proc/stat, simulated
here), or what --threads and XSPEC_THREADS say."""

from __future__ import annotations

import pytest

from xspec.base.errors import UserError
from xspec.base import threads
from xspec.base.threads import busy_cores, choose_threads, cpu_times

# Two readings of /proc/stat 100 ticks apart per CPU: cpu0 busy 90 of 100 ticks, cpu1 idle (iowait counts
# as idle), cpu2 half busy.
BEFORE = ("cpu  300 0 300 900 0 0 0 0 0 0\n"
          "cpu0 100 0 100 300 0 0 0 0 0 0\ncpu1 100 0 100 300 0 0 0 0 0 0\ncpu2 100 0 100 300 0 0 0 0 0 0\n"
          "intr 12345\n")
AFTER = ("cpu  400 0 400 1000 0 0 0 0 0 0\n"
         "cpu0 180 0 110 310 0 0 0 0 0 0\ncpu1 100 0 100 390 10 0 0 0 0 0\ncpu2 130 0 120 350 0 0 0 0 0 0\n"
         "intr 12399\n")


def test_each_cpus_busy_share_is_read_from_two_samples():
    assert cpu_times(BEFORE) == {0: (300, 500), 1: (300, 500), 2: (300, 500)}
    assert busy_cores(BEFORE, AFTER, [0, 1, 2]) == pytest.approx(0.9 + 0.0 + 0.5)
    assert busy_cores(BEFORE, AFTER, [1]) == pytest.approx(0.0)   # only the cores the process may use


def simulate(monkeypatch, cpus: list[int], busy):
    monkeypatch.delenv(threads.THREADS_VARIABLE, raising=False)
    monkeypatch.setattr(threads, "allowed_cores", lambda: cpus)
    monkeypatch.setattr(threads, "measure_busy_cores", lambda allowed: busy)


def test_a_run_takes_the_free_cores_and_at_least_one(monkeypatch):
    simulate(monkeypatch, [0, 1], 1.1)
    chosen = choose_threads()
    assert chosen.threads == 1
    assert chosen.describe() == "1 thread (2 cores allowed, 1.1 busy with other work when the run started)"
    simulate(monkeypatch, [0, 1, 2, 3], 0.2)
    assert choose_threads().threads == 4
    simulate(monkeypatch, [0, 1], 2.0)
    assert choose_threads().threads == 1
    simulate(monkeypatch, [0, 1, 2], None)
    assert choose_threads().describe() == "3 threads (3 cores allowed; their load cannot be read)"


def test_the_option_and_the_variable_choose_instead(monkeypatch):
    simulate(monkeypatch, [0, 1, 2, 3], 3.9)
    assert choose_threads(2).describe() == "2 threads (--threads 2)"
    monkeypatch.setenv(threads.THREADS_VARIABLE, "3")
    assert choose_threads().describe() == "3 threads (XSPEC_THREADS=3)"
    assert choose_threads(1).threads == 1                                   # the option over the variable
    monkeypatch.setenv(threads.THREADS_VARIABLE, "many")
    with pytest.raises(UserError, match="XSPEC_THREADS='many': a number of threads, at least 1"):
        choose_threads()


def test_never_more_threads_than_cores_the_process_may_use(monkeypatch):
    simulate(monkeypatch, [0, 1], 0.0)
    with pytest.raises(UserError, match="--threads 100000: this process may use 2 cores, so at most 2 threads"):
        choose_threads(100000)
    monkeypatch.setenv(threads.THREADS_VARIABLE, "3")
    with pytest.raises(UserError, match="XSPEC_THREADS=3: this process may use 2 cores"):
        choose_threads()


class _Machine:
    """Two cores whose busy ticks, this process's CPU seconds and a clock move on as `run` says."""

    def __init__(self) -> None:
        self.busy, self.idle, self.now, self.own = [0, 0], [0, 0], 0.0, 0.0
        self.applied: list[int] = []

    def stat(self) -> str:
        return "".join(f"cpu{i} {self.busy[i]} 0 0 {self.idle[i]} 0 0 0 0 0 0\n" for i in range(2))

    def run(self, seconds: float, own_cores: float, other_cores: float) -> None:
        """`seconds` pass (100 ticks each) with this process on `own_cores` and other work on `other_cores`."""
        used = own_cores + other_cores
        for i in range(2):
            share = min(1.0, max(0.0, used - i))
            self.busy[i] += round(100 * seconds * share)
            self.idle[i] += round(100 * seconds * (1 - share))
        self.now += seconds
        self.own += own_cores * seconds

    def watch(self, count: int) -> threads.ThreadWatch:
        """A watch over a run that started with `count` threads."""
        return threads.ThreadWatch(count, self.applied.append, [0, 1], self.stat, lambda: self.now, lambda: self.own)


def _updates(machine: _Machine, watch, count: int, seconds: float, own: float, other: float) -> list[str]:
    lines = []
    for _ in range(count):
        machine.run(seconds, own, other)
        if (line := watch.observe(seconds / 1000)) is not None:
            lines.append(line)
    return lines


def test_a_run_drops_a_thread_when_other_work_takes_a_core():
    machine = _Machine()
    watch = machine.watch(2)
    assert _updates(machine, watch, 8, 5.0, own=2.0, other=0.0) == []       # the first updates warm up
    assert _updates(machine, watch, 8, 0.5, own=2.0, other=0.0) == []       # quiet: the baseline
    lines = _updates(machine, watch, 8, 1.5, own=1.0, other=1.0)              # another process starts
    assert lines == ["threads: 2 -> 1 (2.0x the time per token; 0.8 of 2 cores busy with other work)"]
    assert machine.applied == [1]
    assert _updates(machine, watch, 16, 0.9, own=1.0, other=1.0) == []       # steady again: no more changes


def test_a_run_takes_a_core_back_within_a_minute_of_it_coming_free():
    """With one thread on a core of its own, the time per token hardly changes when the other core frees;
    the minute's look finds it."""
    machine = _Machine()
    watch = machine.watch(1)
    assert _updates(machine, watch, 16, 1.0, own=1.0, other=1.0) == []   # warm-up, then the baseline
    lines = _updates(machine, watch, 60, 1.0, own=1.0, other=0.0)
    assert lines == ["threads: 1 -> 2 (a minute on; 0.0 of 2 cores busy with other work)"]
    assert machine.applied == [2]
