"""Building a model without allocating twice: construct it on the meta device, give its tensors
memory on the device it runs on, then either initialize them (a new model) or leave them for a
checkpoint to fill, computing only the tensors modules derive (rotary frequencies, sinusoid
tables), which no checkpoint holds.

Initializing calls every module's `reset_parameters()` (torch's modules and the library's: each
sets its own tensors as its constructor does) children first, in the order the constructors ran,
so a seed gives the tensors construction would have given. A generated model does it in its own
`init_weights()`, which names the classes it resets; `initialize` does it for any other. A tied
tensor keeps the value of the module it belongs to: the model's `tie_weights()` (generated where
the spec ties tensors) ties them again after each step that gives every name a tensor of its own."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn as nn

from .contracts import InitializesWeights, Resettable, TiesWeights


def materialized(model: nn.Module, device: torch.device | str, *, init: bool) -> nn.Module:
    """`model`, built on the meta device, with memory on `device`: initialized where `init`, else
    only its derived tensors computed."""
    model = model.to_empty(device=device)
    if isinstance(model, TiesWeights):  # to_empty gave each tied name a tensor of its own
        model.tie_weights()
    if init and isinstance(model, InitializesWeights):  # a generated model says how, in its file
        with torch.no_grad():
            model.init_weights()
    elif init:
        initialize(model)
    else:
        derive_buffers(model)
    return model


@torch.no_grad()
def initialize(model: nn.Module) -> None:
    """Every module's reset_parameters(), children first. As construction does, each tied
    parameter is set on a tensor of its own first and tied after (`tie_weights()`: the owner's
    value stays)."""
    shared = _shared_names(model) if isinstance(model, TiesWeights) else []  # it ties them again
    parameters = dict(model.named_parameters(remove_duplicate=False))
    for name in shared:
        _assign(model, name, nn.Parameter(torch.empty_like(parameters[name])))
    for _, module in _children_first(model, ""):
        if isinstance(module, Resettable):
            module.reset_parameters()
    if isinstance(model, TiesWeights):
        model.tie_weights()


@torch.no_grad()
def derive_buffers(model: nn.Module) -> None:
    """The buffers no state dict holds (derived from the constructor's arguments), computed
    again."""
    kept = set(model.state_dict())
    for path, module in _children_first(model, ""):
        own = [name for name, _ in module.named_buffers(prefix=path, recurse=False)]
        if any(name not in kept for name in own) and isinstance(module, Resettable):
            module.reset_parameters()


def _shared_names(model: nn.Module) -> list[str]:
    """The names of every parameter that more than one name holds."""
    names: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    return [name for group in names.values() if len(group) > 1 for name in group]


def _assign(model: nn.Module, name: str, parameter: nn.Parameter) -> None:
    path, _, attribute = name.rpartition(".")
    setattr(model.get_submodule(path), attribute, parameter)


def _children_first(module: nn.Module, path: str) -> Iterator[tuple[str, nn.Module]]:
    """(path, module) of every module under `module`, each after its children: the order in which
    their constructors set their tensors (a module builds its children, then its own)."""
    for name, child in module.named_children():
        yield from _children_first(child, f"{path}{name}.")
    yield path.removesuffix("."), module
