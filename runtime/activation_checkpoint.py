"""Activation checkpointing (train.activation_checkpointing): each layer of the spec's repeated stacks keeps
only its inputs for the backward and runs its forward again there (torch.utils.checkpoint, not reentrant, the
random state kept so dropout draws the same masks), trading about a third more compute for the memory of
every activation inside the layers. torch enters the forward's autocast again for the recomputation, not its
torch function modes: `recompute` gives those (the precision's, and dropout's masks on a CPU), so the second
forward computes what the first did. The layers keep their names: checkpoints, LoRA's targets and the
optimizer's state read them as before."""

from __future__ import annotations

import functools
from contextlib import nullcontext
from typing import Any, Callable, ContextManager

from torch import nn
from torch.utils.checkpoint import checkpoint


def checkpoint_layers(model: nn.Module, spec, recompute: Callable[[], ContextManager] = nullcontext) -> list[str]:
    """Makes each layer of `spec`'s repeated stacks in `model` recompute its activations in the backward (the
    layers the memory plan counts so, spec.layer_paths()), in the context `recompute()` makes; returns their
    paths."""
    paths = spec.layer_paths()
    for path in paths:
        layer = model.get_submodule(path)
        layer.forward = functools.partial(_recomputed, layer.forward, recompute)
    return paths


def _recomputed(forward: Callable[..., Any], recompute: Callable[[], ContextManager], *args: Any,
                **kwargs: Any) -> Any:
    return checkpoint(forward, *args, use_reentrant=False, context_fn=lambda: (nullcontext(), recompute()),
                      **kwargs)
