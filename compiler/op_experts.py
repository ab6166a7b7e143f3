"""The mixture-of-experts op's entry in the op table: a router and a bank of gated feed-forward experts, as
one op (Shazeer et al., 2017; Switch, Fedus et al., 2022; Mixtral, Jiang et al., 2024).

    moe(x, experts, top_k, d_ff, scoring = "softmax", normalize = true, routing_scale = 1.0,
        router_bias = false, bias = false, activation = "silu", swiglu_limit = 7.0, swiglu_alpha = 1.702,
        groups = 1, top_groups = 1, score_correction = false)

Each token's router scores (softmax or sigmoid of x W_r) choose its `top_k` experts; their weights are
renormalized to sum to 1 (`normalize`, a checkpoint's norm_topk_prob) and scaled by `routing_scale`; the
token's output is the weighted sum of its experts' outputs. An expert is a gated feed-forward network,
down(act(gate x) * up x): SwiGLU (`silu`), GeGLU (`gelu_tanh`), or gpt-oss's clamped SwiGLU
(`clamped_swiglu`: gate clamped above at swiglu_limit, up to +-swiglu_limit, (up + 1) * gate * sigmoid(alpha
gate)). A shared expert that every token uses is a feed-forward block added beside it in the spec.
DeepSeek-V3's routing (§2.1.2) adds two options: `groups` of experts, a token choosing among those of its
`top_groups` best groups (each group scored by its two best experts; n_group, topk_group), and
`score_correction`, a bias per expert added to the scores for choosing only, which training moves to even
out the loads (e_score_correction_bias: state checkpoints keep, not a learned weight).

The module (xspec/nn/experts.py: a router, an activation and the experts, pieces chosen by the options)
records, each forward, what the load-balancing loss needs; training pools the records of every layer
(runtime/load_balance.py, Switch/Mixtral form) and adds it.
"""

from __future__ import annotations

import ast as pyast
from typing import Literal

from pydantic import Field

from .opdef import Attrs, Family, Inferred, Input, OpDef, Shapes, Written, size
from .python_code import call
from .shapes import ShapeError, TensorType, concrete_last, require

GLU_NAMES = {"silu": "SwiGLU", "gelu_tanh": "GeGLU", "clamped_swiglu": "clamped SwiGLU"}


class RoutingChoice(Attrs):
    """How a router chooses: shared by the `moe` op and the `router` op."""

    experts: int = Field(gt=0)  # num_local_experts
    top_k: int = Field(gt=0)  # num_experts_per_tok
    scoring: Literal["softmax", "sigmoid"] = "softmax"
    normalize: bool = True  # the top-k weights renormalized to sum to 1 (norm_topk_prob)
    routing_scale: float = 1.0  # the weights' scale (routed_scaling_factor)
    groups: int = Field(1, gt=0)  # the experts in groups, a token choosing among its top groups' (n_group)
    top_groups: int = Field(1, gt=0)  # topk_group
    score_correction: bool = False  # a bias per expert in the choice only (e_score_correction_bias)


class ExpertActivation(Attrs):
    """The experts' gated activation: shared by the `moe` op and the `experts` op."""

    d_ff: int = Field(gt=0)  # each expert's inner width (moe_intermediate_size)
    bias: bool = False  # the experts' projections have biases (gpt-oss)
    activation: Literal["silu", "gelu_tanh", "clamped_swiglu"] = "silu"
    swiglu_limit: float = 7.0  # clamped_swiglu
    swiglu_alpha: float = 1.702  # clamped_swiglu


class ExpertsAttrs(RoutingChoice, ExpertActivation):
    router_bias: bool = False


def _shape(shapes: Shapes, a: ExpertsAttrs) -> tuple[TensorType, Inferred]:
    x = require(shapes["x"], "the input")
    return x, {"d_model": concrete_last(x, "the input")}


def _check(a: ExpertsAttrs) -> list[tuple[str, str]]:
    return _routing_problems(a, a.routing_scale) + _activation_problems(a)


