"""How long a fresh `xspec` process takes: `--help`, and `compile` of the base model (parse, validate,
print the summary, write the model), against a bare Python start for reference.

    python bench/startup.py [--runs 7]

Each command runs as a new process, once to warm the file cache and then --runs times; the wall time
of the whole process is reported (median and minimum). It prints figures and checks nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def xspec_command() -> list[str]:
    """The `xspec` script installed beside this Python (what a user runs), else `python -m xspec`."""
    script = shutil.which("xspec", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "xspec"]


def wall_times(command: list[str], runs: int) -> list[float]:
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs per command (default 7)")
    runs = parser.parse_args().runs
    xspec = xspec_command()
    with tempfile.TemporaryDirectory() as out:
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "xspec --help": [*xspec, "--help"],
            "xspec compile specs/base.xspec -o TMP": [*xspec, "compile", "specs/base.xspec", "-o", out],
        }
        print(f"wall time of a fresh process, {runs} runs each ({' '.join(xspec)})")
        for label, command in commands.items():
            times = wall_times(command, runs)
            print(f"  {label:40s} median {statistics.median(times):6.3f} s   min {min(times):6.3f} s")


if __name__ == "__main__":
    main()
