"""Activation checkpointing (train.activation_checkpointing): each layer of the spec's repeated stacks keeps
only its inputs for the backward and runs its forward again there (torch.utils.checkpoint, not reentrant, the
random state kept so dropout draws the same masks), trading about a third more compute for the memory of
every activation inside the layers. The layers keep their names: checkpoints, LoRA's targets and the
optimizer's state read them as before."""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator

from torch import nn
from torch.utils.checkpoint import checkpoint


def checkpoint_layers(model: nn.Module, spec) -> list[str]:
    """Makes each layer of `spec`'s repeated stacks in `model` recompute its activations in the backward;
    returns their paths."""
    paths = [layer.path for stack in _instances(spec.instances) if stack.kind == "stack"
             for layer in stack.children.values()]
    for path in paths:
        layer = model.get_submodule(path)
        layer.forward = functools.partial(_recomputed, layer.forward)
    return paths


def _recomputed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def _instances(instance) -> Iterator:
    yield instance
    for child in instance.children.values():
        yield from _instances(child)
