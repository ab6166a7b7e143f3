"""Processes and devices: one process, or `torchrun` with DistributedDataParallel (NCCL on GPUs, gloo on CPU)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from xspec.base.errors import UserError


@dataclass(frozen=True)
class Context:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Only rank 0 writes files and prints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def pick_device(requested: str | None, local_rank: int = 0) -> torch.device:
    """CUDA when there is one (each torchrun process on its own GPU), else CPU; `--device` overrides."""
    if requested:
        try:
            device = torch.device(requested)
        except RuntimeError as error:
            raise UserError(f"--device {requested}: {error}") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"--device {requested}: CUDA is not available on this machine")
        return device
    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")


DEFAULT_TIMEOUT_MINUTES = 60.0


def _process_count(variable: str, default: str | None, least: int) -> int:
    """A whole number torchrun sets in the environment, checked: a message, not a traceback."""
    value = os.environ.get(variable, default)
    if value is None or not value.strip().isdigit() or int(value) < least:
        raise UserError(f"{variable}={value!r}: torchrun sets it to a whole number of at least {least}; run under "
                        "torchrun, or unset WORLD_SIZE for one process")
    return int(value)


def setup(requested_device: str | None, timeout_minutes: float = DEFAULT_TIMEOUT_MINUTES) -> Context:
    """Joins the process group when started by torchrun (it sets WORLD_SIZE, RANK, LOCAL_RANK).

    `timeout_minutes` bounds every collective, including the first ones, where the other ranks wait
    while rank 0 prepares the run (the vocabulary of a large corpus can take a while): NCCL's default
    of 10 minutes would end such runs."""
    world_size = _process_count("WORLD_SIZE", "1", 1)
    if world_size == 1:
        return Context(0, 1, pick_device(requested_device))
    local_rank = _process_count("LOCAL_RANK", None, 0)
    device = pick_device(requested_device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(minutes=timeout_minutes))
    return Context(dist.get_rank(), world_size, device)


# Whether this process has been a rank of a process group (see end_rank_process).
_was_rank = False


def teardown(context: Context) -> None:
    global _was_rank
    if context.distributed and dist.is_initialized():
        dist.destroy_process_group()
        _was_rank = True


def end_rank_process(code: int) -> None:
    """Ends a process that has been a rank of a process group, skipping the interpreter's finalization;
    returns in any other process.

    DistributedDataParallel and fully_shard keep a reference to the group, so its communication threads
    (gloo's) outlive destroy_process_group; torn down with the interpreter at exit, they aborted a
    finished run now and then ("terminate called without an active exception", SIGABRT). By this point
    every file is written and closed; only the standard streams need flushing."""
    if not _was_rank:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def all_sum_tensor(context: Context, tensor: torch.Tensor) -> torch.Tensor:
    """Sums a tensor over ranks, in place, without reading it back to the host."""
    if context.distributed:
        dist.all_reduce(tensor)
    return tensor


def all_min_int(context: Context, value: int) -> int:
    """The smallest of every rank's `value` (e.g. the pass size that fits on every rank's device)."""
    if not context.distributed:
        return value
    tensor = torch.tensor([value], dtype=torch.long, device=context.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


def share_bytes(context: Context, data: bytes | None) -> bytes:
    """Rank 0's `data` on every rank (e.g. the vocabulary it trained): sent over the process group, so
    other nodes need no shared filesystem to read it."""
    if not context.distributed:
        assert data is not None
        return data
    # gloo and NCCL both move tensors: the length first, then the bytes as uint8.
    if context.is_main:
        assert data is not None
        size = torch.tensor([len(data)], dtype=torch.long, device=context.device)
        dist.broadcast(size, src=0)
        dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(context.device), src=0)
        return data
    size = torch.tensor([0], dtype=torch.long, device=context.device)
    dist.broadcast(size, src=0)
    buffer = torch.empty(int(size.item()), dtype=torch.uint8, device=context.device)
    dist.broadcast(buffer, src=0)
    return bytes(buffer.cpu().tolist())
