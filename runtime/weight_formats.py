"""The bytes a decoding model's weights are kept in: fewer bytes read per decoded token.

Decoding one token reads every weight once and multiplies it by a few rows, so on a CPU its speed is
the memory's bandwidth over the weights' bytes (docs/runtime.md). "bf16" keeps each `nn.Linear`'s
weight in bf16 (half the bytes); "int8" keeps it as int8 with one float scale per output channel
(a quarter), multiplied by torch's weight-only int8 kernel where it applies. Activations, norms,
embeddings and the experts' stacked weights stay as they were; each layer returns its input's dtype.
Training never sees these modules: they are made at load, for decoding and scoring only.

"auto" is bf16 on a CPU with bf16 matrix instructions when the linear layers' float32 weights are
larger than its last-level cache: then each token streams them from memory, and half the bytes was
1.42x float32's speed (an imported 120M Llama, 480 MB of weights, a 300 MB cache), where a 32M one
whose weights the cache holds decoded 9% slower in bf16 (docs/runtime.md). Elsewhere "auto" keeps the
weights as trained; int8, which changes the logits more, is asked for by name.

Kept in float32 on a CPU, each layer multiplies its rows the way measured fastest for their count
(Float32Linear): one or two rows in an order that shares the work among the CPU's threads, more through
oneDNN with the weight in its packed layout; the same weights, the same numbers to float32's rounding.
On a CPU, whatever the format, the weights are then copied onto huge pages where the kernel offers them
(runtime/huge_pages.py): fewer pages crossed as a step streams them.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path
from typing import Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from xspec.base.errors import UserError
from xspec.nn.contracts import ReadsWeightsAsMatrices
from .huge_pages import place_on_huge_pages
from .memory_plan import free_memory
from .precision import cpu_bf16_instructions

# torch's CPU int8 kernel reads its input in blocks of 16 features; other widths give wrong numbers or crash.
_INT8_KERNEL_BLOCK = 16
# Its time grows with the rows, about 19 us a row for a 512 x 1376 weight here, where dequantizing once
# and multiplying in bf16 costs ~530 us and 2.4 a row: past 32 rows (a prompt's prefill) that is faster.
_INT8_KERNEL_ROWS = 32
CPU_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")
# The most of the memory free at load that the weights' packed copies (PackedWeight) may take.
PACKED_SHARE = 0.25


class Bf16Linear(nn.Module):
    """y = x W^T + b with W (and b) kept in bf16; x is multiplied in bf16, y returned in x's dtype. On a CPU,
    without gradients, through oneDNN with W also in its packed layout (`PackedWeight`, where the loader
    allows the copy): the same numbers as F.linear's, which reorders W for oneDNN at every call; 1.3x its
    speed for 1 or 2 rows, 1.6x for 4 to 16, 1.07x for 256 (docs/runtime.md)."""

    def __init__(self, linear: nn.Linear, packed: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(torch.bfloat16),
                                                                  requires_grad=False)
        self.packed = PackedWeight() if packed and PackedWeight.available() else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The weight's own dtype: a model made float again (`.float()`) multiplies in float32.
        rows = x.to(self.weight.dtype)
        if self.packed is not None and self.weight.dtype == torch.bfloat16 \
                and packed_product_applies(rows, self.weight):
            return self.packed.product(rows, self.weight, self.bias).to(x.dtype)
        return F.linear(rows, self.weight, self.bias).to(x.dtype)


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
        dtype = self.scale.dtype        # bf16; float32 in a model made float again (`.float()`)
        rows = x.reshape(-1, self.in_features).to(dtype).contiguous()  # [N, in]
        if rows.device.type == "cpu" and dtype == torch.bfloat16 and self.in_features % _INT8_KERNEL_BLOCK == 0 \
                and len(rows) <= _INT8_KERNEL_ROWS:
            y = torch._weight_int8pack_mm(rows, self.quantized, self.scale)
        else:  # the weights dequantized for this product; the scale is each output column's
            y = (rows @ self.quantized.to(dtype).t()) * self.scale
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(x.dtype)


class Float32Linear(nn.Module):
    """y = x W^T + b as nn.Linear computes it, W kept in float32 as trained, multiplied on a CPU the way
    measured fastest for the rows at hand (a 2-core AMD Zen 4; the 57 weights of a 31.8M Llama, docs/runtime.md):
    - one row, on more than one thread: a batch of products, one block of W's rows per thread (torch's batched
      product gives each block its own thread; a matrix times one vector runs on one): 2.5x nn.Linear's speed;
    - two to WEIGHT_FIRST_ROWS rows, on more than one thread: (W x^T)^T, which shares W's rows among the
      threads where torch's x W^T of so few rows runs on one: 2-3.8x;
    - any other rows, without gradients: oneDNN's product, W in oneDNN's packed layout (`PackedWeight`, where
      the loader allows the copy): 2x at 16 rows, 1.5x at 64, 1.15-1.25x at 256 to 4,096 (1.2-2x on one thread);
      without a packed weight, weight first up to FEW_ROWS rows;
    - else (gradients, autocast, another dtype or device, a torch.compile or torch.export trace): nn.Linear's.
    The same numbers to float32's rounding. The layer's own weight and bias, not copies: names and state dict
    are nn.Linear's."""

    # Weight first took 0.95x the packed product's time in whole greedy steps of 3 and 4 rows (weights on huge
    # pages, the packed copies not), and 1.26-1.28x at 6 and 8.
    WEIGHT_FIRST_ROWS = 4
    FEW_ROWS = 16       # weight first, without a packed weight: 1.1-2x nn.Linear's speed from 3 to 16 rows

    def __init__(self, linear: nn.Linear, packed: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed = PackedWeight() if packed and PackedWeight.available() else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        product = self.product_for(x)
        if product == "linear":
            return F.linear(x, self.weight, self.bias)
        if product == "packed":
            assert self.packed is not None
            return self.packed.product(x, self.weight, self.bias)
        rows = x.reshape(-1, self.in_features)
        if product == "blocks":  # [blocks, out / blocks, in] x [in, 1], each block a thread's
            blocks = torch.get_num_threads()
            weight = self.weight.view(blocks, -1, self.in_features)
            column = rows.t().expand(blocks, -1, -1)
            y = torch.bmm(weight, column) if self.bias is None else \
                torch.baddbmm(self.bias.view(blocks, -1, 1), weight, column)
            y = y.view(self.out_features, 1).t()
        else:               # weight first: (W x^T)^T
            columns = rows.t()
            y = self.weight @ columns if self.bias is None else torch.addmm(self.bias[:, None], self.weight, columns)
            y = y.t()
        return y.contiguous().reshape(*x.shape[:-1], self.out_features)

    def product_for(self, x: torch.Tensor) -> str:
        """How `x` is multiplied: "blocks", "weight first", "packed" or "linear" (the class docstring)."""
        if torch.compiler.is_compiling() or torch.compiler.is_exporting() or x.device.type != "cpu" \
                or not x.dtype == self.weight.dtype == torch.float32 or torch.is_autocast_enabled("cpu"):
            return "linear"
        rows, threads = x.numel() // self.in_features, torch.get_num_threads()
        if rows == 1 and threads > 1 and self.out_features % threads == 0:
            return "blocks"
        packed = self.packed is not None and packed_product_applies(x, self.weight)
        if threads > 1 and 2 <= rows <= (self.WEIGHT_FIRST_ROWS if packed else self.FEW_ROWS):
            return "weight first"
        return "packed" if packed else "linear"


class PackedWeight:
    """A weight in oneDNN's packed layout for its product with rows (torch.ops.mkldnn), made at its first
    product and made again whenever the weight has changed since (moved, replaced or written in place). An
    opaque tensor, neither saved nor copied: a copied model packs its own."""

    # The rows oneDNN is told to expect; 4 and 64 packed alike for 2 to 4,096 rows here.
    ROWS_HINT = 64

    def __init__(self) -> None:
        self.tensor: Optional[torch.Tensor] = None
        self.made_from: tuple[int, int] = (0, -1)   # the weight's data pointer and version

    @staticmethod
    def available() -> bool:
        """Where torch has oneDNN and the CPU is x86, where it was measured (docs/runtime.md)."""
        return torch.backends.mkldnn.is_available() and platform.machine().lower() in ("x86_64", "amd64")

    def product(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """x W^T + b, W multiplied in its packed layout."""
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.size(-1)), self.of(weight), bias, "none", [], "")
        return y.reshape(*x.shape[:-1], y.size(-1))

    def of(self, weight: torch.Tensor) -> torch.Tensor:
        made_from = (weight.data_ptr(), weight._version)
        if self.tensor is None or made_from != self.made_from:
            self.tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), self.ROWS_HINT)
            self.made_from = made_from
        return self.tensor

    def __deepcopy__(self, memo: dict) -> PackedWeight:
        return PackedWeight()

    def __getstate__(self) -> dict:
        return {"tensor": None, "made_from": (0, -1)}


