"""The learning-rate schedule (§5.3, eq. 3) as a `torch.optim.lr_scheduler.LambdaLR`."""

from __future__ import annotations

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
    scale, warmup = train.lr_scale, train.warmup_steps
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: scale * inverse_sqrt(step + 1, d_model, warmup))


def make_optimizer(parameters, train: TrainSection) -> torch.optim.Adam:
    """§5.3: Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9 (the spec's `train` section).

    Fused: one kernel for all parameters (several times faster than the per-tensor loop, on CPUs too),
    and it can skip an update on the device when told the gradients are not finite (`skip_if`)."""
    base_lr = train.lr if train.lr_schedule == "constant" else 1.0
    beta1, beta2 = train.adam_betas
    return torch.optim.Adam(parameters, lr=base_lr, betas=(beta1, beta2), eps=train.adam_eps,
                            weight_decay=train.weight_decay, fused=True)


def skip_if(optimizer: torch.optim.Adam, not_finite: torch.Tensor) -> None:
    """Makes the next `optimizer.step()` leave parameters and moments as they are when `not_finite` (a
    0-dim tensor on the parameters' device) is nonzero, decided on the device without waiting for it:
    the fused Adam's `found_inf`, the mechanism torch.amp.GradScaler uses for the same purpose."""
    optimizer.found_inf = not_finite.float()  # type: ignore[attr-defined]
