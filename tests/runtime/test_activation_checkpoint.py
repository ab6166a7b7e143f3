"""train.activation_checkpointing: the layers of a spec's repeated stacks keep only their inputs for the
backward, and recompute the rest there; the loss and every gradient are those of the plain step (dropout
draws the same masks, torch's or the hashed ones of a CPU training pass, which the recomputation enters again),
the names of the weights do not change, and the backward holds less."""

from contextlib import AbstractContextManager, nullcontext

import pytest
import torch

import xspec
from float32 import assert_close
from xspec.runtime.activation_checkpoint import checkpoint_layers
from xspec.runtime.dropout_masks import HashedDropout
from xspec.runtime.step import TrainingStep

CASES = [("specs/tiny.xspec", {"dropout": 0.1}), ("specs/modern/llama.xspec", {}),
         ("specs/modern/qwen3_moe.xspec", {})]


def _step(spec, checkpointed: bool, masks: AbstractContextManager) -> tuple[TrainingStep, list[str]]:
    torch.manual_seed(0)
    model = spec.build("cpu").train()
    layers = checkpoint_layers(model, spec, lambda: masks) if checkpointed else []
    return TrainingStep(model, label_smoothing=0.1, aux_loss_coef=0.01), layers


def _run(step: TrainingStep, inputs: tuple, masks: AbstractContextManager
         ) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """The loss, the gradients, and the bytes the forward kept for the backward."""
    kept = 0

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal kept
        kept += tensor.numel() * tensor.element_size()
        return tensor

    torch.manual_seed(1)                    # the same dropout masks for both
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor), masks:
        loss = step(*inputs)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in step.named_parameters() if p.grad is not None}, kept


@pytest.mark.parametrize("path, overrides", CASES, ids=lambda case: str(case).split("/")[-1].removesuffix(".xspec"))
@pytest.mark.parametrize("hashed", [False, True], ids=["torch_masks", "hashed_masks"])
def test_a_checkpointed_step_has_the_plain_loss_and_gradients_and_keeps_less(path, overrides, hashed):
    spec = xspec.compile(path, overrides={"layers": 2, **overrides})
    tokens = torch.randint(4, spec.vocab_size, (3, 12))
    labels = torch.randint(4, spec.vocab_size, (3, 12))
    inputs = (labels, tokens[:, :9], tokens, tokens[:, :9] == 0) if spec.has_encoder else (labels, tokens)
    masks = HashedDropout() if hashed else nullcontext()
    plain, _ = _step(spec, False, masks)
    checkpointed, layers = _step(spec, True, masks)
    assert len(layers) == 2 * (2 if spec.has_encoder else 1)
    assert checkpointed.state_dict().keys() == plain.state_dict().keys()
    loss, grads, kept = _run(plain, inputs, masks)
    loss_again, grads_again, kept_again = _run(checkpointed, inputs, masks)
    assert_close(loss_again, loss, rel=1e-6)
    assert grads_again.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grads_again[name], grad, rtol=1e-5, atol=1e-6 * float(grad.abs().max()) + 1e-12)
    assert kept_again < 0.6 * kept
