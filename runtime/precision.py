"""How a device computes: one place for autocast and loss scaling, for training and decoding alike.

On GPUs, "auto" is bf16 autocast where the GPU supports bf16 (Ampere and later), else fp16 autocast with a
`torch.amp.GradScaler` (fp16 gradients underflow without one). On CPUs, bf16 autocast needs bf16 matrix
instructions, as the kernel reports them (x86's AMX or AVX-512 BF16, Arm's BF16 extension). On such a CPU it
ran a fixed-shape training step 1.6-2.1x faster, but the trainer's batches of a translation model, of
varying shapes, 1.9x slower on a Xeon with AMX and at most 5% faster on an AMD Zen 4 (docs/runtime.md). On
the Zen 4 (AVX-512 BF16, no AMX) the slow part was torch's bf16 attention kernel, 1.3-1.6x float32's time
forward and backward: with attention computed in float32 (Float32Attention) the same batches trained 1.3x
faster than in float32. So "auto" trains in bf16 where every batch is one shape (a language model's blocks:
on the Zen 4, 1.16x float32's speed for specs/lm.xspec's demo, and fine-tuning an imported 30M Llama 1.8x
transformers' float32 step, against 1.1x in float32) and on CPUs with AVX-512 BF16 and no AMX, attention
in float32 there; in float32 otherwise; and decodes in float32 (greedy text would change wherever a near-tie
flips). A spec's `train.precision` and `decode.precision` choose. Under autocast the weights, the optimizer's
state, the loss and the norms' statistics stay float32.

On GPUs the context also keeps torch's attention off cuDNN's kernel: cuDNN builds an execution plan for
every new sequence length, which took ~10 ms of the host's time per call and made the paper's base model
train 5.7x slower on an H100 (35,500 against 202,000 target tokens/s, docs/runtime.md); FlashAttention
and the memory-efficient kernel take any length as it comes.
"""

from __future__ import annotations

import functools
import platform
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import ContextManager, Iterator, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from xspec.base.errors import UserError

# The CPU flags (/proc/cpuinfo) of instructions that multiply bf16 matrices at several times the float32
# rate: x86's AMX tiles and AVX-512 BF16 dot products, Arm's BF16 extension.
BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")
CPU_INFO = Path("/proc/cpuinfo")
# The bf16 flag of CPUs whose bf16 attention kernel is slower than float32's (AVX-512 BF16 without AMX's tiles:
# measured on an AMD Zen 4); under bf16 autocast their attention computes in float32 (Float32Attention).
FLOAT32_ATTENTION_FLAG = "avx512_bf16"
# Attention kernels a GPU may use: all but cuDNN's, which plans again for every shape (module docstring).
GPU_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass(frozen=True)
class Precision:
    device_type: str
    dtype: Optional[torch.dtype]  # the autocast dtype; None: full precision
    reason: str = ""  # why it was chosen, for the run's log
    float32_attention: bool = False  # torch's attention kernel in float32 under the autocast (Float32Attention)

    @property
    def name(self) -> str:
        return {torch.bfloat16: "bf16", torch.float16: "fp16", None: "fp32"}[self.dtype]

    def describe(self) -> str:
        return f"{self.name} ({self.reason})" if self.reason else self.name

    @contextmanager
    def context(self) -> Iterator[None]:
        """Where the model computes: autocast to `dtype`, and on a GPU the attention kernels of GPU_ATTENTION."""
        with ExitStack() as stack:
            if self.device_type == "cuda":
                stack.enter_context(sdpa_kernel(GPU_ATTENTION))
            if self.dtype is not None:
                stack.enter_context(torch.autocast(self.device_type, dtype=self.dtype))
            stack.enter_context(self.modes())
            yield

    def modes(self) -> ContextManager:
        """The torch function modes of `context()` (Float32Attention where set): what a recomputed forward
        (activation checkpointing) enters again, since torch restores the autocast there but not these."""
        return Float32Attention() if self.float32_attention and self.dtype is not None else nullcontext()

    def grad_scaler(self) -> Optional[torch.amp.GradScaler]:
        """fp16 needs its loss scaled so small gradients do not underflow; bf16 and float32 do not."""
        return torch.amp.GradScaler(self.device_type) if self.dtype == torch.float16 else None