def _routing_problems(a: RoutingChoice, scale: float) -> list[tuple[str, str]]:
    problems = []
    if a.top_k > a.experts:
        problems.append(("top_k", f"top_k = {a.top_k} experts per token, but there are only {a.experts}"))
    if scale <= 0:
        problems.append(("routing_scale", f"routing_scale = {scale} scales the experts' weights: it must be "
                                          "positive"))
    if a.experts % a.groups:
        problems.append(("groups", f"groups = {a.groups} must divide the {a.experts} experts"))
    elif a.groups > 1 and a.experts // a.groups < 2:
        problems.append(("groups", f"groups = {a.groups} of {a.experts} experts: a group is scored by its two best "
                                   "experts, so each needs at least 2"))
    elif a.top_groups > a.groups:
        problems.append(("top_groups", f"top_groups = {a.top_groups} of only {a.groups} groups"))
    elif a.groups > 1 and a.top_k > a.top_groups * (a.experts // a.groups):
        problems.append(("top_k", f"top_k = {a.top_k} experts from {a.top_groups} groups of "
                                  f"{a.experts // a.groups}: too few to choose from"))
    return problems


def _activation_problems(a: ExpertActivation) -> list[tuple[str, str]]:
    if a.activation == "clamped_swiglu" and a.swiglu_limit <= 0:
        return [("swiglu_limit", f"swiglu_limit = {a.swiglu_limit} clamps to +-limit: it must be positive")]
    return []


def _expert_params(a: ExpertsAttrs, d_model: int) -> dict[str, tuple[int, ...]]:
    params: dict[str, tuple[int, ...]] = {"gate": (a.experts, a.d_ff, d_model), "up": (a.experts, a.d_ff, d_model),
                                          "down": (a.experts, d_model, a.d_ff)}
    if a.bias:
        params |= {"gate_bias": (a.experts, a.d_ff), "up_bias": (a.experts, a.d_ff), "down_bias": (a.experts, d_model)}
    return params


def _params(a: ExpertsAttrs, i: Inferred) -> dict[str, tuple[int, ...]]:
    d_model = size(i, "d_model")
    router = {"router.weight": (a.experts, d_model), **({"router.bias": (a.experts,)} if a.router_bias else {})}
    return {**router, **_expert_params(a, d_model)}


def _inactive(a: ExpertsAttrs, i: Inferred) -> int:
    """The weights of the experts a token does not choose: experts - top_k of them."""
    per_expert = sum(_prod(shape[1:]) for shape in _expert_params(a, size(i, "d_model")).values())
    return (a.experts - a.top_k) * per_expert


def _prod(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _flops(a: ExpertsAttrs, i: Inferred, n: int, n_in: dict[str, int]) -> dict[str, int]:
    """The router's scores for every expert, then each token through its top_k experts' three
    projections (what runs: tokens are grouped by expert, one product per expert)."""
    d_model = size(i, "d_model")
    return {"moe_router": 2 * n * d_model * a.experts, "moe_experts": 2 * n * a.top_k * 3 * d_model * a.d_ff}


EXPERT_INTERMEDIATES = 6


def _saved(a: ExpertsAttrs, i: Inferred, n: int, n_in: dict[str, int]) -> int:
    """The router's scores (logits, probabilities, the chosen ones' weights), and per chosen expert the
    token's input gathered, weighted and scattered back, and the activation's intermediates: about
    EXPERT_INTERMEDIATES of d_ff each (measured on CPUs over mixtral, qwen3_moe and gpt_oss: gate, up, the
    activation's steps, their product)."""
    return 3 * n * a.experts + n * a.top_k * (3 * size(i, "d_model") + EXPERT_INTERMEDIATES * a.d_ff)


def _module(a: ExpertsAttrs, i: Inferred, w: Written) -> pyast.expr:
    """MixtureOfExperts(d_model, experts, d_ff, router, activation), or its biased piece: the pieces of
    xspec/nn/experts.py this mixture uses."""
    d_model = w.width("x")
    experts = "BiasedMixtureOfExperts" if a.bias else "MixtureOfExperts"
    router = call("Router", d_model, w.attr("experts"), w.attr("top_k"), bias=w.attr("router_bias"),
                  **_router_options(a, w))
    return call(experts, d_model, w.attr("experts"), w.attr("d_ff"), router, _activation(a, w))


def _router_options(a: RoutingChoice, w: Written) -> dict[str, pyast.expr]:
    """A router's keywords beyond its sizes and bias: those the spec sets, or writes from its parameters."""
    options = {"normalize": w.attr("normalize")}
    if a.scoring != "softmax" or w.from_config("scoring"):
        options["scoring"] = w.attr("scoring")
    if a.score_correction or w.from_config("score_correction"):
        options["corrected"] = w.attr("score_correction")
    if a.groups > 1 or w.from_config("groups"):
        options |= {"groups": w.attr("groups"), "top_groups": w.attr("top_groups")}
    if a.routing_scale != 1 or w.from_config("routing_scale"):
        options["scale"] = w.attr("routing_scale")
    return options


def _activation(a: ExpertActivation, w: Written) -> pyast.expr:
    if a.activation == "clamped_swiglu":
        return call("ClampedSwiGLU", w.attr("swiglu_limit"), w.attr("swiglu_alpha"))
    return call({"silu": "SwiGLU", "gelu_tanh": "GeGLU"}[a.activation])


def _call(target: str, inputs: dict[str, pyast.expr], attrs: Attrs, cache: bool) -> pyast.expr:
    return call(f"self.{target}", inputs["x"])


def _details(a: ExpertsAttrs, i: Inferred) -> list[str]:
    total = sum(_prod(shape) for shape in _params(a, i).values())
    return [f"{a.experts} experts, top-{a.top_k} per token", _router_line(a), _experts_line(a),
            f"{total - _inactive(a, i):,} of {total:,} params active per token", "load-balancing loss (Switch)"]


def _router_line(a: RoutingChoice) -> str:
    router = f"router: {a.scoring}" + (", top-k renormalized" if a.normalize else "")
    if a.groups > 1:
        router += f", top {a.top_groups} of {a.groups} groups"
    if a.score_correction:
        router += ", load-corrected choice"
    if a.routing_scale != 1:
        router += f", × {a.routing_scale:g}"
    return router


def _experts_line(a: ExpertActivation) -> str:
    return f"{GLU_NAMES[a.activation]} experts, d_ff = {a.d_ff}" + (", biases" if a.bias else "")


EXPERTS = OpDef(
    name="moe", doc="a router choosing top_k of `experts` gated feed-forward experts per token, their outputs "
                    "weighted by the router (Shazeer et al., 2017; Fedus et al., 2022)",
    family=Family.EXPERTS, inputs=(Input("x"),), attrs=ExpertsAttrs, infer=_shape, params=_params, check=_check,
    module=_module, call=_call, title="Mixture of Experts", details=_details, flops=_flops, saved=_saved,
    inactive=_inactive, output_weight="down",
    state=lambda a, i: {"router.e_score_correction_bias": (a.experts,)} if a.score_correction else {},
    facts=lambda a, i: {"experts": a.experts, "top_k": a.top_k, "d_ff": a.d_ff},
)


# --- the router and the bank of experts as two ops (transformers' `mlp.gate` and `mlp.experts`) -------

class RouterAttrs(RoutingChoice):
    bias: bool = False


def _routing_shape(shapes: Shapes, a: RouterAttrs) -> tuple[TensorType, Inferred]:
    x = require(shapes["x"], "the input")
    return TensorType((*x.dims[:-1], a.experts)), {"d_model": concrete_last(x, "the input")}


def _router_params(a: RouterAttrs, i: Inferred) -> dict[str, tuple[int, ...]]:
    return {"weight": (a.experts, size(i, "d_model")), **({"bias": (a.experts,)} if a.bias else {})}


def _router_module(a: RouterAttrs, i: Inferred, w: Written) -> pyast.expr:
    return call("TopKRouter", w.width("x"), w.attr("experts"), w.attr("top_k"), bias=w.attr("bias"),
                **_router_options(a, w))


ROUTER = OpDef(
    name="router", doc="each token's top_k of `experts` experts and their weights, as weights per expert (zero "
                       "for those not chosen), for an `experts` op to read (Shazeer et al., 2017)",
    family=Family.EXPERTS, inputs=(Input("x"),), attrs=RouterAttrs, infer=_routing_shape, params=_router_params,
    check=lambda a: _routing_problems(a, a.routing_scale), module=_router_module,
    call=lambda target, inputs, a, cache: call(f"self.{target}", inputs["x"]), title="Router",
    details=lambda a, i: [f"{a.experts} experts, top-{a.top_k} per token", _router_line(a),
                          "load-balancing loss (Switch)"],
    flops=lambda a, i, n, n_in: {"moe_router": 2 * n * size(i, "d_model") * a.experts},
    saved=lambda a, i, n, n_in: 3 * n * a.experts, width="experts",
    state=lambda a, i: {"e_score_correction_bias": (a.experts,)} if a.score_correction else {},
    facts=lambda a, i: {"experts": a.experts, "top_k": a.top_k},
)


class BankAttrs(ExpertActivation):
    top_k: int = Field(gt=0)  # the experts each token goes through: its router's top_k


def _bank_shape(shapes: Shapes, a: BankAttrs) -> tuple[TensorType, Inferred]:
    x, routing = require(shapes["x"], "the input"), require(shapes["routing"], "the routing")
    if routing.dims[:-1] != x.dims[:-1]:
        raise ShapeError(f"the routing {routing} must weigh each position of the input {x}")
    experts = concrete_last(routing, "the routing")
    if a.top_k > experts:
        raise ShapeError(f"top_k = {a.top_k} experts per token, but the routing weighs only {experts}")
    return x, {"d_model": concrete_last(x, "the input"), "experts": experts}


def _bank_params(a: BankAttrs, i: Inferred) -> dict[str, tuple[int, ...]]:
    experts, d_model = size(i, "experts"), size(i, "d_model")
    params: dict[str, tuple[int, ...]] = {"gate_up_proj": (experts, 2 * a.d_ff, d_model),
                                          "down_proj": (experts, d_model, a.d_ff)}
    if a.bias:
        params |= {"gate_up_proj_bias": (experts, 2 * a.d_ff), "down_proj_bias": (experts, d_model)}
    return params


def _bank_inactive(a: BankAttrs, i: Inferred) -> int:
    """The weights of the experts a token does not go through."""
    per_expert = sum(_prod(shape[1:]) for shape in _bank_params(a, i).values())
    return (size(i, "experts") - a.top_k) * per_expert


def _bank_module(a: BankAttrs, i: Inferred, w: Written) -> pyast.expr:
    """Experts(d_model, experts, d_ff, top_k, activation), or its biased piece (xspec/nn/experts.py)."""
    return call("BiasedExperts" if a.bias else "Experts", w.width("x"), w.width("routing"), w.attr("d_ff"),
                w.attr("top_k"), _activation(a, w))


def _bank_reads(a: BankAttrs, producers: dict[str, tuple[str, Attrs]]) -> list[tuple[str, str]]:
    """The routing is a router's, which chooses as many experts per token as the bank runs."""
    op, attrs = producers["routing"]
    if not isinstance(attrs, RouterAttrs):
        return [("routing", f"the routing must be a router's output (router(x, experts = ..., top_k = ...)), "
                            f"got {op}'s")]
    if attrs.top_k != a.top_k:
        return [("top_k", f"top_k = {a.top_k}, but the router chooses {attrs.top_k} experts per token")]
    return []


EXPERT_BANK = OpDef(
    name="experts", doc="a bank of gated feed-forward experts, each token through the top_k its routing weighs, "
                        "their outputs weighted by it (Fedus et al., 2022)",
    family=Family.EXPERTS, inputs=(Input("x"), Input("routing")), attrs=BankAttrs, infer=_bank_shape,
    params=_bank_params, check=_activation_problems, module=_bank_module,
    call=lambda target, inputs, a, cache: call(f"self.{target}", inputs["x"], inputs["routing"]),
    title="Mixture of Experts",
    details=lambda a, i: [_experts_line(a), f"top-{a.top_k} of {size(i, 'experts')} per token"],
    flops=lambda a, i, n, n_in: {"moe_experts": 2 * n * a.top_k * 3 * size(i, "d_model") * a.d_ff},
    saved=lambda a, i, n, n_in: n * a.top_k * (3 * size(i, "d_model") + EXPERT_INTERMEDIATES * a.d_ff),
    inactive=_bank_inactive, output_weight="down_proj",
    facts=lambda a, i: {"d_ff": a.d_ff}, reads=_bank_reads,
)
