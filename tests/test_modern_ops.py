"""The Transformer family's newer ops against independent references: RMSNorm, grouped-query attention,
rotary positions, ALiBi, GLU-style feed-forwards written in specs; and specs/modern/llama.xspec against
Hugging Face's LlamaForCausalLM (a test-only extra) with the same weights."""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import xspec
from xspec.nn import Attention, RotaryEmbedding
from xspec.runtime.cache import DecoderCache
from xspec.viz.attention import scores_inputs, sdpa_weights
from attention_pieces import compose, turned
from float32 import assert_close

LLAMA = "specs/modern/llama.xspec"
alibi_slopes = Attention.alibi_slopes


def only_attention(**kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    if kwargs.get("rotary") is True:
        kwargs["rotary"] = RotaryEmbedding(8, 10000.0)
    return compose(32, heads=4, d_k=8, d_v=8, bias=False, **kwargs).eval()


@torch.no_grad()
def test_grouped_query_attention_repeats_each_key_value_head_for_its_group():
    attention = only_attention(kv_heads=2, causal=True)
    x = torch.randn(2, 5, 32)
    q = attention.q_proj(x).unflatten(-1, (4, 8)).transpose(1, 2)         # [B, 4, T, 8]
    k = attention.k_proj(x).unflatten(-1, (2, 8)).transpose(1, 2)         # [B, 2, T, 8]
    v = attention.v_proj(x).unflatten(-1, (2, 8)).transpose(1, 2)
    # Query heads 0 and 1 read key/value head 0; heads 2 and 3 read head 1.
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(8)
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    expected = attention.o_proj((scores.softmax(-1) @ v).transpose(1, 2).flatten(2))
    assert_close(attention(x, x, x), expected)


def rotate_by_pairs(x: torch.Tensor, start: int, base: float = 10000.0) -> torch.Tensor:
    """RoPE written from its definition, one 2-D rotation per feature pair (i, i + d/2)."""
    d = x.size(-1)
    out = torch.empty_like(x)
    for t in range(x.size(-2)):
        for i in range(d // 2):
            angle = (start + t) * base ** (-2 * i / d)
            a, b = x[..., t, i], x[..., t, i + d // 2]
            out[..., t, i] = a * math.cos(angle) - b * math.sin(angle)
            out[..., t, i + d // 2] = a * math.sin(angle) + b * math.cos(angle)
    return out


@torch.no_grad()
def test_rotary_positions_rotate_each_feature_pair_by_its_angle():
    attention = only_attention(rotary=True)
    x = torch.randn(2, 4, 6, 8)
    assert_close(turned(attention.rotary, x, start=3), rotate_by_pairs(x, start=3))


@torch.no_grad()
def test_rotary_scores_depend_on_relative_positions_only():
    attention = only_attention(rotary=True)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    near = turned(attention.rotary, q, 7) @ turned(attention.rotary, k, 5).transpose(-2, -1)
    far = turned(attention.rotary, q, 107) @ turned(attention.rotary, k, 105).transpose(-2, -1)
    assert_close(near, far)


def test_alibi_slopes_follow_the_paper():
    assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # 6 heads: the 4 slopes of 4 heads, then slopes 1 and 3 of 8 heads.
    expected = [2 ** (-8 * (i + 1) / 4) for i in range(4)] + [2 ** (-8 * 1 / 8), 2 ** (-8 * 3 / 8)]
    assert_close(alibi_slopes(6), torch.tensor(expected))


@torch.no_grad()
def test_alibi_biases_scores_by_distance():
    attention = only_attention(alibi=True, causal=True)
    x = torch.randn(1, 5, 32)
    q = attention.q_proj(x).unflatten(-1, (4, 8)).transpose(1, 2)
    k = attention.k_proj(x).unflatten(-1, (4, 8)).transpose(1, 2)
    v = attention.v_proj(x).unflatten(-1, (4, 8)).transpose(1, 2)
    distance = torch.arange(5)[:, None] - torch.arange(5)[None, :]
    bias = -alibi_slopes(4)[:, None, None] * distance
    scores = (q @ k.transpose(-2, -1) / math.sqrt(8) + bias).masked_fill(distance < 0, float("-inf"))
    expected = attention.o_proj((scores.softmax(-1) @ v).transpose(1, 2).flatten(2))
    assert_close(attention(x, x, x), expected)


@torch.no_grad()
def test_rms_norm_and_a_swiglu_written_in_the_spec():
    spec = xspec.compile(LLAMA)
    model = spec.build(device="cpu").eval()
    layer = model.decoder.layers[0]
    x = torch.randn(2, 3, 128)
    reference = torch.nn.RMSNorm(128, eps=1e-6)
    reference.weight.copy_(torch.rand(128))
    layer.input_layernorm.weight.copy_(reference.weight)
    assert_close(layer.input_layernorm(x), reference(x))
    ffn = layer.mlp
    expected = (F.silu(x @ ffn.gate_proj.weight.T) * (x @ ffn.up_proj.weight.T)) @ ffn.down_proj.weight.T
    assert_close(ffn(x), expected)


@pytest.mark.parametrize("activation, gated", [("silu", F.silu), ("gelu_tanh", lambda g: F.gelu(g, approximate="tanh")),
                                               ("sigmoid", torch.sigmoid)])
@torch.no_grad()
def test_a_glu_gates_the_second_half_of_one_projection_by_the_first(activation, gated, tmp_path):
    """Phi-3's gate_up_proj: glu(x) = activation(gate) * up, [gate; up] the projection's halves, in that order."""
    path = tmp_path / "glu.xspec"
    path.write_text(f'import "{Path("specs/modern/phi3.xspec").resolve()}"\nmodel m extends phi3 {{\n'
                    '  block feed_forward(x) {\n    gate_up = linear(x, 2 * d_ff, bias = false) as gate_up_proj\n'
                    f'    h = glu(gate_up, activation = "{activation}")\n'
                    '    return linear(h, d_model, bias = false) as down_proj\n  }\n}\n')
    ffn = xspec.compile(path, overrides={"layers": 1}).build().decoder.layers[0].mlp
    x = torch.randn(2, 3, 128)
    gate, up = (x @ ffn.gate_up_proj.weight.T).split(344, dim=-1)
    assert_close(ffn(x), (gated(gate) * up) @ ffn.down_proj.weight.T)


@pytest.mark.parametrize("overrides", [{}, {"kv_heads": 1}, {"alibi": True}])
@torch.no_grad()
def test_cached_decoding_equals_full_decoding_with_rotary_and_gqa(overrides):
    source = open(LLAMA).read()
    if overrides.pop("alibi", False):
        source = source.replace("rotary = true", "alibi = true")
    spec = xspec.compile_source(source, name=LLAMA, overrides=overrides, allow_imports=True)
    torch.manual_seed(0)
    model = spec.build(device="cpu").eval()
    tokens = torch.randint(0, spec.vocab_size, (2, 9))
    full = model(tokens)
    cache = DecoderCache()
    steps = [model.decode(tokens[:, :4], cache=cache)]                         # a prompt, then one by one
    steps += [model.decode(tokens[:, t:t + 1], cache=cache) for t in range(4, 9)]
    assert_close(torch.cat(steps, dim=1), full)


# --- Hugging Face's LlamaForCausalLM as the oracle ----------------------------------------------------

def hf_llama(vocab: int, d_model: int, layers: int, heads: int, kv_heads: int, d_ff: int):
    import transformers  # the test extra: installed by the README's test command
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=d_model, intermediate_size=d_ff, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, rms_norm_eps=1e-6, max_position_embeddings=256,
        attention_bias=False, mlp_bias=False, tie_word_embeddings=False, hidden_act="silu",
        rope_theta=10000.0, attn_implementation="eager")
    torch.manual_seed(1)
    return transformers.LlamaForCausalLM(config).eval()


def hf_to_xspec_names(layers: int) -> dict[str, str]:
    """The weight mapping: Hugging Face's parameter names -> the spec's, the same after the top-level module."""
    names = {"model.embed_tokens.weight": "decoder.embed_tokens.weight", "model.norm.weight": "decoder.norm.weight",
             "lm_head.weight": "decoder.lm_head.weight"}
    for i in range(layers):
        names |= {f"model.layers.{i}.{name}": f"decoder.layers.{i}.{name}" for name in (
            "input_layernorm.weight", "post_attention_layernorm.weight",
            *(f"self_attn.{p}_proj.weight" for p in "qkvo"), *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")))}
    return names


SIZES = [
    {"vocab": 1000, "d_model": 128, "layers": 2, "heads": 4, "kv_heads": 2, "d_ff": 344},
    {"vocab": 300, "d_model": 64, "layers": 3, "heads": 8, "kv_heads": 1, "d_ff": 96},
    {"vocab": 500, "d_model": 96, "layers": 1, "heads": 6, "kv_heads": 6, "d_ff": 256},
]


@pytest.mark.parametrize("sizes", SIZES)
def test_llama_parameter_count_equals_hugging_faces(sizes):
    reference = hf_llama(**sizes)
    spec = xspec.compile(LLAMA, overrides=sizes)
    assert spec.parameters == sum(p.numel() for p in reference.parameters())


@pytest.mark.parametrize("sizes", SIZES[:2])
@torch.no_grad()
def test_llama_gives_hugging_faces_logits(sizes):
    reference = hf_llama(**sizes)
    model = xspec.compile(LLAMA, overrides=sizes).build(device="cpu").eval()
    names = hf_to_xspec_names(sizes["layers"])
    hf_state = reference.state_dict()
    assert set(names) == {k for k in hf_state if "rotary" not in k}
    model.load_state_dict({ours: hf_state[hf] for hf, ours in names.items()})
    tokens = torch.randint(0, sizes["vocab"], (2, 17), generator=torch.Generator().manual_seed(2))
    assert_close(model(tokens), reference(tokens).logits)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_llama_flops_and_d_ff_from_the_spec_match_what_runs(kv_heads):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from xspec.stats import compute
    from xspec.compiler.cost import flops

    spec = xspec.compile(LLAMA, overrides={"kv_heads": kv_heads})
    model = spec.build(device="cpu").eval()
    tokens = torch.randint(0, spec.vocab_size, (2, 9))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(tokens)
    assert counter.get_total_flops() == 2 * flops(spec, 9).total
    architecture = compute(spec).architecture
    assert architecture.d_ff == 344                      # the SwiGLU's width, found through SiLU
    assert (architecture.heads, architecture.kv_heads, architecture.positions) == (4, kv_heads, "rotary")


SMALL = {"vocab": 200, "d_model": 32, "d_ff": 48, "heads": 4, "layers": 2}


@pytest.mark.parametrize("name", ["llama", "palm_parallel", "alibi"])
@torch.no_grad()
def test_shipped_language_models_decode_with_the_cache_as_they_run_whole(name):
    spec = xspec.compile(f"specs/modern/{name}.xspec", overrides=SMALL)
    torch.manual_seed(0)
    model = spec.build(device="cpu").eval()
    tokens = torch.randint(0, spec.vocab_size, (2, 7))
    full = model(tokens)
    cache = DecoderCache()
    steps = [model.decode(tokens[:, t:t + 1], cache=cache) for t in range(7)]
    assert_close(torch.cat(steps, dim=1), full)


@torch.no_grad()
def test_palm_parallel_adds_both_sublayers_to_one_normalized_input():
    spec = xspec.compile("specs/modern/palm_parallel.xspec", overrides={**SMALL, "dropout": 0.0})
    layer = spec.build(device="cpu").eval().decoder.layers[0]
    x = torch.randn(2, 5, 32)
    h = layer.norm(x)
    assert_close(layer(x), x + layer.self_attn(h, h, h) + layer.ffn(h))


def test_swiglu_base_changes_only_the_feed_forward():
    base = xspec.compile("specs/base.xspec", overrides=SMALL)
    swiglu = xspec.compile("specs/modern/swiglu_base.xspec", overrides=SMALL)
    changed = {name for name in {*base.param_shapes, *swiglu.param_shapes}
               if base.param_shapes.get(name) != swiglu.param_shapes.get(name)}
    assert changed and all(".ffn." in name for name in changed)
    assert {n.rsplit(".", 2)[-2] for n in changed} == {"w_1", "w_2", "gate", "up", "down"}


def test_albert_layers_share_one_layers_weights():
    spec = xspec.compile("specs/modern/albert.xspec", overrides={**SMALL, "layers": 3})
    assert "for layer in self.encoder.layers:  # tie" in spec.python_source   # one loop, not a line per tensor
    model = spec.build(device="cpu")
    layers = model.encoder.layers
    assert all(layer.self_attn.q_proj.weight is layers[0].self_attn.q_proj.weight for layer in layers)
    first = model.decoder.layers[0]
    assert all(layer.cross_attn.v_proj.bias is first.cross_attn.v_proj.bias for layer in model.decoder.layers)
    untied = xspec.compile("specs/base.xspec", overrides={**SMALL, "layers": 3})
    per_layer = [untied.param_shapes[n] for n in untied.param_shapes if n.startswith(("encoder.layers.1.",
                                                                                       "decoder.layers.1."))]
    assert untied.parameters - spec.parameters == 2 * sum(math.prod(shape) for shape in per_layer)
    assert spec.parameters == sum(p.numel() for p in model.parameters())


EVERY_OTHER = """
import "specs/lm.xspec"

# Layers differ by index: attention in even layers only, and a feed-forward that widens with depth.
model every_other extends transformer_lm {
  block widening(x, i) {
    return linear(relu(linear(x, d_ff * (i + 1)) as w_1), d_model) as w_2
  }
  block decoder(tokens) {
    x = embed(tokens) as embedding
    repeat i in layers {
      if i % 2 == 0 {
        x = sublayer(x, h => attention(h, h, h, heads = heads, d_k = d_k, d_v = d_v, causal = true) as self_attn)
      }
      x = sublayer(x, h => widening(h, i) as ffn)
    }
    return linear(x, vocab, bias = false) as generator
  }
}
"""


@torch.no_grad()
def test_layers_differ_by_their_index():
    spec = xspec.compile_source(EVERY_OTHER, name="every_other.xspec", overrides={**SMALL, "layers": 3})
    shapes = spec.param_shapes
    assert [f"decoder.layers.{i}.self_attn.q_proj.weight" in shapes for i in range(3)] == [True, False, True]
    assert [shapes[f"decoder.layers.{i}.ffn.w_1.weight"][0] for i in range(3)] == [48, 96, 144]
    torch.manual_seed(0)
    model = spec.build(device="cpu").eval()
    assert spec.parameters == sum(p.numel() for p in model.parameters())
    tokens = torch.randint(0, spec.vocab_size, (2, 6))
    cache = DecoderCache()
    steps = [model.decode(tokens[:, t:t + 1], cache=cache) for t in range(6)]
    assert_close(torch.cat(steps, dim=1), model(tokens))


@pytest.mark.parametrize("options", [{"kv_heads": 2, "rotary": True, "causal": True}, {"alibi": True},
                                     {"alibi": True, "causal": True}, {"kv_heads": 1}])
@torch.no_grad()
def test_the_weights_diagrams_draw_are_those_forward_applies(options):
    attention = only_attention(**options)
    x = torch.randn(2, 6, 32)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[1, 4:] = True
    q, k, mask, is_causal = scores_inputs(attention, x, x, x, padding)
    weights = sdpa_weights(q, k, mask, is_causal)                   # [B, h, T, T]
    assert weights.shape == (2, 4, 6, 6)
    v = attention.v_proj(x).unflatten(-1, (attention.kv_heads, 8)).transpose(1, 2)
    v = v.repeat_interleave(4 // attention.kv_heads, dim=1)
    expected = attention.o_proj((weights @ v).transpose(1, 2).flatten(2))
    assert_close(attention(x, x, x, padding_mask=padding), expected)


@torch.no_grad()
def test_every_activation_lowers_to_code_that_passes_the_generated_code_check():
    source = open(LLAMA).read().replace("gate = silu(", "gate = tanh(sigmoid(silu(gelu(relu(").replace(
        "as gate_proj)", "as gate_proj)))))")
    spec = xspec.compile_source(source, name=LLAMA, overrides=SMALL)
    layer = spec.build(device="cpu").eval().decoder.layers[0]
    x = torch.randn(2, 3, 32)
    ffn = layer.mlp
    gate = torch.tanh(torch.sigmoid(F.silu(F.gelu(F.relu(ffn.gate_proj(x))))))
    assert_close(ffn(x), ffn.down_proj(gate * ffn.up_proj(x)))


@pytest.mark.parametrize("name", ["llama", "alibi"])
def test_rotary_gqa_and_alibi_trace_as_one_graph(name):
    """torch.compile sees one graph, no break, for the new attention options (dynamo's trace only; the
    compile test of the training step covers inductor)."""
    spec = xspec.compile(f"specs/modern/{name}.xspec", overrides=SMALL)
    model = spec.build(device="cpu")
    explained = torch._dynamo.explain(model)(torch.randint(4, spec.vocab_size, (2, 7)))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


INDEXED_CALL = """
import "specs/lm.xspec"

model indexed extends transformer_lm {
  block widening(x, width) {
    return x + linear(relu(linear(x, width) as w_1), d_model) as w_2
  }
  block decoder(tokens) {
    x = embed(tokens) as embedding
    repeat i in layers { x = widening(x, d_ff * (i + 1)) }
    y = x
    repeat j in 2 as scaled { y = widening(y * (j + 1.0), d_ff) }
    return linear(x + y, vocab, bias = false) as generator
  }
}
"""


@torch.no_grad()
def test_an_index_passed_to_the_layer_block_keeps_module_paths_and_is_each_layers_own():
    spec = xspec.compile_source(INDEXED_CALL, name="indexed.xspec", overrides={**SMALL, "layers": 3})
    shapes = spec.param_shapes
    # The index only sets a constant: the stack holds the called block itself, as without an index.
    assert [shapes[f"decoder.layers.{i}.w_1.weight"][0] for i in range(3)] == [48, 96, 144]
    # The index scales a tensor: each layer runs its own body (the call is a module of that body).
    assert "decoder.scaled.1.widening.w_1.weight" in shapes
    torch.manual_seed(0)
    model = spec.build(device="cpu").eval()
    tokens = torch.randint(0, spec.vocab_size, (2, 5))
    x = model.decoder.embedding(tokens)
    for layer in model.decoder.layers:
        x = layer(x)
    y = x
    for j, layer in enumerate(model.decoder.scaled):
        y = layer.widening(y * (j + 1.0))
    assert_close(model(tokens), model.decoder.generator(x + y))
