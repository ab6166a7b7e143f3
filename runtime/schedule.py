"""The optimizer and the learning-rate schedule: §5.3's Adam and eq. 3, a constant rate, or AdamW with a
cosine decay (the fine-tuning recipe, compiler/sections.py's FINE_TUNING); and a run's length in steps
where it is counted in passes over the data (train.epochs)."""

from __future__ import annotations

import math
from typing import Optional

import torch

from xspec.compiler.sections import TrainSection


def inverse_sqrt(step: int, d_model: int, warmup: int) -> float:
    """lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1."""
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def make_scheduler(optimizer: torch.optim.Optimizer, train: TrainSection,
                   d_model: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The optimizer's base lr must be 1.0 (inverse_sqrt) or `train.lr` (constant): LambdaLR multiplies it.

    LambdaLR counts from 0 before the first update; the paper's step_num counts from 1.
    """
    if train.lr_schedule == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    if train.lr_schedule == "cosine":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: cosine(step + 1, train.warmup_steps,
                                                                                train.max_steps))
    scale, warmup = train.lr_scale, train.warmup_steps
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: scale * inverse_sqrt(step + 1, d_model, warmup))


def cosine(step: int, warmup: int, steps: int) -> float:
    """The share of `lr` at `step` (from 1): rising linearly over `warmup` steps, then half a cosine down to
    0 at `steps` (transformers' get_cosine_schedule_with_warmup)."""
    if step <= warmup:
        return step / warmup
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, steps - warmup))))


def make_optimizer(parameters, train: TrainSection) -> torch.optim.Adam:
    """§5.3: Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9 (the spec's `train` section); or AdamW, its
    weight decay apart from the gradients.

    Fused: one kernel for all parameters (several times faster than the per-tensor loop, on CPUs too),
    and it can skip an update on the device when told the gradients are not finite (`skip_if`)."""
    base_lr = train.lr if train.lr_schedule in ("constant", "cosine") else 1.0
    beta1, beta2 = train.adam_betas
    kind = torch.optim.AdamW if train.optimizer == "adamw" else torch.optim.Adam
    return kind(parameters, lr=base_lr, betas=(beta1, beta2), eps=train.adam_eps, weight_decay=train.weight_decay,
                fused=True)


def run_length(train: TrainSection, epoch_updates: Optional[int]) -> TrainSection:
    """The train section with max_steps counted from the data (train.epochs passes of `epoch_updates` each,
    where fewer than max_steps) and warmup_steps from train.warmup_fraction of them."""
    steps = train.max_steps
    if train.epochs is not None and epoch_updates is not None:
        steps = max(1, min(steps, train.epochs * epoch_updates))
    warmup = max(1, round(train.warmup_fraction * steps)) if train.warmup_fraction is not None else \
        train.warmup_steps
    return train.model_copy(update={"max_steps": steps, "warmup_steps": warmup})


def warmup_warning(train: TrainSection) -> Optional[str]:
    """What a run says when its warm-up outlasts it: the learning rate never leaves the warm-up."""
    if train.lr_schedule == "constant" or train.warmup_steps < train.max_steps:
        return None
    return (f"warning: train.warmup_steps {train.warmup_steps} is not shorter than the run's {train.max_steps} "
            "steps: the learning rate never leaves its warm-up (set train.warmup_steps or train.warmup_fraction)")


def skip_if(optimizer: torch.optim.Adam, not_finite: torch.Tensor) -> None:
    """Makes the next `optimizer.step()` leave parameters and moments as they are when `not_finite` (a
    0-dim tensor on the parameters' device) is nonzero, decided on the device without waiting for it:
    the fused Adam's `found_inf`, the mechanism torch.amp.GradScaler uses for the same purpose."""
    optimizer.found_inf = not_finite.float()  # type: ignore[attr-defined]
