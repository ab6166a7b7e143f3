"""DeepSeek-V3's multi-token prediction (§2.2) at run time.

A compiled language model with a `mtp` block holds `model.mtp`, a MultiTokenPrediction (xspec/nn/contracts.py),
one module per depth (docs/language.md).
Depth k reads, at each position, the states the output head reads at depth k - 1 (depth 1: the decoder's,
caught as the head reads them) and the embedding of the token k positions on; it returns the states from
which the same head predicts the token after that one. Training adds `train.mtp_loss_weight` times the
mean of the depths' losses to the main loss (`depth_losses`); greedy decoding drafts tokens with them
(runtime/speculative.py).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from xspec.nn.contracts import MultiTokenPrediction
from .batching import NO_LABEL


def prediction_depths(model: nn.Module) -> Optional[MultiTokenPrediction]:
    """The model's multi-token prediction modules, one per depth; None where it has none."""
    return next((child for child in model.children() if isinstance(child, MultiTokenPrediction) and len(child) > 0),
                None)


class HeadReads:
    """The states the output head reads, caught as it reads them (a forward pre-hook): what the first depth
    of multi-token prediction reads, without another pass through the decoder."""

    def __init__(self, head: nn.Module) -> None:
        self.head = head  # (a plain attribute: the head stays registered once, where the model has it)
        self.states: Optional[torch.Tensor] = None
        self.handle = head.register_forward_pre_hook(self._catch)

    def _catch(self, module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        self.states = inputs[0]

    def take(self) -> torch.Tensor:
        states, self.states = self.states, None
        assert states is not None, "the output head has not run since its states were last taken"
        return states

    def remove(self) -> None:
        self.handle.remove()


def depth_losses(depths: nn.ModuleList, head: nn.Module, states: torch.Tensor, labels: torch.Tensor,
                 label_smoothing: float = 0.0) -> torch.Tensor:
    """Each depth's cross entropy, summed over its target tokens: [depths]. `states` [B, T, d] are what the
    head read at each position, `labels` [B, T] the token after each (NO_LABEL at padding). Depth k, at
    position i, reads the state of depth k - 1 there and the token after i + k - 1, and predicts the one
    after i + k; a padding token it reads is the id 0, whose prediction counts for nothing (its target is
    padding too)."""
    losses = []
    length = labels.size(1)
    for k, depth in enumerate(depths, 1):
        if length - k < 1:
            losses.append(states.new_zeros(()))
            continue
        tokens = labels[:, k - 1:length - 1]
        tokens = torch.where(tokens == NO_LABEL, torch.zeros_like(tokens), tokens)
        states = depth(states[:, :length - k], tokens)  # [B, T - k, d]
        logits = head(states)
        losses.append(F.cross_entropy(logits.flatten(0, 1).float(), labels[:, k:].flatten(), ignore_index=NO_LABEL,
                                      label_smoothing=label_smoothing, reduction="sum"))
    return torch.stack(losses)
