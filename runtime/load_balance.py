"""Balancing the experts of a mixture, from what each routing module of a model recorded in its last
forward: its `last_routing()` (a RoutedMixture, xspec/nn/contracts.py), the chosen experts [N, top_k] and
the router's probabilities [N, experts]. Two ways: the load-balancing loss (Switch, Fedus et al., 2022,
eq. 4-6, as Mixtral and Hugging Face pool it), and DeepSeek-V3's auxiliary-loss-free correction (§2.1.2),
which moves each corrected router's bias after every update."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from xspec.nn.contracts import RoutedMixture


def routing_modules(model: nn.Module) -> list[RoutedMixture]:
    """The modules of `model` that record their routing."""
    return [module for module in model.modules() if isinstance(module, RoutedMixture)]


def load_balancing_loss(model: nn.Module, counted: Optional[torch.Tensor] = None) -> torch.Tensor:
    """experts * sum_e f_e * P_e, where f_e is expert e's choices per token and P_e its mean router
    probability, both over the tokens of every routing layer together. Layers with different numbers
    of experts are pooled apart and their losses summed. `counted` [batch, positions] (bool) leaves out
    padding, as the attention mask does in Hugging Face's loss, in layers whose tokens are those
    positions. A model that has not routed since it was built gives 0."""
    pooled: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    for module in routing_modules(model):
        routed = module.last_routing()
        if routed is None:
            continue
        chosen, probabilities = routed
        experts = probabilities.size(1)
        weight = _token_weights(chosen, counted, probabilities.dtype)
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


def _token_weights(chosen: torch.Tensor, counted: Optional[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """[N]: 1 for a token counted, 0 for padding, where `counted` [batch, positions] holds the routed tokens
    (a layer whose tokens are other positions counts them all)."""
    if counted is not None and counted.numel() == chosen.size(0):
        return counted.reshape(-1).to(dtype)
    return torch.ones(chosen.size(0), dtype=dtype, device=chosen.device)


def corrected_mixtures(model: nn.Module) -> list[RoutedMixture]:
    """The routing modules whose router chooses with a load-correction bias (DeepSeek-V3's)."""
    return [module for module in routing_modules(model) if module.load_correction() is not None]


def count_loads(mixtures: list[RoutedMixture], loads: torch.Tensor, counted: torch.Tensor) -> None:
    """Adds to `loads` (every mixture's experts, one after another) the tokens each expert took in the
    mixtures' last forward, padding (`counted` False) left out. A mixture that has not routed (multi-token
    prediction's, where training leaves it out) adds nothing."""
    start = 0
    for module in mixtures:
        routed = module.last_routing()
        if routed is None:
            start += correction(module).numel()
            continue
        chosen, probabilities = routed
        experts = probabilities.size(1)
        weight = _token_weights(chosen, counted, loads.dtype)
        loads[start:start + experts].scatter_add_(0, chosen.flatten(), weight.repeat_interleave(chosen.size(1)))
        start += experts


@torch.no_grad()
def correct_routers(mixtures: list[RoutedMixture], loads: torch.Tensor, rate: float) -> None:
    """DeepSeek-V3's bias update: each expert's bias rises by `rate` where it took fewer tokens than its
    mixture's mean over the update, falls by `rate` where more (loads summed over every process)."""
    start = 0
    for module in mixtures:
        bias = correction(module)
        load = loads[start:start + bias.numel()]
        bias.add_(rate * torch.sign(load.mean() - load).to(bias.dtype))
        start += bias.numel()


def correction(mixture: RoutedMixture) -> torch.Tensor:
    """The per-expert bias of a corrected mixture's router (one of corrected_mixtures)."""
    bias = mixture.load_correction()
    assert bias is not None, "corrected_mixtures chose only mixtures with a correction"
    return bias
