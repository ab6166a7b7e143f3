"""How a device computes: one place for autocast and loss scaling, for training and decoding alike.

On CPUs everything is float32. On GPUs, "auto" is bf16 autocast where the GPU supports bf16 (Ampere and
later), else fp16 autocast with a `torch.amp.GradScaler` (fp16 gradients underflow without one); the
spec's `train.precision` can ask for one of them, or float32.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import ContextManager, Optional

import torch

from xspec.base.errors import UserError


@dataclass(frozen=True)
class Precision:
    device_type: str
    dtype: Optional[torch.dtype]  # the autocast dtype; None: full precision

    @property
    def name(self) -> str:
        return {torch.bfloat16: "bf16", torch.float16: "fp16", None: "fp32"}[self.dtype]

    def autocast(self) -> ContextManager:
        return torch.autocast(self.device_type, dtype=self.dtype) if self.dtype is not None else nullcontext()

    def grad_scaler(self) -> Optional[torch.amp.GradScaler]:
        """fp16 needs its loss scaled so small gradients do not underflow; bf16 and float32 do not."""
        return torch.amp.GradScaler(self.device_type) if self.dtype == torch.float16 else None


def choose_precision(device: torch.device, requested: str = "auto") -> Precision:
    if device.type != "cuda":
        if requested in ("bf16", "fp16"):
            raise UserError(f"train.precision = \"{requested}\" needs a GPU; this run is on {device}")
        return Precision(device.type, None)
    if requested == "fp32":
        return Precision("cuda", None)
    bf16 = torch.cuda.is_bf16_supported()
    if requested == "bf16" and not bf16:
        raise UserError(f"train.precision = \"bf16\": {torch.cuda.get_device_name(device)} does not support "
                        "bf16; use \"fp16\" or \"auto\"")
    if requested == "bf16" or (requested == "auto" and bf16):
        return Precision("cuda", torch.bfloat16)
    return Precision("cuda", torch.float16)