def packed_product_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `x` may be multiplied by `weight`'s packed layout: on a CPU, where nothing needs a gradient (the
    product has none), outside a torch.compile or torch.export trace, and rows there are."""
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    return x.device.type == "cpu" and not needs_grad and x.numel() > 0 and not torch.compiler.is_compiling() \
        and not torch.compiler.is_exporting()


FORMATS = {"bf16": Bf16Linear, "int8": Int8Linear}


def weight_format_notice(chosen: str, requested: str, setting: str, linear_bytes: int) -> Optional[str]:
    """The line a decoding says on stderr when it keeps weights below float32: which, why, and the flag that
    keeps them as trained (None: float32)."""
    if chosen == "fp32":
        return None
    if requested == "auto":
        cache = last_level_cache_bytes() or 0
        why = (f"{setting} = \"auto\": the CPU has {cpu_bf16_instructions()}, and the linear layers' "
               f"{linear_bytes / 2**20:,.0f} MiB of float32 weights outgrow its {cache / 2**20:,.0f} MiB cache")
    else:
        why = f"{setting} = \"{requested}\""
    return (f"xspec: decoding with {chosen} weights ({why}); logits differ slightly from float32's: "
            "--weights fp32 keeps them as trained")


def choose_weight_format(device: torch.device, requested: str, setting: str = "decode.weights",
                         linear_bytes: int = 0) -> str:
    """The format decoding keeps weights in: "fp32", "bf16" or "int8", as `requested` by `setting`, for a
    model whose plain linear layers hold `linear_bytes` of float32 weights ("auto": the module docstring)."""
    if requested == "auto":
        cache = last_level_cache_bytes()
        streamed = device.type == "cpu" and cache is not None and linear_bytes > cache
        return "bf16" if streamed and cpu_bf16_instructions() is not None else "fp32"
    if requested == "fp32":
        return "fp32"
    if requested not in FORMATS:
        raise UserError(f"{setting} = {requested!r}: one of auto, fp32, bf16, int8")
    if device.type == "cpu" and cpu_bf16_instructions() is None:
        raise UserError(f"{setting} = \"{requested}\": this CPU has no bf16 matrix instructions, which {requested} "
                        "weights multiply with, so they would decode slower than float32; use \"fp32\"")
    return requested


def replaceable_linears(model: nn.Module) -> Iterator[tuple[nn.Module, str, nn.Linear]]:
    """(parent, name, layer) of every plain `nn.Linear` of `model` a weight format may replace: not a
    subclass (a router keeps its own forward), nor a layer whose parent reads its weight as a matrix
    (named in the parent's `weights_read`, as latent attention's up-projection)."""
    for parent in list(model.modules()):
        kept = parent.weights_read if isinstance(parent, ReadsWeightsAsMatrices) else ()
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and name not in kept:
                yield parent, name, child


def linear_weight_bytes(model: nn.Module) -> int:
    """The bytes of the weights (and biases) of the linear layers store_weights replaces."""
    return sum(p.numel() * p.element_size() for _, _, layer in replaceable_linears(model)
               for p in layer.parameters(recurse=False))


@functools.cache
def last_level_cache_bytes() -> Optional[int]:
    """The size of the CPU's largest cache, as Linux reports it (sysfs: `307200K`); None where it does not."""
    sizes = []
    for index in CPU_CACHES.glob("index*"):
        try:
            size = (index / "size").read_text(encoding="ascii").strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        digits = size[:-1] if scale != 1 else size
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=None)


def store_weights(model: nn.Module, weight_format: str, device: torch.device) -> int:
    """Replaces the replaceable linear layers of `model` (replaceable_linears) on `device` with the format's
    module, in place (float32's on a CPU: Float32Linear; it and bf16's keep a packed copy of the weight for
    oneDNN too, made when first multiplied so, where the copies take at most PACKED_SHARE of the memory free
    now), and on a CPU moves the weights onto huge pages (runtime/huge_pages.py); the number of layers
    replaced."""
    if weight_format == "fp32" and device.type != "cpu":
        return 0
    layers = list(replaceable_linears(model))
    if weight_format == "int8":
        for parent, name, layer in layers:
            setattr(parent, name, Int8Linear(layer))
    else:
        make = Float32Linear if weight_format == "fp32" else Bf16Linear
        packed_bytes = linear_weight_bytes(model) // (1 if weight_format == "fp32" else 2)
        packed = device.type == "cpu" and packed_bytes <= PACKED_SHARE * free_memory(device).bytes
        for parent, name, layer in layers:
            setattr(parent, name, make(layer, packed))
    if device.type == "cpu":
        place_on_huge_pages(model)      # each decoded token streams the weights from memory
    return len(layers)
