"""A training step's computation as one module, and how it is spread over processes and compiled.

`TrainingStep` is the model and its loss together (§5.4: label-smoothed cross entropy over the target
tokens), so that DistributedDataParallel or FSDP wrap, and `torch.compile` compiles, both: the loss over
the [tokens x vocab] logits is then fused into the compiled graph instead of running eagerly on a
float32 copy of them. A model with a loss of its own (a mixture of experts' load balancing,
runtime/load_balance.py, weighted by `train.router_aux_loss_coef`; multi-token prediction's,
runtime/multi_token.py, by `train.mtp_loss_weight`) has it added, and kept apart for the log. Checkpoints,
validation and decoding use the model itself (`step.model`).
"""

from __future__ import annotations

import inspect
from collections import Counter
from typing import Any, Optional, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from .distributed import Context
from .batching import NO_LABEL
from .cache import PackedDocuments, document_numbers
from .compile_choice import compiled
from .expert_products import register_expert_products
from .load_balance import (correct_routers, corrected_mixtures, correction, count_loads, load_balancing_loss,
                           routing_modules)
from .multi_token import HeadReads, depth_losses, prediction_depths


class TrainingStep(nn.Module):
    side_sums: torch.Tensor     # buffers (registered below)
    expert_loads: torch.Tensor

    def __init__(self, model: nn.Module, label_smoothing: float, aux_loss_coef: float = 0.0,
                 expert_bias_rate: float = 0.0, mtp_loss_weight: float = 0.0,
                 output_head: Optional[str] = None, document_start: Optional[int] = None) -> None:
        """`output_head`: the path of the module that makes the logits (CompiledSpec.output_head), which
        multi-token prediction's depths share. `document_start`: a language model's packed documents are
        kept apart (`data.document_boundaries = "separate"`), each starting at this token."""
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing
        self.document_start = document_start
        self.aux_loss_coef = aux_loss_coef
        # DeepSeek-V3's balancing: the experts' loads over an update, which move their routers' biases.
        self.expert_bias_rate = expert_bias_rate
        self.corrected = corrected_mixtures(model) if expert_bias_rate > 0 else []
        experts = sum(correction(m).numel() for m in self.corrected)
        self.register_buffer("expert_loads", torch.zeros(experts), persistent=False)
        self.has_auxiliary_loss = bool(routing_modules(model))
        if self.has_auxiliary_loss:
            register_expert_products()  # so that torch.compile traces the experts as one graph
        # DeepSeek-V3's multi-token prediction: its depths, and the states the head they share reads.
        depths = prediction_depths(model) if mtp_loss_weight > 0 and output_head is not None else None
        self.mtp_loss_weight = mtp_loss_weight
        self.head_reads = HeadReads(model.get_submodule(output_head)) if depths is not None and output_head \
            else None
        # The losses kept apart for the log, by name: of the passes since they were last taken, summed over
        # target tokens (as the token loss is), unweighted. A tensor on the device, so reading it waits for
        # nothing until the log does.
        self.side_names = tuple(name for name, present in (("aux_loss", self.has_auxiliary_loss),
                                                           ("mtp_loss", self.head_reads is not None)) if present)
        self.register_buffer("side_sums", torch.zeros(len(self.side_names)), persistent=False)

    def forward(self, labels: torch.Tensor, *inputs: torch.Tensor, smoothed: bool = True) -> torch.Tensor:
        """The summed token loss of a batch (`inputs`: the model's arguments, runtime/batching.Batch):
        label-smoothed for training, plain cross entropy (nats) for validation. Padding positions (NO_LABEL
        labels) are ignored. In training, a model's auxiliary loss (per token, as Switch and Mixtral add
        it to the mean token loss) is added for each target token, times `aux_loss_coef`."""
        if self.document_start is None:
            logits = self.model(*inputs)  # [B, T, V]
        else:  # a language model's tokens, its documents each seeing only itself
            (tokens,) = inputs
            documents = PackedDocuments(document_numbers(tokens, self.document_start))
            logits = cast(Any, self.model).decode(tokens, cache=documents)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=NO_LABEL,
                               label_smoothing=self.label_smoothing if smoothed else 0.0, reduction="sum")
        states = self.head_reads.take() if self.head_reads is not None else None
        if not smoothed:
            return loss
        sides = []
        if states is not None:  # §2.2: the mean of the depths' losses, times lambda (first: their experts route)
            depths = prediction_depths(self.model)
            assert depths is not None and self.head_reads is not None
            mean = depth_losses(depths, self.head_reads.head, states, labels, self.label_smoothing).mean()
            sides.append(mean.detach())
            loss = loss + self.mtp_loss_weight * mean
        if self.has_auxiliary_loss:
            counted = labels != NO_LABEL                     # [B, T]: the positions that are not padding
            weighted = load_balancing_loss(self.model, counted) * counted.sum()
            sides.insert(0, weighted.detach())
            loss = loss + self.aux_loss_coef * weighted
            if self.corrected:
                count_loads(self.corrected, self.expert_loads, counted)
        if sides:
            self.side_sums += torch.stack(sides)
        return loss

    def correct_routers(self, context: Context) -> None:
        """After an update: each corrected router's bias moved by the experts' loads over the update on
        every process (the same on each, so their copies stay equal), and the loads cleared."""
        if not self.corrected:
            return
        if context.distributed:
            import torch.distributed as dist

            dist.all_reduce(self.expert_loads)
        correct_routers(self.corrected, self.expert_loads, self.expert_bias_rate)
        self.expert_loads.zero_()

    def take_side_losses(self) -> torch.Tensor | None:
        """The losses kept apart (`side_names`), each summed over target tokens since the last call (None:
        the model has none)."""
        if not self.side_names:
            return None
        taken = self.side_sums.clone()
        self.side_sums.zero_()
        return taken


