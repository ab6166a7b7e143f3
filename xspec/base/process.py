"""How an `xspec` process that computes runs: its CPU threads and its memory allocator.

Commands that compute (training, decoding, scoring, exporting) take `--threads N` (default: the cores
free when they start, xspec/base/threads.py) and, on a CPU,
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

from xspec.base.threads import ThreadChoice, choose_threads

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


def apply_threads(args: argparse.Namespace) -> Optional[ThreadChoice]:
    """The CPU threads of a command that computes (xspec/base/threads.py): --threads, XSPEC_THREADS, else the
    cores free now; torch's own choice on a GPU, and for each of several processes (torchrun), unless
    --threads says. The choice is kept in `args.thread_choice` for the run's log."""
    if not hasattr(args, "threads"):
        return None
    import torch

    on_gpu = getattr(args, "device", None) != "cpu" and torch.cuda.is_available()
    world = os.environ.get("WORLD_SIZE", "").strip()
    several = world.isdigit() and int(world) > 1  # torchrun's; anything else is one process
    choice = None if args.threads is None and (on_gpu or several) else choose_threads(args.threads)
    if choice is not None:
        torch.set_num_threads(choice.threads)
    args.thread_choice = choice
    return choice
