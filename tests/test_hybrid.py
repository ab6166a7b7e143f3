"""A hybrid of Mamba-2 and attention as a spec (specs/modern/bamba.xspec), against transformers'
BambaForCausalLM (its pure-PyTorch path) with the same random weights: the same parameters, float32
logits over a sequence longer than one chunk of the state space, and greedy generation with the decoder
cache (keys and values for the attention layer, a state of fixed size for the Mamba-2 ones) equal to
`generate`'s; and Gated DeltaNet's layers in a spec, decoding from their states as the full forward
computes, the cache's fixed state counted by `xspec stats`."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import xspec
from float32 import assert_close
from hf_families import qwen3_next_weights
from xspec.runtime.cache import DecoderCache
from xspec.stats import decoding_cache

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

# Uncommon sizes: 5 layers with attention at 1 and 4, two groups of B and C, chunks of 24 positions.
SIZES = {"vocab": 300, "d_model": 48, "d_ff": 80, "heads": 6, "kv_heads": 2, "layers": 5, "mamba_n_heads": 6,
         "mamba_expand": 2, "mamba_n_groups": 2, "mamba_d_state": 12, "mamba_d_conv": 3, "mamba_chunk_size": 24,
         "time_step_min": 0.01}
KINDS = ["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"]
RULES = [
    (r"model\.embed_tokens\.weight", "decoder.embedding.weight"),
    (r"model\.final_layernorm\.weight", "decoder.norm.weight"),
    (r"lm_head\.weight", "decoder.generator.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"decoder.layers.\1.sublayer_1.norm.weight"),
    (r"model\.layers\.(\d+)\.pre_ff_layernorm\.weight", r"decoder.layers.\1.sublayer_2.norm.weight"),
    (r"model\.layers\.(\d+)\.feed_forward\.(gate|up|down)_proj\.weight", r"decoder.layers.\1.ffn.\2.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.weight", r"decoder.layers.\1.self_attn.\2_proj.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", r"decoder.layers.\1.self_attn.out_proj.weight"),
    (r"model\.layers\.(\d+)\.mamba\.(.+)", r"decoder.layers.\1.mamba.\2"),
]


def _ours(name: str) -> str:
    for pattern, target in RULES:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, target, name)
    raise AssertionError(f"no rule maps {name}")


@pytest.fixture(scope="module")
def pair():
    config = transformers.BambaConfig(
        vocab_size=SIZES["vocab"], hidden_size=SIZES["d_model"], intermediate_size=SIZES["d_ff"],
        num_hidden_layers=SIZES["layers"], num_attention_heads=SIZES["heads"], num_key_value_heads=SIZES["kv_heads"],
        attn_layer_indices=[i for i, kind in enumerate(KINDS) if kind == "full_attention"],
        mamba_n_heads=SIZES["mamba_n_heads"], mamba_d_head=SIZES["mamba_expand"] * SIZES["d_model"] // 6,
        mamba_n_groups=2, mamba_d_state=12, mamba_d_conv=3, mamba_expand=2, mamba_chunk_size=24,
        time_step_limit=(0.01, float("inf")), rms_norm_eps=1e-5, max_position_embeddings=256,
        attn_implementation="eager", pad_token_id=0, bos_token_id=None, eos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = transformers.BambaForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    spec = xspec.compile("specs/modern/bamba.xspec", overrides={**SIZES, "layer_types": KINDS})
    model = spec.build("cpu").eval()
    model.load_state_dict({_ours(name): tensor for name, tensor in reference.state_dict().items()})
    return spec, model, reference


def test_the_same_parameters_and_logits_over_several_chunks(pair):
    spec, model, reference = pair
    assert spec.parameters == sum(p.numel() for p in reference.parameters())
    tokens = torch.randint(0, SIZES["vocab"], (2, 70), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_close(model(tokens), reference(tokens).logits)


def test_greedy_decoding_with_the_cache_equals_generate(pair):
    spec, model, reference = pair
    prompt, new = torch.randint(0, SIZES["vocab"], (2, 9), generator=torch.Generator().manual_seed(2)), 12
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = reference.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        cache, sequence = DecoderCache(), prompt
        logits = model.decode(prompt, cache=cache)
        for _ in range(new):
            token = logits[:, -1].argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, token], dim=1)
            logits = model.decode(token, cache=cache)
    assert torch.equal(sequence, expected)
    mamba = [m for m in model.modules() if type(m).__name__ == "Mamba2Mixer"]
    assert len(mamba) == 3 and all(cache.state(m) is not None for m in mamba)


DELTA = """
import "specs/modern/llama.xspec"
model delta extends llama {
  param layer_types = ["linear_attention", "full_attention", "linear_attention"]
  set layers = 3
  block lm_layer(x, i) {
    if layer_types[i] == "linear_attention" {
      mix = h => gated_delta_net(h, k_heads = 2, v_heads = 4, d_k = 16, d_v = 12, conv_kernel = 3,
                                 chunk_size = 8) as linear_attn
    } else {
      mix = h => attention(h, h, h, heads = heads, kv_heads = kv_heads, d_k = d_k, d_v = d_v, causal = true,
                           rotary = true) as self_attn
    }
    x = sublayer(x, mix)
    return sublayer(x, h => feed_forward(h) as ffn)
  }
  block decoder(tokens) {
    x = embedding(tokens, vocab, d_model) as embedding
    repeat i in layers { x = lm_layer(x, i) }
    return linear(rms_norm(x, eps = rms_norm_eps) as norm, vocab, bias = false) as generator
  }
}
"""


def test_a_gated_deltanet_layer_decodes_from_its_state_as_the_full_forward_computes():
    """Prefill, a chunk of several positions, then single steps, through the cache: the logits of the
    forward over the whole sequence (the chunked form with chunks of 8 over 21 positions)."""
    spec = xspec.compile_source(DELTA, name="delta.xspec")
    assert [type(m).__name__ for m in spec.build("cpu").modules()].count("GatedDeltaNet") == 2
    torch.manual_seed(3)
    model = spec.build("cpu").eval()
    tokens = torch.randint(0, 1000, (2, 21), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(tokens)
        cache = DecoderCache()
        pieces = [model.decode(tokens[:, :9], cache=cache), model.decode(tokens[:, 9:15], cache=cache)]
        pieces += [model.decode(tokens[:, t:t + 1], cache=cache) for t in range(15, 21)]
    assert_close(torch.cat(pieces, dim=1), full)
    stats = decoding_cache(spec, 100)
    assert (stats.recurrent_layers, stats.state) == (2, 2 * (4 * 16 * 12 + 2 * (2 * 2 * 16 + 4 * 12)))


# Qwen3-Next at uncommon sizes: Gated DeltaNet in layers 0, 1 and 3, gated full attention in 2; experts
# with a gated shared expert; chunks of 64 over 70 positions.
NEXT_SIZES = {"vocab": 300, "d_model": 48, "heads": 4, "kv_heads": 2, "head_dim": 16, "layers": 4, "d_ff": 72,
              "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
              "shared_expert_intermediate_size": 40, "linear_num_key_heads": 2, "linear_num_value_heads": 6,
              "linear_key_head_dim": 12, "linear_value_head_dim": 10, "linear_conv_kernel_dim": 3}
NEXT_KINDS = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
@pytest.fixture(scope="module")
def next_pair():
    s = NEXT_SIZES
    config = transformers.Qwen3NextConfig(
        vocab_size=s["vocab"], hidden_size=s["d_model"], num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"], num_hidden_layers=s["layers"],
        intermediate_size=s["d_ff"], num_experts=s["num_experts"], num_experts_per_tok=s["num_experts_per_tok"],
        moe_intermediate_size=s["moe_intermediate_size"],
        shared_expert_intermediate_size=s["shared_expert_intermediate_size"], layer_types=NEXT_KINDS,
        linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=12, linear_value_head_dim=10,
        linear_conv_kernel_dim=3, rms_norm_eps=1e-6, max_position_embeddings=256, attn_implementation="eager",
        pad_token_id=0, bos_token_id=None, eos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = transformers.Qwen3NextForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    spec = xspec.compile("specs/modern/qwen3_next.xspec",
                         overrides={**s, "layer_types": NEXT_KINDS, "rope_theta": 10000.0, "rms_norm_eps": 1e-6})
    model = spec.build("cpu").eval()
    model.load_state_dict(qwen3_next_weights(reference.state_dict(), s))
    return spec, model, reference


def test_qwen3_next_has_the_parameters_and_logits_of_transformers(next_pair):
    spec, model, reference = next_pair
    assert spec.parameters == sum(p.numel() for p in reference.parameters())
    tokens = torch.randint(0, NEXT_SIZES["vocab"], (2, 70), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert_close(model(tokens), reference(tokens).logits)


def test_qwen3_next_decodes_greedily_with_the_cache_as_generate(next_pair):
    spec, model, reference = next_pair
    prompt, new = torch.randint(0, NEXT_SIZES["vocab"], (2, 7), generator=torch.Generator().manual_seed(6)), 10
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = reference.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        cache, sequence = DecoderCache(), prompt
        logits = model.decode(prompt, cache=cache)
        for _ in range(new):
            token = logits[:, -1].argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, token], dim=1)
            logits = model.decode(token, cache=cache)
    assert torch.equal(sequence, expected)
