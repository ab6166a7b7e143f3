"""The mixture-of-experts pieces against a reference written here token by token from their definition (every
router and activation, with and without biases), the compiled path (the grouped op the runtime registers)
against the eager one, and the load-balancing loss against the Switch Transformer's formula."""

import pytest
import torch
import torch.nn.functional as F

from xspec.nn import (BiasedExperts, BiasedMixtureOfExperts, ClampedSwiGLU, Experts, GeGLU, MixtureOfExperts, Router,
                      SwiGLU, TopKRouter)
from xspec.runtime.expert_products import register_expert_products
from xspec.runtime.load_balance import count_loads, load_balancing_loss
from float32 import assert_close

ACTIVATIONS = {"silu": SwiGLU, "gelu_tanh": GeGLU}


def experts(experts=5, top_k=2, normalize=True, scoring="softmax", routing_scale=1.0, router_bias=False,
            activation="silu", swiglu_limit=7.0, bias=False, groups=1, top_groups=1,
            score_correction=False) -> MixtureOfExperts:
    """The module the compiler writes for `moe(x, ...)` with these options."""
    torch.manual_seed(0)
    router = Router(16, experts, top_k, bias=router_bias, normalize=normalize, scoring=scoring,
                    corrected=score_correction, groups=groups, top_groups=top_groups, scale=routing_scale)
    if score_correction:  # a load correction that changes choices
        router.e_score_correction_bias.copy_(torch.randn(experts) * 0.5)
    act = ClampedSwiGLU(swiglu_limit, 1.702) if activation == "clamped_swiglu" else ACTIVATIONS[activation]()
    module = (BiasedMixtureOfExperts if bias else MixtureOfExperts)(16, experts, 12, router, act)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    return module


def token_by_token(module: MixtureOfExperts, x: torch.Tensor) -> torch.Tensor:
    """Each token through its chosen experts, one at a time."""
    out = torch.zeros_like(x)
    for t, token in enumerate(x):
        router, activation = module.router, module.activation
        logits = token @ router.weight.T + (router.bias if router.bias is not None else 0)
        scores = logits.sigmoid() if router.scoring == "sigmoid" else logits.softmax(-1)
        # DeepSeek-V3 (§2.1.2): chosen by the corrected scores, among the best groups; weighted by the scores.
        corrected = scores + (router.e_score_correction_bias if router.e_score_correction_bias is not None else 0)
        candidates = range(len(scores))
        if router.groups > 1:
            size = len(scores) // router.groups
            group_score = [corrected[g * size:(g + 1) * size].topk(2).values.sum() for g in range(router.groups)]
            best = sorted(range(router.groups), key=lambda g: -group_score[g])[:router.top_groups]
            candidates = [e for e in range(len(scores)) if e // size in best]
        chosen = torch.tensor(sorted(candidates, key=lambda e: -corrected[e])[:router.top_k])
        weights = scores[chosen]
        if router.normalize:
            weights = weights / weights.sum()
        for weight, e in zip(weights * router.scale, chosen.tolist()):
            def linear(name, h):
                bias = getattr(module, f"{name}_bias", None)
                return h @ getattr(module, name)[e].T + (bias[e] if bias is not None else 0)
            gate, up = linear("gate", token), linear("up", token)
            if isinstance(activation, SwiGLU):
                hidden = F.silu(gate) * up
            elif isinstance(activation, GeGLU):
                hidden = F.gelu(gate, approximate="tanh") * up
            else:
                gate, up = gate.clamp(max=activation.limit), up.clamp(-activation.limit, activation.limit)
                hidden = (up + 1) * gate * torch.sigmoid(activation.alpha * gate)
            out[t] += weight * linear("down", hidden)
    return out


OPTIONS = [{}, {"normalize": False}, {"scoring": "sigmoid", "routing_scale": 2.5}, {"activation": "gelu_tanh"},
           {"activation": "clamped_swiglu", "bias": True, "router_bias": True, "swiglu_limit": 0.5},
           {"top_k": 5}, {"top_k": 1, "experts": 1},
           {"scoring": "sigmoid", "experts": 8, "top_k": 3, "groups": 4, "top_groups": 2, "score_correction": True,
            "routing_scale": 2.5},
           {"scoring": "sigmoid", "score_correction": True}, {"experts": 6, "groups": 3, "top_groups": 1}]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "+".join(f"{k}={v}" for k, v in o.items()) or "mixtral")
@torch.no_grad()
def test_grouped_experts_compute_each_tokens_chosen_experts(options):
    module = experts(**options)
    x = torch.randn(2, 7, 16)
    assert_close(module(x), token_by_token(module, x.flatten(0, 1)).view(2, 7, 16))


class RouterAndExperts(torch.nn.Module):
    """The `router` and `experts` ops' two modules, as a spec's block calls them."""

    def __init__(self, gate: TopKRouter, experts: Experts) -> None:
        super().__init__()
        self.gate, self.experts = gate, experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.gate(x))


