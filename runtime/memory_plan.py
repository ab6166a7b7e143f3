"""How many tokens one forward pass may hold, decided before anything is allocated.

`train.max_batch_tokens = "auto"` (the default): the spec's estimate of training memory (weights,
gradients, Adam's moments, and per pass the activations autograd keeps and the loss's tensors, at the
run's precision and sharding, for what trains, a LoRA run's adapters alone, and as its layers keep their
activations: `spec.training_memory`, compiler/cost.py) is set against the memory the device has free,
and each update (§5.1: about `batch_tokens` target tokens) is cut into as many passes as it takes for the
largest to fit. Passes only split an update: its sentences, and so the result of the
update (gradients accumulate), are what they would be in one pass. A number keeps that cap and is checked
the same way, with a warning instead of a refusal.

The estimate at a cap assumes every sentence of the pass as long as the longest training sentence:
per token, activations grow with the length (attention), so a pass of shorter ones holds less.
bench/memory.py compares the estimate with measured peaks (docs/runtime.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from xspec.base.errors import UserError
from .distributed import Context
from .precision import Precision

# Beyond its tensors, a CPU process that trains holds the allocator's arenas and per-thread caches and
# torch's own working memory: 85-180 MiB measured here over the specs of bench/memory.py.
CPU_RUNTIME_BYTES = 128 * 2**20
# And what a pass allocates grows by more than its tensors on a CPU: glibc's malloc keeps freed blocks of
# one size that the next sizes cannot reuse, and backward's transients (gradients of the attention
# weights, of the experts' intermediates) come and go beside what autograd keeps. Measured by
# bench/memory.py: without it, the 2024-25 specs' larger passes were up to 20% above the estimate.
CPU_PASS_FACTOR = 1.25
# The share of free memory a plan may fill: the rest is for what the estimate leaves out (allocator
# fragmentation, kernels' workspaces) and for the machine's other programs.
USABLE_SHARE = 0.9
# Caps are multiples of this many tokens when they can be (plans read better; nothing depends on it).
ROUNDING = 64


@dataclass(frozen=True)
class FreeMemory:
    bytes: int
    where: str                          # "CPU RAM", "cuda:0", or "given"


def free_memory(device: torch.device) -> FreeMemory:
    """What the device has free now: a GPU's free memory, or the RAM this process may still take (the
    machine's available memory, within its control group's limit, shared by the processes torchrun
    started on this machine)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return FreeMemory(int(free), str(device))
    available = [_meminfo_available(), _cgroup_room()]
    known = [a for a in available if a is not None]
    free = min(known) if known else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return FreeMemory(free // max(local_processes, 1), "CPU RAM")


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room() -> int | None:
    """The control group's limit less its usage (cgroup v2, else v1); None where there is no limit."""
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            text = Path(limit).read_text().strip()
            if text == "max" or int(text) >= 2**60:       # v1 writes "no limit" as a huge number
                return None
            return max(int(text) - int(Path(usage).read_text().strip()), 0)
        except (OSError, ValueError):
            continue
    return None


@dataclass(frozen=True)
class Layout:
    """How the run holds the model: the precision of its activations, how its ranks share the state, what
    trains (LoRA: the adapters alone, beside a frozen base that may be kept smaller) and whether layers
    remake their activations in the backward."""

    device_type: str
    activation_bytes: int               # 2 under bf16/fp16 autocast, else 4
    shards: int                         # ranks sharing weights, gradients and moments (FSDP)
    replicas: int                       # ranks holding the whole model each (DDP)
    trained: Optional[int] = None       # parameters with gradients and moments (None: all)
    weight_bytes: Optional[int] = None  # what the weights take (None: float32)
    recomputed: bool = False            # train.activation_checkpointing

    @classmethod
    def of(cls, context: Context, precision: Precision, sharding: str, trained: Optional[int] = None,
           weight_bytes: Optional[int] = None, recomputed: bool = False) -> "Layout":
        sharded = context.distributed and sharding == "fsdp"
        return cls(context.device.type, 2 if precision.dtype is not None else 4,
                   context.world_size if sharded else 1, 1 if sharded else context.world_size,
                   trained, weight_bytes, recomputed)


def estimate_peak(spec, sentences: int, length: int, layout: Layout) -> int:
    """Estimated peak bytes of training with passes of `sentences` sequences of `length` tokens."""
    memory = spec.training_memory(sentences, length, activation_bytes=layout.activation_bytes,
                                  shards=layout.shards, replicas=layout.replicas, trained=layout.trained,
                                  weight_bytes=layout.weight_bytes, recomputed=layout.recomputed)
    if layout.device_type == "cpu":
        return memory.fixed + int(memory.per_pass * CPU_PASS_FACTOR) + CPU_RUNTIME_BYTES
    return memory.total


@dataclass(frozen=True)
class MemoryPlan:
    cap: int                            # padded tokens (sentences x longest) of one pass at most
    share: int                          # a rank's share of an update: the most a pass would need
    batch_tokens: int
    longest: int                        # the longest training sequence (tokens, padded side)
    estimate: int                       # estimated peak bytes with passes at the cap
    free: FreeMemory
    explicit: bool                      # the spec's own train.max_batch_tokens

    @property
    def passes(self) -> int:
        """About how many passes a rank makes of an update."""
        return -(-self.share // self.cap)

    @property
    def fits(self) -> bool:
        return self.estimate <= self.free.bytes * USABLE_SHARE

    def describe(self) -> str:
        how = (f"as about {self.passes} passes of <= {self.cap:,} tokens" if self.passes > 1
               else "in one pass")
        return (f"update of {self.batch_tokens:,} tokens {how}; estimated peak {_size(self.estimate)} of "
                f"{_size(self.free.bytes)} free ({self.free.where})")


def plan_memory(spec, layout: Layout, parts: int, longest: int, free: FreeMemory) -> MemoryPlan:
    """The pass cap for `spec.train.max_batch_tokens` ("auto" or a number) on a device with `free` memory,
    for training sequences of at most `longest` padded tokens and updates shared by `parts` ranks."""
    cfg = spec.train
    share = max(1, cfg.batch_tokens // parts)
    one = estimate_peak(spec, 1, longest, layout)
    if cfg.max_batch_tokens != "auto":
        cap = min(int(cfg.max_batch_tokens), share)
        return MemoryPlan(cap, share, cfg.batch_tokens, longest,
                          estimate_peak(spec, max(cap // longest, 1), longest, layout), free, explicit=True)
    usable = int(free.bytes * USABLE_SHARE)
    if one > usable:
        fixed = estimate_peak(spec, 0, longest, layout)
        raise UserError(
            f"train: not enough memory on {free.where}: the model's weights, gradients and Adam moments take "
            f"{_size(fixed)}, and one sequence of {longest} tokens (the longest in the training data) "
            f"{_size(one - fixed)} more, but {_size(free.bytes)} is free ({USABLE_SHARE:.0%} usable). Train shorter "
            "sequences (data.max_tokens), a smaller model, shard it over more processes "
            "(train.sharding = \"fsdp\"), or free memory")
    per_sentence = one - estimate_peak(spec, 0, longest, layout)
    sentences = (usable - estimate_peak(spec, 0, longest, layout)) // per_sentence
    cap = min(share, sentences * longest)
    if cap < share and cap >= 2 * ROUNDING:
        cap -= cap % ROUNDING
    cap = max(cap, longest)
    return MemoryPlan(cap, share, cfg.batch_tokens, longest, estimate_peak(spec, cap // longest, longest, layout),
                      free, explicit=False)


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"
