"""The bytes a decoding model's weights are kept in: fewer bytes read per decoded token.

Decoding one token reads every weight once and multiplies it by a few rows, so on a CPU its speed is
the memory's bandwidth over the weights' bytes (docs/runtime.md). "bf16" keeps each `nn.Linear`'s
weight in bf16 (half the bytes); "int8" keeps it as int8 with one float scale per output channel
(a quarter), multiplied by torch's weight-only int8 kernel where it applies. Activations, norms,
embeddings and the experts' stacked weights stay as they were; each layer returns its input's dtype.
Training never sees these modules: they are made at load, for decoding and scoring only.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from xspec.base.errors import UserError
from .precision import cpu_bf16_instructions

# torch's CPU int8 kernel reads its input in blocks of 16 features; other widths give wrong numbers or crash.
_INT8_KERNEL_BLOCK = 16
# Its time grows with the rows, about 19 us a row for a 512 x 1376 weight here, where dequantizing once
# and multiplying in bf16 costs ~530 us and 2.4 a row: past 32 rows (a prompt's prefill) that is faster.
_INT8_KERNEL_ROWS = 32


class Bf16Linear(nn.Module):
    """y = x W^T + b with W (and b) kept in bf16; x is multiplied in bf16, y returned in x's dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(torch.bfloat16),
                                                                  requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(torch.bfloat16), self.weight, self.bias).to(x.dtype)


class Int8Linear(nn.Module):
    """y = x (s * Q)^T + b, Q [out, in] int8 and s [out] one scale per output channel (symmetric:
    s = max |W_row| / 127), so each weight row keeps its own range."""

    quantized: torch.Tensor  # buffers, so that `.to(device)` moves them
    scale: torch.Tensor

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1) / 127
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # a row of zeros stays zeros
        self.register_buffer("quantized", (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(torch.bfloat16))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()  # [N, in]
        if rows.device.type == "cpu" and self.in_features % _INT8_KERNEL_BLOCK == 0 and len(rows) <= _INT8_KERNEL_ROWS:
            y = torch._weight_int8pack_mm(rows, self.quantized, self.scale)
        else:  # the weights dequantized for this product; the scale is each output column's
            y = (rows @ self.quantized.to(torch.bfloat16).t()) * self.scale
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(x.dtype)


FORMATS = {"bf16": Bf16Linear, "int8": Int8Linear}


def choose_weight_format(device: torch.device, requested: str, setting: str = "decode.weights") -> str:
    """The format decoding keeps weights in: "fp32", "bf16" or "int8", as `requested` by `setting`.
    "auto" is float32: bf16 and int8 change the logits (docs/runtime.md prints by how much), so they are
    asked for by name."""
    if requested in ("auto", "fp32"):
        return "fp32"
    if requested not in FORMATS:
        raise UserError(f"{setting} = {requested!r}: one of auto, fp32, bf16, int8")
    if device.type == "cpu" and cpu_bf16_instructions() is None:
        raise UserError(f"{setting} = \"{requested}\": this CPU has no bf16 matrix instructions, which {requested} "
                        "weights multiply with, so they would decode slower than float32; use \"fp32\"")
    return requested


def store_weights(model: nn.Module, weight_format: str) -> int:
    """Replaces every plain `nn.Linear` in `model` (subclasses such as a router keep their own forward)
    with the format's module, in place; the number replaced."""
    if weight_format == "fp32":
        return 0
    make = FORMATS[weight_format]
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, make(child))
                replaced += 1
    return replaced
