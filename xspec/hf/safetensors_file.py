"""Safetensors files read as untrusted data and written tensor by tensor.

The header is checked before any tensor is touched: its length must fit the file, it must be a JSON
object of entries with a known dtype, a shape of non-negative sizes and byte offsets that match the
shape, lie inside the file and neither overlap nor leave gaps. A file that lies about any of this is
an error naming it. The tensors are then views of a private (copy-on-write) memory map of the file:
reading a checkpoint costs no second copy of it in memory, and nothing in it is ever unpickled.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

import torch

from xspec.base.errors import UserError
from xspec.base.files import open_regular_file
from xspec.base.strict_json import parse_json
from xspec.base.text import printable, shown

MAX_HEADER_BYTES = 100 << 20       # safetensors' own bound on the JSON header
METADATA = "__metadata__"
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
NAMES = {dtype: name for name, dtype in DTYPES.items()}


class SafetensorsFile:
    """One checked safetensors file: `shapes`, `dtypes`, `metadata`, and `tensor(name)`, a view of the map."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open_regular_file(path) as handle:
            size = handle.seek(0, 2)
            handle.seek(0)
            header, start = _read_header(handle, size, path)
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY) if size else None
        self.metadata: dict[str, str] = header.pop(METADATA, None) or {}
        if not isinstance(self.metadata, dict) or not all(isinstance(v, str) for v in self.metadata.values()):
            raise _lying(path, "__metadata__ is not a map of strings")
        self._entries = _checked_entries(header, start, size, path)

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name][1]

    def dtype(self, name: str) -> torch.dtype:
        return self._entries[name][0]

    def release(self, name: str) -> None:
        """Gives the pages of a tensor that has been used back to the system (they are read again from the
        file if touched): a checkpoint streamed through is never resident as a whole."""
        _, _, begin, end = self._entries[name]
        if self._map is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = begin - begin % mmap.PAGESIZE
        if end > start:
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)

    def tensor(self, name: str) -> torch.Tensor:
        dtype, shape, begin, end = self._entries[name]
        if begin == end:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(self._map, dtype=torch.uint8, count=end - begin, offset=begin)
        return flat.view(dtype).view(shape)


def _lying(path: Path, problem: str) -> UserError:
    problem = printable(problem)       # tensor names and values come from the file
    clipped = problem if len(problem) <= 300 else problem[:297] + "..."
    return UserError(f"{shown(path)}: not a valid safetensors file ({clipped})")


def _read_header(handle: BinaryIO, size: int, path: Path) -> tuple[dict, int]:
    if size < 8:
        raise _lying(path, f"{size} bytes, shorter than the 8-byte header length")
    (length,) = struct.unpack("<Q", handle.read(8))
    if length > MAX_HEADER_BYTES or 8 + length > size:
        raise _lying(path, f"its header claims {length:,} bytes; the file has {size - 8:,} after the length "
                           "(truncated, or not safetensors)")
    try:
        header = parse_json(handle.read(length), "header")    # strict: a tensor's key given twice is refused
    except UserError as error:
        raise _lying(path, f"its header is {str(error).removeprefix('header: ')}") from None
    if not isinstance(header, dict):
        raise _lying(path, "its header is not a JSON object")
    return header, 8 + length


def _checked_entries(header: dict, start: int, size: int, path: Path) -> dict:
    entries, spans = {}, []
    for name, entry in header.items():
        if not (isinstance(entry, dict) and set(entry) == {"dtype", "shape", "data_offsets"}):
            raise _lying(path, f"tensor {name}: an entry without exactly dtype, shape and data_offsets")
        dtype = DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
        if dtype is None:
            raise _lying(path, f"tensor {name}: dtype {entry['dtype']!r} is not one xspec reads "
                               f"({', '.join(DTYPES)})")
        shape, offsets = entry["shape"], entry["data_offsets"]
        if not (isinstance(shape, list) and all(type(n) is int and 0 <= n < 2**48 for n in shape)):
            raise _lying(path, f"tensor {name}: shape {shape!r} is not a list of sizes")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise _lying(path, f"tensor {name}: data_offsets {offsets!r} are not a byte range")
        needed = math.prod(shape) * dtype.itemsize
        if offsets[1] - offsets[0] != needed:
            raise _lying(path, f"tensor {name}: shape {shape} needs {needed:,} bytes, its offsets give "
                               f"{offsets[1] - offsets[0]:,}")
        if start + offsets[1] > size:
            raise _lying(path, f"tensor {name} ends at byte {start + offsets[1]:,}, past the end of the file "
                               f"({size:,} bytes): truncated")
        entries[name] = (dtype, tuple(shape), start + offsets[0], start + offsets[1])
        spans.append((offsets[0], offsets[1], name))
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            raise _lying(path, f"tensor {name} starts at {begin:,}, where {position:,} was expected "
                               "(overlapping or scattered data)")
        position = end
    if start + position != size:      # as safetensors requires: a header length that is off shows here
        raise _lying(path, f"its tensors end at byte {start + position:,}, but the file has {size:,} bytes")
    return entries


# --- writing -----------------------------------------------------------------------------------

def write_safetensors(handle: BinaryIO, layout: list[tuple[str, torch.dtype, tuple[int, ...]]],
                      tensors: Iterable[torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Writes a safetensors file one tensor at a time: the header from `layout` (name, dtype, shape of
    each tensor, in order), then each tensor of `tensors` as it comes (made on demand, so a model being
    converted is never held whole in memory)."""
    header: dict = {METADATA: dict(metadata)} if metadata else {}
    offset = 0
    for name, dtype, shape in layout:
        nbytes = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)           # tensor data aligned to 8 bytes, as safetensors does
    handle.write(struct.pack("<Q", len(encoded)))
    handle.write(encoded)
    for (name, dtype, shape), tensor in zip(layout, tensors, strict=True):
        assert tensor.dtype == dtype and tuple(tensor.shape) == tuple(shape), name
        for chunk in _byte_chunks(tensor):
            handle.write(chunk)


def _byte_chunks(tensor: torch.Tensor, chunk_bytes: int = 64 << 20) -> Iterator[memoryview]:
    """The tensor's bytes (little-endian, row-major) in pieces, so a strided tensor is copied a piece at a time."""
    flat = tensor.detach().to("cpu").reshape(-1)
    if flat.numel() == 0:
        return
    per_chunk = max(1, chunk_bytes // flat.element_size())
    for begin in range(0, flat.numel(), per_chunk):
        piece = flat[begin:begin + per_chunk].contiguous()
        yield piece.view(torch.uint8).numpy().data     # a memoryview of the array: no copy