def distribute(step: TrainingStep, context: Context, sharding: str) -> nn.Module:
    """The module updates run through: the step itself in one process; over several, replicated with
    DistributedDataParallel, or sharded with FSDP (`train.sharding = "fsdp"`: each layer of a repeated
    stack is one unit, unless it shares weights with other layers, the rest of the model another)."""
    if not context.distributed:
        return step
    if sharding == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in _stack_layers(step.model):
            fully_shard(layer)
        return cast(nn.Module, fully_shard(step))     # the step itself, its class now an FSDPModule too
    from torch.nn.parallel import DistributedDataParallel

    # The model's buffers (positional tables) are computed, never trained: no need to re-send them each
    # forward. torch 2.13 names that forward_sync_buffers and warns on the older broadcast_buffers.
    device_ids = [context.device] if context.device.type == "cuda" else None
    newer = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    no_sync: dict[str, Any] = {"forward_sync_buffers" if newer else "broadcast_buffers": False}
    return DistributedDataParallel(step, device_ids=device_ids, **no_sync)


def parameter_holders(module: nn.Module) -> Counter[int]:
    """How many places in `module` hold each parameter (by id): more than one where it is tied."""
    return Counter(id(parameter) for _, parameter in module.named_parameters(remove_duplicate=False))


def _stack_layers(model: nn.Module) -> list[nn.Module]:
    """The layers of every repeated stack (the generated model's nn.ModuleLists) that can be FSDP units of
    their own: innermost first (a unit must be sharded before one that contains it), and only layers whose
    parameters no module outside them shares (a stack tied to its first layer is sharded with the rest)."""
    layers = [layer for module in model.modules() if isinstance(module, nn.ModuleList) for layer in module]
    holders = parameter_holders(model)

    def own(layer: nn.Module) -> bool:
        return all(holders[p] == count for p, count in parameter_holders(layer).items())

    # model.modules() lists a module before those inside it: reversed, the inner layers come first.
    return [layer for layer in reversed(layers) if own(layer)]


def compile_step(module: nn.Module) -> nn.Module:
    """torch.compile of the whole step, lengths dynamic: batches of new lengths reuse the compiled code."""
    return cast(nn.Module, compiled(module, dynamic=True))     # an OptimizedModule