class Float32Attention(TorchFunctionMode):
    """torch's attention (`F.scaled_dot_product_attention`) computed in float32 under a CPU's bf16 autocast,
    its output given back in bf16 as the autocast would give it: on a CPU with AVX-512 BF16 and no AMX, torch's
    bf16 attention kernel took 1.3-1.6x float32's time forward and backward over a training pass's shapes, and
    4.7x for a decoding step's one query a row (docs/runtime.md). Other functions, and attention where the
    CPU's autocast is off, pass through unchanged."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention or torch.compiler.is_compiling() \
                or not torch.is_autocast_enabled("cpu"):
            return func(*args, **kwargs)
        widened = [_float32(a) for a in args]
        with torch.autocast("cpu", enabled=False):
            out = func(*widened, **{key: _float32(value) for key, value in kwargs.items()})
        return out.to(torch.get_autocast_dtype("cpu"))


def _float32(value):
    """A floating-point tensor in float32 (queries, keys, values, an additive mask); anything else as it is."""
    return value.float() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


@functools.cache
def cpu_bf16_instructions() -> Optional[str]:
    """The CPU's bf16 matrix instructions by their flag (`amx_bf16`), from what the kernel reports; None
    where it reports none, or nothing can be read (another operating system: float32 is then the safe
    choice)."""
    if platform.system() != "Linux":
        return None
    try:
        return bf16_flag(CPU_INFO.read_text(encoding="ascii", errors="replace"))
    except OSError:
        return None


def bf16_flag(cpu_info: str) -> Optional[str]:
    """The first of BF16_FLAGS that /proc/cpuinfo's text lists among a processor's flags or features."""
    for line in cpu_info.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags = set(value.split())
            return next((flag for flag in BF16_FLAGS if flag in flags), None)
    return None


def choose_precision(device: torch.device, requested: str = "auto", setting: str = "train.precision",
                     one_shape: str | None = None, training: bool = False) -> Precision:
    """The precision a run on `device` computes in, as `requested` ("auto", "bf16", "fp16", "fp32") by the
    spec's `setting`. `one_shape`: what makes every batch of a training run one shape (its blocks), where
    they are; `training`: the run trains (else it decodes or scores)."""
    if requested == "fp32":
        return Precision(device.type, None, f"{setting} = \"fp32\"")
    if device.type == "cuda":
        return _gpu_precision(device, requested, setting)
    if requested == "fp16":
        raise UserError(f"{setting} = \"fp16\" needs a GPU; this run is on {device} (use \"bf16\", \"auto\" or "
                        "\"fp32\")")
    flag = cpu_bf16_instructions() if device.type == "cpu" else None
    if requested == "bf16" and flag is None:
        raise UserError(f"{setting} = \"bf16\": this {device.type} has no bf16 matrix instructions (none of "
                        f"{', '.join(BF16_FLAGS)}), so bf16 would be slower than float32; use "
                        "\"auto\" or \"fp32\"")
    float32_attention = flag == FLOAT32_ATTENTION_FLAG
    if requested == "bf16":
        return Precision(device.type, torch.bfloat16, f"{setting} = \"bf16\"; the CPU has {flag}", float32_attention)
    if flag is not None and one_shape is not None:
        return Precision(device.type, torch.bfloat16, f"{setting} = \"auto\"; the CPU has {flag} and every "
                                                      f"batch is one shape ({one_shape}), where bf16 autocast "
                                                      "trained 1.2-1.8x faster than float32; \"fp32\" for float32",
                         float32_attention)
    if float32_attention and training:
        return Precision(device.type, torch.bfloat16, f"{setting} = \"auto\"; the CPU has {flag}, where bf16 "
                                                      "autocast with attention in float32 trained 1.3x faster than "
                                                      "float32; \"fp32\" for float32", True)
    if flag is not None and training:
        return Precision(device.type, None, f"{setting} = \"auto\"; the CPU has {flag}, but bf16 autocast trained "
                                            "batches of varying shapes slower where measured, its memory growing "
                                            "with each shape; \"bf16\" to use it")
    if flag is not None:
        return Precision(device.type, None, f"{setting} = \"auto\"; the CPU has {flag}, but a near-tie of bf16's "
                                            "rounding would change decoded text; \"bf16\" to use it")
    return Precision(device.type, None, f"{setting} = \"auto\" on a {device.type}")


def _gpu_precision(device: torch.device, requested: str, setting: str) -> Precision:
    bf16 = torch.cuda.is_bf16_supported()
    name = torch.cuda.get_device_name(device)
    if requested == "bf16" and not bf16:
        raise UserError(f"{setting} = \"bf16\": {name} does not support bf16; use \"fp16\" or \"auto\"")
    if requested == "bf16" or (requested == "auto" and bf16):
        return Precision("cuda", torch.bfloat16, f"{setting} = \"{requested}\"; {name} supports bf16")
    reason = f"{setting} = \"fp16\"" if requested == "fp16" else f"{setting} = \"auto\"; {name} has no bf16"
    return Precision("cuda", torch.float16, reason)
