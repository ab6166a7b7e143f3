"""`--compile auto|on|off`, for training and decoding alike: auto compiles on CUDA and not on a CPU.

Measured on the 2-core CPU (docs/runtime.md): a compiled training step ran at 0.80x eager; a compiled
decode step at 1.0x for beam 4 over 64 sentences and 1.28x for greedy decoding of one sentence, after
20-70 s of compiling, which a translation job rarely wins back. On CUDA, where launch overhead dominates
small steps, compiling is the default (not measured here: no GPU was at hand).
"""

from __future__ import annotations

import torch


def use_compile(choice: str, device: torch.device) -> bool:
    return choice == "on" or (choice == "auto" and device.type == "cuda")
