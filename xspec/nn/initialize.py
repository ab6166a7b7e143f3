"""Building a model without allocating twice: construct it on the meta device, give its tensors
memory on the device it runs on, then either initialize them (a new model) or leave them for a
checkpoint to fill, computing only the tensors modules derive (rotary frequencies, sinusoid
tables), which no checkpoint holds.

Initializing is the generated model's own `init_weights()`: every module's `reset_parameters()`
(torch's modules and the library's: each sets its own tensors as its constructor does) children
first, in the order the constructors ran, so a seed gives the tensors construction would have
given. A tied tensor keeps the value of the module it belongs to: the model's `tie_weights()`
(generated where the spec ties tensors) ties them again after each step that gives every name a
tensor of its own."""

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
    if not init:
        derive_buffers(model)
    elif isinstance(model, InitializesWeights):  # a generated model says how, in its file
        with torch.no_grad():
            model.init_weights()
    else:
        raise TypeError(f"{type(model).__name__} has no init_weights(): it is not a generated model")
    return model


@torch.no_grad()
def derive_buffers(model: nn.Module) -> None:
    """The buffers no state dict holds (derived from the constructor's arguments), computed
    again."""
    kept = set(model.state_dict())
    for path, module in _children_first(model, ""):
        own = [name for name, _ in module.named_buffers(prefix=path, recurse=False)]
        if any(name not in kept for name in own) and isinstance(module, Resettable):
            module.reset_parameters()


def _children_first(module: nn.Module, path: str) -> Iterator[tuple[str, nn.Module]]:
    """(path, module) of every module under `module`, each after its children: the order in which
    their constructors set their tensors (a module builds its children, then its own)."""
    for name, child in module.named_children():
        yield from _children_first(child, f"{path}{name}.")
    yield path.removesuffix("."), module
