"""Building a model without allocating twice: construct it on the meta device, give its tensors
memory on the device it runs on, then either initialize them (a new model) or leave them for a
checkpoint to fill, computing only the tensors modules derive (rotary frequencies, sinusoid
tables), which no checkpoint holds.

Initializing calls every module's `reset_parameters()` (torch's modules and the library's: each
sets its own tensors as its constructor does) children first, in the order the constructors ran,
so a seed gives the tensors construction would have given. A tied tensor keeps the value of the
module it belongs to."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
import torch.nn as nn

from .contracts import Resettable


def materialized(model: nn.Module, device: torch.device | str, *, init: bool,
                 tied: Mapping[str, str] | None = None) -> nn.Module:
    """`model`, built on the meta device, with memory on `device`: initialized where `init`
    (`tied`: each tied parameter's name -> the name of the one it is), else only its derived
    tensors computed."""
    model = model.to_empty(device=device)
    tied = tied or {}
    parameters = dict(model.named_parameters(remove_duplicate=False))
    for name, owner in tied.items():  # to_empty gave each name a tensor of its own
        _assign(model, name, parameters[owner])
    if init:
        initialize(model, tied)
    else:
        derive_buffers(model)
    return model


@torch.no_grad()
def initialize(model: nn.Module, tied: Mapping[str, str]) -> None:
    """Every module's reset_parameters(), children first. As construction does, each tied
    parameter is set apart first (on a tensor of its own) and tied after."""
    parameters = dict(model.named_parameters(remove_duplicate=False))
    for name in tied:
        _assign(model, name, nn.Parameter(torch.empty_like(parameters[name])))
    for _, module in _children_first(model, ""):
        if isinstance(module, Resettable):
            module.reset_parameters()
    for name, owner in tied.items():
        _assign(model, name, parameters[owner])


@torch.no_grad()
def derive_buffers(model: nn.Module) -> None:
    """The buffers no state dict holds (derived from the constructor's arguments), computed
    again."""
    kept = set(model.state_dict())
    for path, module in _children_first(model, ""):
        own = [name for name, _ in module.named_buffers(prefix=path, recurse=False)]
        if any(name not in kept for name in own) and isinstance(module, Resettable):
            module.reset_parameters()


def _assign(model: nn.Module, name: str, parameter: nn.Parameter) -> None:
    path, _, attribute = name.rpartition(".")
    setattr(model.get_submodule(path), attribute, parameter)


def _children_first(module: nn.Module, path: str) -> Iterator[tuple[str, nn.Module]]:
    """(path, module) of every module under `module`, each after its children: the order in which
    their constructors set their tensors (a module builds its children, then its own)."""
    for name, child in module.named_children():
        yield from _children_first(child, f"{path}{name}.")
    yield path.removesuffix("."), module
