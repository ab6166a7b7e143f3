"""Dropout's masks on a CPU drawn from uniform numbers rather than by torch's Bernoulli sampler.

`F.dropout` in training keeps each element with probability 1 - p and scales it by 1 / (1 - p). On a CPU
torch draws its mask with `bernoulli_`, which took 3.4 ms forward and backward for a [4096 x 128] float32
or bf16 activation on a 2-core AMD Zen 4, where the same mask drawn as `torch.rand(...) >= p` and two
products took 2.3-2.5 ms; the masks were 12% of a bf16 training step of a d_model 256 model
(docs/runtime.md). The trainer's passes on a CPU run under `UniformDropoutMasks`, a torch function mode that
computes `F.dropout` so: the same distribution from the same generator (each update seeds it, so a resumed
run draws the same masks), another draw than torch's sampler makes from it. Dropout out of training, with
p of 0 or 1, in place, or off the CPU is torch's own.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


class UniformDropoutMasks(TorchFunctionMode):
    """`F.dropout(x, p, training=True)` on a CPU as x * (U >= p) / (1 - p), U uniform in [0, 1) in float32."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.dropout or torch.compiler.is_compiling():
            return func(*args, **kwargs)
        x, p, training, inplace = _dropout_arguments(*args, **kwargs)
        if not training or inplace or not 0.0 < p < 1.0 or x.device.type != "cpu" or not x.is_floating_point():
            return func(*args, **kwargs)
        kept = torch.rand(x.shape, dtype=torch.float32, device=x.device) >= p
        return x * kept * (1.0 / (1.0 - p))


def uniform_dropout_masks(device: torch.device) -> ContextManager:
    """The context a training pass on `device` runs in: UniformDropoutMasks on a CPU, nothing elsewhere."""
    return UniformDropoutMasks() if device.type == "cpu" else nullcontext()


def _dropout_arguments(input: torch.Tensor, p: float = 0.5, training: bool = True,
                       inplace: bool = False) -> tuple[torch.Tensor, float, bool, bool]:
    """`F.dropout`'s arguments, however they were passed."""
    return input, p, training, inplace
