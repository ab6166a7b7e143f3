"""`--compile auto|on|off`, for training and decoding alike: auto compiles on CUDA and not on a CPU; and where
the compiled code is kept between runs.

Measured on the 2-core CPU (docs/runtime.md): a compiled training step ran at 0.80x eager; a compiled
decode step at 1.0x for beam 4 over 64 sentences and 1.28x for greedy decoding of one sentence, after
20-70 s of compiling, which a translation job rarely wins back. On CUDA, where launch overhead dominates
small steps, compiling is the default (not measured here: no GPU was at hand).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

# What torch's inductor reads for the folder of its caches (FX graphs, kernels, AOTAutograd's).
CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


def use_compile(choice: str, device: torch.device) -> bool:
    return choice == "on" or (choice == "auto" and device.type == "cuda")


def compiled(target: Any, **options: Any) -> Any:
    """torch.compile of `target`, its code kept where a later run finds it (`keep_compiled_code`)."""
    keep_compiled_code()
    return torch.compile(target, **options)


def keep_compiled_code() -> Path | None:
    """The folder torch.compile keeps its code in: the user's choice (TORCHINDUCTOR_CACHE_DIR) where made,
    else xspec's folder of the user's cache ($XDG_CACHE_HOME, or ~/.cache), which outlives a restart where
    torch's own, under the temporary directory, may not. None where no such folder can be made (torch's
    then)."""
    chosen = os.environ.get(CACHE_VARIABLE)
    if chosen:
        return Path(chosen)
    given, home = os.environ.get("XDG_CACHE_HOME", ""), os.path.expanduser("~")
    base = given if os.path.isabs(given) else os.path.join(home, ".cache")    # a relative one is ignored
    if not os.path.isabs(base):     # no home
        return None
    folder = Path(base) / "xspec" / "torch-compile"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)   # compiled code is run: the user's alone
    except OSError:
        return None
    os.environ[CACHE_VARIABLE] = str(folder)
    return folder
