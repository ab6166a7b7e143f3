"""Processes and devices: one process, or `torchrun` with DistributedDataParallel (NCCL on GPUs, gloo on CPU)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from xspec.errors import UserError


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


def setup(requested_device: str | None) -> Context:
    """Joins the process group when started by torchrun (it sets WORLD_SIZE, RANK, LOCAL_RANK)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Context(0, 1, pick_device(requested_device))
    local_rank = int(os.environ["LOCAL_RANK"])
    device = pick_device(requested_device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Context(dist.get_rank(), world_size, device)


def teardown(context: Context) -> None:
    if context.distributed and dist.is_initialized():
        dist.destroy_process_group()


def barrier(context: Context) -> None:
    if context.distributed:
        dist.barrier()


def all_sum(context: Context, values: list[float]) -> list[float]:
    """Sums numbers over ranks (losses, token counts, stop flags)."""
    if not context.distributed:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=context.device)
    dist.all_reduce(tensor)
    return tensor.tolist()
