"""The 2024-25 Transformer family as shipped specs (specs/modern/), each against its Hugging Face class
(transformers, a test-only extra; no download: small random models built from configurations) with the same
weights, mapped as tests/hf_families.py names: parameter counts for several size combinations, logits over
sequences longer than the sliding window, greedy generation with the decoding cache against `generate`; and
each spec counted, drawn, run under bf16 autocast and trained a few steps."""

from __future__ import annotations

import functools
import math
import re

import pytest
import torch

import xspec
from float32 import assert_close
from hf_families import BY_NAME, FAMILIES, Family
from xspec.nn import Experts
from xspec.runtime.cache import DecoderCache
from xspec.runtime.load_balance import load_balancing_loss

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
NAMES = [family.name for family in FAMILIES]


@functools.cache
def pair(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the spec's model, Hugging Face's) at the family's first sizes, with the same weights."""
    family = BY_NAME[name]
    sizes = family.sizes[0]
    reference = family.hf_model(sizes)
    model = compiled(family, sizes).build(device="cpu").eval()
    model.load_state_dict(family.weights(reference.state_dict(), sizes))
    return model, reference


def compiled(family: Family, sizes: dict):
    return xspec.compile(family.spec, overrides={**sizes, **family.overrides})


def tokens(family: Family, length: int, rows: int = 2, seed: int = 2) -> torch.Tensor:
    return torch.randint(0, family.sizes[0]["vocab"], (rows, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name, index", [(f.name, i) for f in FAMILIES for i in range(len(f.sizes))])
def test_parameter_count_equals_hugging_faces(name, index):
    family = BY_NAME[name]
    sizes = family.sizes[index]
    reference = family.hf_model(sizes, device="meta")  # shapes only
    assert compiled(family, sizes).parameters == sum(p.numel() for p in reference.parameters())


def random_sizes(family: Family, seed: int) -> dict:
    """Sizes drawn at random (seeded), with what the family's own parameters need kept from its first
    combination: heads that the key/value heads divide, a head size of 8, 16, 24 or 32."""
    import random

    draw = random.Random(f"{family.name}-{seed}")
    kv_heads = draw.choice([1, 2, 3])
    heads = kv_heads * draw.choice([1, 2, 4])
    return {**family.sizes[0], "vocab": draw.randint(50, 600), "layers": draw.randint(1, 4), "heads": heads,
            "kv_heads": kv_heads, "d_model": heads * 8 * draw.randint(1, 4), "d_ff": draw.randint(8, 200)}


@pytest.mark.parametrize("name", NAMES)
def test_tensor_names_are_transformers_after_the_top_level_module(name):
    """The spec's tensors carry transformers' names (the spec's `decoder.` for transformers' `model.`, whose
    output head stands beside it), key for key."""
    family = BY_NAME[name]
    sizes = family.sizes[0]
    theirs = {re.sub(r"^model\.", "", key) for key in family.hf_model(sizes, device="meta").state_dict()}
    spec = compiled(family, sizes)
    ours = {key.removeprefix("decoder.") for key in {**spec.param_shapes, **spec.state_shapes}
            if not key.startswith("mtp.")}
    assert ours == theirs


@pytest.mark.parametrize("name, seed", [(f.name, seed) for f in FAMILIES for seed in range(3)])
def test_parameter_count_equals_hugging_faces_at_random_sizes(name, seed):
    family = BY_NAME[name]
    sizes = random_sizes(family, seed)
    reference = family.hf_model(sizes, device="meta")
    assert compiled(family, sizes).parameters == sum(p.numel() for p in reference.parameters()), sizes


@pytest.mark.parametrize("name", NAMES)
@torch.no_grad()
def test_logits_equal_hugging_faces_over_sequences_longer_than_the_window(name):
    """Longer than a sliding window, and than a recurrent layer's chunk (Qwen3-Next's Gated DeltaNet: 64)."""
    family = BY_NAME[name]
    model, reference = pair(name)
    length = max(24, 3 * family.window, family.chunk + 8)
    text = tokens(family, length)
    assert_close(model(text), reference(text).logits)


@pytest.mark.parametrize("name", NAMES)
@torch.no_grad()
def test_greedy_generation_with_the_cache_equals_hugging_faces_generate(name):
    family = BY_NAME[name]
    model, reference = pair(name)
    prompt, new = tokens(family, 5, seed=3), 16                   # 21 positions: past every window
    expected = reference.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    cache = DecoderCache()
    logits, sequence, steps = model.decode(prompt, cache=cache), prompt, []
    for _ in range(new):
        steps.append(logits[:, -1])
        token = logits[:, -1].argmax(dim=-1, keepdim=True)
        sequence = torch.cat([sequence, token], dim=1)
        logits = model.decode(token, cache=cache)
    assert torch.equal(sequence, expected)
    # The cached steps' logits are the full forward's.
    assert_close(torch.stack(steps, dim=1), model(sequence)[:, 4:-1])


@pytest.mark.parametrize("name", NAMES)
def test_a_bf16_autocast_forward_runs(name):
    family = BY_NAME[name]
    model, _ = pair(name)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens(family, 19))
    assert logits.shape == (2, 19, family.sizes[0]["vocab"]) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name", NAMES)
def test_trains_a_few_steps(name):
    """The training step (runtime/step.py) on one batch, four times: the loss falls, and a mixture of
    experts adds its load-balancing loss."""
    from xspec.runtime.step import TrainingStep

    family = BY_NAME[name]
    spec = compiled(family, family.sizes[0])
    torch.manual_seed(0)
    step = TrainingStep(spec.build(device="cpu"), label_smoothing=0.0, aux_loss_coef=spec.train.router_aux_loss_coef)
    optimizer = torch.optim.Adam(step.parameters(), lr=3e-3)
    batch = tokens(family, 17)
    losses = []
    for _ in range(4):
        loss = step(batch[:, 1:], batch[:, :-1])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    if family.experts:
        sides = step.take_side_losses()
        assert sides is not None and step.side_names == ("aux_loss",) and 0 < sides[0].item() / (4 * 32) < 100
    else:
        assert step.take_side_losses() is None


@pytest.mark.parametrize("name", NAMES)
def test_counted_and_drawn(name):
    from xspec.stats import compute
    from xspec.viz import architecture_dot

    family = BY_NAME[name]
    spec = compiled(family, family.sizes[0])
    stats = compute(spec, length=32)
    assert stats.parameters == spec.parameters
    assert stats.active_parameters < spec.parameters if family.experts else stats.active_parameters == spec.parameters
    assert stats.flops.total > 0
    dot = architecture_dot(spec).source
    attention = "Masked Multi-Head Latent Attention" if name == "deepseek_v3" else "Multi-Head Attention"
    assert "Mixture of Experts" in dot if family.experts else attention in dot


def test_layers_of_different_kinds_are_drawn_one_of_each():
    from xspec.viz import architecture_dot

    spec = xspec.compile("specs/modern/gemma3.xspec", overrides={"layers": 12})
    dot = architecture_dot(spec).source
    assert "layers 0-4, 6-10: " in dot and "layers 5, 11: " in dot and "2 kinds of layer, run as (A×5 B)×2" in dot
    assert "A: 10×" in dot and "B: 2×" in dot
    assert dot.count("Masked Multi-Head Attention") == 2 and "sliding window 8" in dot and "linear ×8" in dot
    uniform = architecture_dot(xspec.compile("specs/modern/mixtral.xspec")).source
    assert "kinds of layer" not in uniform and uniform.count("Mixture of Experts") == 1


@pytest.mark.parametrize("layers, expected", [
    ([0, 0, 0, 3] * 12, "(A×3 B)×12"),                                  # Qwen3-Next
    ([0] * 5 + [5] + [0] * 5 + [5] + [0, 0], "(A×5 B)×2 A×2"),          # Gemma 3, 14 layers
    ([0, 1, 0, 1, 0, 5, 1, 0, 1], "A B A B A C B A B"),                # no period: as it runs
    ([0, 0, 2, 2, 2], "A×2 B×3"),
])
def test_a_hybrid_schedule_is_written_as_it_runs(layers, expected):
    from xspec.viz.view import kind_letter, schedule

    kinds = {"layers": dict(enumerate(layers))}
    assert schedule(kinds, "layers") == expected
    assert kind_letter(kinds, "layers", layers[-1]) == expected.replace("(", "").replace(")", "").split()[-1][0]


# --- the mixture of experts: the router's choices and the load-balancing loss --------------------------

@pytest.mark.parametrize("name", [f.name for f in FAMILIES if f.experts])
@torch.no_grad()
def test_router_choices_and_auxiliary_loss_equal_hugging_faces(name):
    family = BY_NAME[name]
    model, reference = pair(name)
    text = tokens(family, 23)
    out = reference(text, output_router_logits=True)
    assert_close(model(text), out.logits)
    layers = [layer for layer in model.decoder.layers if isinstance(getattr(layer.mlp, "experts", None), Experts)]
    assert len(layers) == len(out.router_logits)
    hidden = torch.randn(40, family.sizes[0]["d_model"])
    for layer, hf_layer in zip(layers, [hf for hf in reference.model.layers if hasattr(hf.mlp, "experts")]):
        router = getattr(hf_layer.mlp, "router", None) or hf_layer.mlp.gate
        _, hf_weights, hf_chosen = router(hidden)
        router = getattr(layer.mlp, "router", None) or layer.mlp.gate
        weights, chosen, _ = router.route(hidden)
        assert torch.equal(chosen.sort(dim=-1).values, hf_chosen.sort(dim=-1).values)
        assert_close(weights.gather(1, chosen.argsort(dim=-1)), hf_weights.float().gather(1, hf_chosen.argsort(dim=-1)))
    if name in ("deepseek_v3", "glm4_moe"):  # balanced by the correction bias: transformers computes no auxiliary loss
        return
    top_k = family.sizes[0].get("num_experts_per_tok")
    sizes = family.sizes[0]
    experts = sizes.get("num_local_experts", sizes.get("num_experts", sizes.get("n_routed_experts")))
    expected = transformers.models.mixtral.modeling_mixtral.load_balancing_loss_func(
        out.router_logits, experts, top_k)
    assert_close(load_balancing_loss(model), expected)
    if name != "deepseek_v2":  # transformers' DeepseekV2 computes the router's logits but no auxiliary loss
        assert_close(out.aux_loss, expected)
    # Padding (the end of the shorter row) is left out, as transformers leaves out what the attention mask does.
    counted = torch.ones(text.shape, dtype=torch.bool)
    counted[-1, 15:] = False
    masked = reference(text, attention_mask=counted.long(), output_router_logits=True)
    model(text)
    expected = transformers.models.mixtral.modeling_mixtral.load_balancing_loss_func(
        masked.router_logits, experts, top_k, counted.long())
    assert_close(load_balancing_loss(model, counted), expected)
    assert not torch.allclose(load_balancing_loss(model), expected)


@torch.no_grad()
def test_the_shared_expert_adds_a_gated_feed_forward_every_token_passes_through():
    spec = xspec.compile("specs/modern/qwen3_moe.xspec", overrides={"shared_expert_intermediate_size": 24})
    torch.manual_seed(0)
    layer = spec.build(device="cpu").eval().decoder.layers[0]
    ffn = layer.mlp
    x = torch.randn(2, 5, spec.params["d_model"])
    shared = ffn.shared_expert
    expected = ffn.experts(x, ffn.gate(x)) + torch.sigmoid(ffn.shared_expert_gate(x)) * shared.down_proj(
        torch.nn.functional.silu(shared.gate_proj(x)) * shared.up_proj(x))
    assert_close(ffn(x), expected)


@pytest.mark.parametrize("name", ["gemma3", "mixtral"])
def test_flops_of_a_windowed_and_a_mixture_of_experts_spec_match_what_runs(name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from xspec.compiler.cost import flops

    family = BY_NAME[name]
    spec = compiled(family, family.sizes[0])
    model = spec.build(device="cpu").eval()
    length = 3 * family.window
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(tokens(family, length, rows=1))
    assert counter.get_total_flops() == flops(spec, length).total


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss", "mixtral"])
def test_model_and_loss_trace_as_one_graph(name):
    """torch.compile sees one graph, no break, for soft caps, sinks, windows and the mixture of experts
    (dynamo's trace; the compile test of the training step covers inductor)."""
    from xspec.runtime.step import TrainingStep

    family = BY_NAME[name]
    spec = compiled(family, family.sizes[0])
    step = TrainingStep(spec.build(device="cpu"), label_smoothing=0.1, aux_loss_coef=0.01)
    batch = tokens(family, 13)
    explained = torch._dynamo.explain(step)(batch[:, 1:], batch[:, :-1])
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_each_spec_cites_its_source_and_overrides_little():
    """A comment naming the paper or model card it follows, and a short text (the families extend each other)."""
    for family in FAMILIES:
        text = open(family.spec).read()
        assert text.startswith("# ") and ("et al." in text or "Model Card" in text or "Team" in text), family.spec
        assert len(text.splitlines()) <= 60, family.spec
    assert math.isclose(xspec.compile("specs/modern/gemma3.xspec").params["rope_theta"], 1e6)
