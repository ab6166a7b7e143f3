"""Training speed of two installs of xspec (e.g. before and after a change), runs interleaved.

Each round trains the tiny spec on the built-in demo task for a fixed number of steps with each
interpreter in turn, and reads the target tokens per second from the run's metrics.json; machines like
this one drift by 20-30% over minutes, so only ratios from interleaved runs mean anything.

    git worktree add /tmp/before REV && python3 -m venv /tmp/before-venv \\
        && /tmp/before-venv/bin/pip install torch==2.13.0 && /tmp/before-venv/bin/pip install -e /tmp/before
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 \\
        python bench/compare_versions.py /tmp/before-venv/bin/python .venv/bin/python --steps 100 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def train_once(python: str, steps: int, out: Path) -> float:
    # Absolute, not resolved: a venv's python is a symlink whose target would lose the venv.
    command = [os.path.abspath(python), "-m", "xspec", "train", str(ROOT / "specs" / "tiny.xspec"), "--out", str(out),
               "--set", f"train.max_steps={steps}", "--set", "train.max_minutes=1000",
               "--set", f"train.validate_every_steps={steps}", "--no-test", "--no-progress", "--device", "cpu"]
    # Run outside the checkout, so each interpreter imports its own install of xspec.
    subprocess.run(command, check=True, capture_output=True, text=True, cwd=out.parent)
    return json.loads((out / "metrics.json").read_text())["train_tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", help="the python of the install to compare against")
    parser.add_argument("after", help="the python of the install being measured")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    speeds: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for name in ("before", "after"):
                speed = train_once(getattr(args, name), args.steps, Path(tmp) / f"{name}-{round_}")
                speeds[name].append(speed)
                print(f"round {round_ + 1} {name:6} {speed:8,.0f} target tokens/s")
    before, after = statistics.median(speeds["before"]), statistics.median(speeds["after"])
    print(f"median: before {before:,.0f}, after {after:,.0f} target tokens/s; after / before = {after / before:.2f}")


if __name__ == "__main__":
    main()
