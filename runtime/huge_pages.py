"""A decoding model's weights in memory the kernel may back with huge pages.

A decoding step on a CPU reads every weight once, streaming them from memory. With 4 KiB pages that
walk crosses a page, and often misses the TLB, every 4 KiB; with Linux's transparent huge pages, every
2 MiB. torch's CPU allocator asks for huge pages only when its environment says so
(THP_MEM_ALLOC_ENABLE=1, read once, before a model is loaded), so a model loaded for decoding has its
weights copied into one anonymous private mapping advised MADV_HUGEPAGE, each tensor keeping its values,
dtype, shape and identity (`.data` is set, so tied parameters stay one). An imported 31.8M Llama's
greedy step was 1.07x faster so, the product of its weights alone 1.16x (2-core AMD Zen 4, 2026-11-30;
docs/runtime.md).

Where the kernel has no transparent huge pages (not Linux, or `never` in
/sys/kernel/mm/transparent_hugepage/enabled) nothing is moved. Training never sees it: only loading for
decoding (runtime/weight_formats.py's store_weights) places weights so.
"""

from __future__ import annotations

import mmap
import sys
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn

HUGE_PAGE = 2 << 20
SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# Below this, the weights' pages fit the TLB's reach anyway: not worth a copy.
LEAST_BYTES = 16 << 20
# Each tensor starts on a 64-byte line, as torch's own allocator aligns them.
ALIGNMENT = 64


def huge_pages_offered() -> bool:
    """Whether the kernel backs a mapping advised MADV_HUGEPAGE with huge pages: its setting, `always
    [madvise] never`, names the chosen mode in brackets."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        text = SETTING.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return False
    return "[always]" in text or "[madvise]" in text


def _aligned(size: int) -> int:
    return -(-size // ALIGNMENT) * ALIGNMENT


def _movable(model: nn.Module) -> list[torch.Tensor]:
    """The CPU parameters and buffers of `model`, each once, that own their storage whole: a tensor
    sharing its storage with another (a view of a fused matrix) keeps it, so that they stay one."""
    tensors: dict[int, torch.Tensor] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.device.type == "cpu" and id(tensor) not in tensors:
            tensors[id(tensor)] = tensor
    owners: dict[int, int] = {}
    for tensor in tensors.values():
        key = tensor.untyped_storage().data_ptr()
        owners[key] = owners.get(key, 0) + 1
    return [t for t in tensors.values() if owners[t.untyped_storage().data_ptr()] == 1
            and t.is_contiguous() and t.storage_offset() == 0
            and t.untyped_storage().nbytes() == t.numel() * t.element_size() and t.numel() > 0]


def place_on_huge_pages(model: nn.Module) -> Optional[mmap.mmap]:
    """Copies `model`'s weights (its CPU parameters and buffers) into one mapping advised MADV_HUGEPAGE,
    in place; returns the mapping (which each moved tensor keeps alive), or None where the kernel offers
    no huge pages or the weights are too few to gain from them."""
    if not huge_pages_offered():
        return None
    tensors = _movable(model)
    total = sum(_aligned(t.numel() * t.element_size()) for t in tensors)
    if total < LEAST_BYTES:
        return None
    try:
        arena = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        arena.madvise(mmap.MADV_HUGEPAGE)   # before the first touch: the pages are made huge as they fault in
    except OSError:     # no such mapping here (a memory limit): the weights stay where they are
        return None
    memory = torch.frombuffer(arena, dtype=torch.uint8)
    offset = -memory.data_ptr() % HUGE_PAGE
    with torch.no_grad():
        for tensor in tensors:
            size = tensor.numel() * tensor.element_size()
            placed = memory[offset:offset + size].view(tensor.dtype).view(tensor.shape)
            placed.copy_(tensor)
            tensor.data = placed
            offset += _aligned(size)
    return arena
