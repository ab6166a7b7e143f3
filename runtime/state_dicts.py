"""Model and optimizer state as checkpoints hold it, whether the model is replicated or sharded.

A checkpoint holds full tensors under the model's own names, and the optimizer's state in
`optimizer.state_dict()`'s form (parameters by index), so a run trained with FSDP resumes without it and
translates anywhere. With FSDP every rank takes part in gathering and in loading; only rank 0 writes.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import torch
import torch.nn as nn

from .step import TrainingStep

MODEL_PREFIX = "model."  # TrainingStep's attribute: the model's names inside the step module


def model_state(step: TrainingStep, wrapped: nn.Module, sharded: bool) -> dict[str, torch.Tensor]:
    """The model's state_dict, full tensors on the CPU (with sharded parameters: on rank 0; the other
    processes take part in gathering them, and get an empty dict)."""
    if not sharded:
        return step.model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # Typed as state_dict() is: torch's state-dict type admits sharded values, which full_state_dict gathers.
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full: dict[str, Any] = get_model_state_dict(wrapped, options=options)
    return {name.removeprefix(MODEL_PREFIX): tensor for name, tensor in full.items()}


def load_model_state(step: TrainingStep, wrapped: nn.Module, sharded: bool, tensors: dict[str, torch.Tensor]) -> None:
    if not sharded:
        step.model.load_state_dict(tensors)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(wrapped, {MODEL_PREFIX + name: tensor for name, tensor in tensors.items()},
                         options=StateDictOptions(full_state_dict=True))


def optimizer_state(wrapped: nn.Module, optimizer: torch.optim.Optimizer, sharded: bool) -> dict:
    """`optimizer.state_dict()`, with full tensors when the parameters are sharded."""
    if not sharded:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full: dict[str, Any] = get_optimizer_state_dict(wrapped, optimizer, options=options)  # as model_state's
    if not full:  # gathered on rank 0 only: the other processes get nothing to write
        return {}
    index = {name: i for i, name in enumerate(_parameter_names(wrapped, optimizer))}
    return {"state": {index[name]: values for name, values in full["state"].items()},
            "param_groups": [{**group, "params": [index[name] for name in group["params"]]}
                             for group in full["param_groups"]]}


def load_optimizer_state(wrapped: nn.Module, optimizer: torch.optim.Optimizer, sharded: bool, state: dict) -> None:
    if not sharded:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _parameter_names(wrapped, optimizer)
    by_name: dict[str, Any] = {"state": {names[i]: values for i, values in state["state"].items()},
                               "param_groups": [{**group, "params": [names[i] for i in group["params"]]}
                                                for group in state["param_groups"]]}
    set_optimizer_state_dict(wrapped, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


def _parameter_names(wrapped: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of each of the optimizer's parameters, in the optimizer's order (its indices)."""
    name_of = {id(parameter): name for name, parameter in wrapped.named_parameters()}
    return [name_of[id(p)] for p in chain.from_iterable(group["params"] for group in optimizer.param_groups)]
