"""The mixture-of-experts module against a reference written here token by token from its definition (every
router and expert option), its compiled path (the registered grouped op) against its eager one, and the
load-balancing loss against the Switch Transformer's formula."""

import pytest
import torch
import torch.nn.functional as F

from xspec.compiler.prelude import MixtureOfExperts
from float32 import assert_close


def experts(**options) -> MixtureOfExperts:
    torch.manual_seed(0)
    module = MixtureOfExperts(16, **{"experts": 5, "top_k": 2, "d_ff": 12, "normalize": True, **options})
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    return module


def token_by_token(module: MixtureOfExperts, x: torch.Tensor) -> torch.Tensor:
    """Each token through its chosen experts, one at a time."""
    out = torch.zeros_like(x)
    for t, token in enumerate(x):
        logits = module.router(token)
        scores = logits.softmax(-1) if module.scoring == "softmax" else logits.sigmoid()
        weights, chosen = scores.topk(module.top_k)
        if module.normalize:
            weights = weights / weights.sum()
        for weight, e in zip(weights * module.routing_scale, chosen.tolist()):
            def linear(name, h):
                bias = getattr(module, f"{name}_bias")
                return h @ getattr(module, name)[e].T + (bias[e] if bias is not None else 0)
            gate, up = linear("gate", token), linear("up", token)
            if module.activation == "silu":
                hidden = F.silu(gate) * up
            elif module.activation == "gelu_tanh":
                hidden = F.gelu(gate, approximate="tanh") * up
            else:
                gate, up = gate.clamp(max=module.swiglu_limit), up.clamp(-module.swiglu_limit, module.swiglu_limit)
                hidden = (up + 1) * gate * torch.sigmoid(module.swiglu_alpha * gate)
            out[t] += weight * linear("down", hidden)
    return out


OPTIONS = [{}, {"normalize": False}, {"scoring": "sigmoid", "routing_scale": 2.5}, {"activation": "gelu_tanh"},
           {"activation": "clamped_swiglu", "bias": True, "router_bias": True, "swiglu_limit": 0.5},
           {"top_k": 5}, {"top_k": 1, "experts": 1}]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "+".join(f"{k}={v}" for k, v in o.items()) or "mixtral")
@torch.no_grad()
def test_grouped_experts_compute_each_tokens_chosen_experts(options):
    module = experts(**options)
    x = torch.randn(2, 7, 16)
    assert_close(module(x), token_by_token(module, x.flatten(0, 1)).view(2, 7, 16))


def test_the_compiled_path_gives_the_eager_outputs_and_gradients():
    """While torch.compile traces, the experts' products go through the registered op (xspec::grouped_linear)."""
    module = experts(bias=True, activation="clamped_swiglu")
    x = torch.randn(3, 5, 16, requires_grad=True)
    eager = module(x)
    eager.square().sum().backward()
    grads = [x.grad.clone()] + [p.grad.clone() for p in module.parameters()]
    x.grad = None
    module.zero_grad()
    compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    out.square().sum().backward()
    assert_close(out, eager)
    for expected, actual in zip(grads, [x.grad] + [p.grad for p in module.parameters()]):
        assert_close(actual, expected)


@torch.no_grad()
def test_the_load_balancing_loss_is_switchs_pooled_over_layers():
    first, second = experts(), experts(top_k=3)
    x, y = torch.randn(11, 16), torch.randn(11, 16)
    first(x), second(y)
    holder = torch.nn.ModuleList([first, second])
    # Switch (Fedus et al., 2022, eq. 4-6): N * sum_i f_i * P_i, f_i the fraction of choices to expert i
    # (here per token, as top-k Mixtral counts it) and P_i its mean router probability, over both layers.
    probabilities = torch.cat([first.router(x).softmax(-1), second.router(y).softmax(-1)])
    choices = torch.cat([F.one_hot(first.router(x).topk(2).indices, 5).sum(1),
                         F.one_hot(second.router(y).topk(3).indices, 5).sum(1)]).float()
    expected = 5 * (choices.mean(0) * probabilities.mean(0)).sum()
    assert_close(MixtureOfExperts.auxiliary_loss(holder), expected)
    # A router indifferent between its experts (uniform P): the loss is top_k, whichever experts the ties choose.
    uniform = experts(experts=4, top_k=1)
    with torch.no_grad():
        uniform.router.weight.zero_()
    uniform(torch.randn(8, 16))
    assert_close(MixtureOfExperts.auxiliary_loss(uniform), torch.tensor(1.0))