@torch.no_grad()
def router_and_experts(module: MixtureOfExperts) -> RouterAndExperts:
    """`module`'s router and experts as the `router` and `experts` ops' two modules (transformers' layout),
    of the same weights: gate_up_proj is gate's rows, then up's."""
    old = module.router
    router = TopKRouter(16, old.out_features, old.top_k, bias=old.bias is not None, normalize=old.normalize,
                        scoring=old.scoring, corrected=old.e_score_correction_bias is not None, groups=old.groups,
                        top_groups=old.top_groups, scale=old.scale)
    kind = BiasedExperts if isinstance(module, BiasedMixtureOfExperts) else Experts
    bank = kind(16, old.out_features, module.gate.size(1), old.top_k, module.activation)
    router.load_state_dict(old.state_dict())
    bank.gate_up_proj.copy_(torch.cat([module.gate, module.up], dim=1))
    bank.down_proj.copy_(module.down)
    if isinstance(module, BiasedMixtureOfExperts):
        bank.gate_up_proj_bias.copy_(torch.cat([module.gate_bias, module.up_bias], dim=1))
        bank.down_proj_bias.copy_(module.down_bias)
    return RouterAndExperts(router, bank)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "+".join(f"{k}={v}" for k, v in o.items()) or "mixtral")
@torch.no_grad()
def test_a_router_and_a_bank_of_experts_compute_the_one_modules_mixture(options):
    """The routing passes as weights per expert, zero for those not chosen; the bank runs each token's
    top_k of them. Same outputs, and the same record for the load-balancing loss."""
    module = experts(**options)
    pair = router_and_experts(module)
    x = torch.randn(2, 7, 16)
    routing = pair.gate(x)
    assert routing.shape == (2, 7, module.gate.size(0))
    assert ((routing != 0).sum(-1) == pair.gate.top_k).all()
    assert_close(pair.experts(x, routing), module(x))
    assert_close(load_balancing_loss(pair), load_balancing_loss(module))


@pytest.mark.parametrize("form", ["moe", "router+experts"])
def test_the_compiled_path_gives_the_eager_outputs_and_gradients(form):
    """While torch.compile traces, the experts' products go through the registered op (xspec::grouped_linear)."""
    register_expert_products()
    module = experts(bias=True, activation="clamped_swiglu")
    if form != "moe":
        module = router_and_experts(module)
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
    first_logits, second_logits = x @ first.router.weight.T, y @ second.router.weight.T
    probabilities = torch.cat([first_logits.softmax(-1), second_logits.softmax(-1)])
    choices = torch.cat([F.one_hot(first_logits.topk(2).indices, 5).sum(1),
                         F.one_hot(second_logits.topk(3).indices, 5).sum(1)]).float()
    expected = 5 * (choices.mean(0) * probabilities.mean(0)).sum()
    assert_close(load_balancing_loss(holder), expected)
    # A router indifferent between its experts (uniform P): the loss is top_k, whichever experts the ties choose.
    uniform = experts(experts=4, top_k=1)
    with torch.no_grad():
        uniform.router.weight.zero_()
    uniform(torch.randn(8, 16))
    assert_close(load_balancing_loss(uniform), torch.tensor(1.0))


@torch.no_grad()
def test_deepseeks_correction_moves_each_bias_toward_the_experts_that_took_fewer_tokens():
    """§2.1.2: after an update, b_e += gamma * sign(mean load - load_e), the loads counted over the update's
    passes (padding left out); routers without the correction are left alone."""
    from xspec.runtime.distributed import Context
    from xspec.runtime.step import TrainingStep

    corrected = experts(experts=6, top_k=2, scoring="sigmoid", score_correction=True)
    plain = experts()
    model = torch.nn.ModuleDict({"corrected": corrected, "plain": plain})
    step = TrainingStep(model, label_smoothing=0.0, expert_bias_rate=0.01)
    assert step.corrected == [corrected] and step.expert_loads.shape == (6,)
    before = corrected.router.e_score_correction_bias.clone()
    x, y = torch.randn(4, 16), torch.randn(3, 16)
    chosen = [corrected.router(x)[1], corrected.router(y)[1]]
    for tokens, counted in ((x, torch.ones(2, 2, dtype=torch.bool)), (y, torch.tensor([[True, True, False]]))):
        corrected(tokens)  # a pass: the step counts what its mixtures routed
        plain(tokens)
        count_loads(step.corrected, step.expert_loads, counted)
    loads = torch.bincount(torch.cat([chosen[0].flatten(), chosen[1][:2].flatten()]), minlength=6).float()
    assert torch.equal(step.expert_loads, loads)
    step.correct_routers(Context(rank=0, world_size=1, device=torch.device("cpu")))
    assert_close(corrected.router.e_score_correction_bias, before + 0.01 * torch.sign(loads.mean() - loads))
    assert not step.expert_loads.any()  # cleared for the next update
    assert plain.router.e_score_correction_bias is None and plain.load_correction() is None
