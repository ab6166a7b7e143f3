"""Symbolic tensor types: dimensions are integers or names such as `batch` and `src_len`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

Dim = Union[int, str]
DType = Literal["float", "long", "bool"]

# The symbolic dimensions of the model's inputs.
BATCH, SRC_LEN, TGT_LEN = "batch", "src_len", "tgt_len"


class ShapeError(Exception):
    """An op's inputs do not fit together; the message says how."""


@dataclass(frozen=True)
class TensorType:
    dims: tuple[Dim, ...]
    dtype: DType = "float"

    def __str__(self) -> str:
        text = "[" + ", ".join(str(d) for d in self.dims) + "]"
        return text if self.dtype == "float" else f"{self.dtype}{text}"

    @property
    def last(self) -> Dim:
        return self.dims[-1]

    def with_last(self, dim: Dim) -> "TensorType":
        return TensorType((*self.dims[:-1], dim), self.dtype)


def require(t: TensorType, what: str, dtype: DType = "float", min_rank: int = 1) -> TensorType:
    if t.dtype != dtype:
        raise ShapeError(f"{what} must be a {dtype} tensor, got {t}")
    if len(t.dims) < min_rank:
        raise ShapeError(f"{what} must have at least {min_rank} dimensions, got {t}")
    return t


def concrete_last(t: TensorType, what: str) -> int:
    """The feature size of `t`; layers need it to size their weights."""
    if not isinstance(t.last, int):
        raise ShapeError(f"the last dimension of {what} must be a number to size weights, got {t}")
    return t.last


def broadcast(a: TensorType, b: TensorType) -> TensorType:
    """NumPy broadcasting over symbolic dimensions: equal, or one side is 1 or missing."""
    if a.dtype != b.dtype:
        raise ShapeError(f"cannot combine {a} and {b}")
    dims: list[Dim] = []
    for i in range(1, max(len(a.dims), len(b.dims)) + 1):
        x = a.dims[-i] if i <= len(a.dims) else 1
        y = b.dims[-i] if i <= len(b.dims) else 1
        if x != y and x != 1 and y != 1:
            raise ShapeError(f"shapes {a} and {b} do not match")
        dims.insert(0, y if x == 1 else x)
    return TensorType(tuple(dims), a.dtype)
