"""The load-balancing loss of a mixture of experts (Switch, Fedus et al., 2022, eq. 4-6, as Mixtral and
Hugging Face pool it), from what each routing module of a model recorded in its last forward: `routed`,
the chosen experts [N, top_k] and the router's probabilities [N, experts] (xspec/nn/experts.py)."""

from __future__ import annotations

from typing import Optional, cast

import torch
import torch.nn as nn


def routing_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of `model` that record their routing."""
    return [module for module in model.modules() if hasattr(module, "routed")]


def load_balancing_loss(model: nn.Module, counted: Optional[torch.Tensor] = None) -> torch.Tensor:
    """experts * sum_e f_e * P_e, where f_e is expert e's choices per token and P_e its mean router
    probability, both over the tokens of every routing layer together. Layers with different numbers
    of experts are pooled apart and their losses summed. `counted` [batch, positions] (bool) leaves out
    padding, as the attention mask does in Hugging Face's loss, in layers whose tokens are those
    positions. A model that has not routed since it was built gives 0."""
    pooled: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    for module in routing_modules(model):
        routed = cast(Optional[tuple[torch.Tensor, torch.Tensor]], module.routed)
        if routed is None:
            continue
        chosen, probabilities = routed
        experts = probabilities.size(1)
        weight = probabilities.new_ones(chosen.size(0))  # [N]: 1 a token counted, 0 if not
        if counted is not None and counted.numel() == chosen.size(0):
            weight = counted.reshape(-1).to(weight.dtype)
        choices = probabilities.new_zeros(experts).scatter_add_(0, chosen.flatten(),
                                                                weight.repeat_interleave(chosen.size(1)))
        summed, tokens = (probabilities * weight[:, None]).sum(dim=0), weight.sum()
        if experts in pooled:
            before = pooled[experts]
            choices, summed, tokens = choices + before[0], summed + before[1], tokens + before[2]
        pooled[experts] = (choices, summed, tokens)
    losses = [experts * (choices / tokens * summed / tokens).sum()
              for experts, (choices, summed, tokens) in pooled.items()]
    return sum(losses[1:], losses[0]) if losses else torch.zeros(())
