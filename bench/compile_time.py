"""How long `xspec.compile` takes, parse to summary, in one process (no torch import on this path).

    python bench/compile_time.py
"""

from __future__ import annotations

import statistics
import sys
import time

import xspec

SPECS = ("specs/tiny.xspec", "specs/base.xspec", "specs/big.xspec")


def main() -> None:
    for path in SPECS:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            spec = xspec.compile(path)
            spec.summary()
            times.append(time.perf_counter() - start)
        print(f"{path:22s} first {times[0] * 1000:6.0f} ms   median {statistics.median(times) * 1000:6.0f} ms   "
              f"({spec.graph.number_of_nodes()} ops, {spec.parameters:,} parameters)")
    print(f"torch imported: {'torch' in sys.modules}")


if __name__ == "__main__":
    main()
