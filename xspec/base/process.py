"""How an `xspec` process that computes runs: its CPU threads and its memory allocator.

Commands that compute (training, decoding, scoring, exporting) take `--threads N` and, on a CPU,
use tcmalloc where it is installed: glibc's malloc returns and re-requests the memory of every
step's tensors, and a training step ran 1.7x (quiet machine) to ~8x (loaded machine) slower with it
here. An allocator must be chosen before the process starts, so the command re-executes itself once
with tcmalloc in LD_PRELOAD (`--no-tcmalloc` keeps glibc's). Only the program itself does this, never
`xspec.cli.main([...])` called from Python.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

# Where Debian/Ubuntu (libtcmalloc-minimal4, libgoogle-perftools4) and Fedora (gperftools-libs) put it.
TCMALLOC_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
    "/usr/lib64/libtcmalloc_minimal.so.4",
    "/usr/lib/libtcmalloc_minimal.so.4",
)
_REEXECUTED = "XSPEC_TCMALLOC_REEXEC"    # set in the re-executed process: never a second time


def find_tcmalloc() -> Optional[str]:
    return next((path for path in TCMALLOC_PATHS if Path(path).is_file()), None)


def uses_tcmalloc() -> bool:
    return "tcmalloc" in os.environ.get("LD_PRELOAD", "")


def _probably_cpu(device: Optional[str]) -> bool:
    """Whether the command will compute on a CPU, decided without importing torch: an explicit --device,
    or (by default, CUDA when available) no NVIDIA driver on this machine."""
    if device is not None:
        return device == "cpu"
    return not Path("/proc/driver/nvidia/version").exists()


def reexec_with_tcmalloc(args: argparse.Namespace) -> None:
    """Replaces this process by the same command with tcmalloc preloaded, when that applies; returns
    otherwise. The command line is re-run as given (`sys.orig_argv`), its stdin and stdout inherited."""
    if not getattr(args, "tcmalloc", False) or uses_tcmalloc() or os.environ.get(_REEXECUTED) \
            or not sys.platform.startswith("linux") or not _probably_cpu(getattr(args, "device", None)):
        return
    library = find_tcmalloc()
    if library is None:
        return
    preload = os.environ.get("LD_PRELOAD")
    env = {**os.environ, "LD_PRELOAD": f"{library}:{preload}" if preload else library, _REEXECUTED: "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)


def apply_threads(args: argparse.Namespace) -> None:
    threads = getattr(args, "threads", None)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
