"""Multi-head latent attention (specs/modern/deepseek_v3.xspec; its logits against transformers' DeepSeek-V3
are in test_families.py and test_hf_import.py): the decoding cache keeps the latent and the rotary key per
position, cached decoding equals a full forward, beam search's reordering moves the cache, and what the
spec, the import and the export refuse."""

from __future__ import annotations

import re

import pytest
import torch

import xspec
from float32 import assert_close
from packed_documents import assert_documents_kept_apart
from xspec.base.errors import UserError
from xspec.hf.families import map_config
from xspec.runtime.cache import DecoderCache

SIZES = {"vocab": 61, "d_model": 32, "heads": 2, "layers": 2, "d_ff": 40, "q_lora_rank": 12, "kv_lora_rank": 10,
         "qk_nope_head_dim": 6, "qk_rope_head_dim": 4, "v_head_dim": 8}


def model(**changes) -> torch.nn.Module:
    torch.manual_seed(0)
    return xspec.compile("specs/modern/deepseek_v3.xspec", overrides={**SIZES, **changes}).build("cpu").eval()


@torch.no_grad()
@pytest.mark.parametrize("q_lora_rank", [12, 0], ids=["query-latent", "direct-queries"])
def test_the_cache_keeps_the_latent_and_the_rotary_key_and_decoding_equals_the_full_forward(q_lora_rank):
    """With a cache the attention runs over the latent (W^UK folded into the queries, W^UV after); without
    one, over keys and values made for every head: the same logits, prompt, steps and chunks alike."""
    net = model(q_lora_rank=q_lora_rank)
    tokens = torch.randint(0, 61, (3, 11), generator=torch.Generator().manual_seed(1))
    full = net(tokens)
    cache = DecoderCache()
    parts = [net.decode(tokens[:, :4], cache=cache)]              # a prompt, then one token at a time,
    parts += [net.decode(tokens[:, i:i + 1], cache=cache) for i in range(4, 8)]
    parts.append(net.decode(tokens[:, 8:], cache=cache))          # then several after a cache
    assert_close(torch.cat(parts, dim=1), full)
    assert len(cache.tensors) == 2                                # one entry per layer's attention
    for latent, rotary_key, *_ in cache.tensors.values():         # per position: 10 + 4 numbers, not 2 * 2 * (10 + 8)
        assert latent.shape[:2] == (3, 1) and latent.size(3) == 10
        assert rotary_key.shape[:2] == (3, 1) and rotary_key.size(3) == 4
        assert latent.size(2) >= 11


@torch.no_grad()
def test_reordering_the_cache_moves_every_rows_latent():
    """Beam search's reorder: the rows of the cache follow the chosen rows, as decoding them afresh does."""
    net = model()
    tokens = torch.randint(0, 61, (3, 7), generator=torch.Generator().manual_seed(2))
    cache = DecoderCache()
    net.decode(tokens[:, :6], cache=cache)
    order = torch.tensor([2, 0, 0])
    cache.reorder(order)
    step = net.decode(tokens[order, 6:], cache=cache)
    assert_close(step, net(tokens[order])[:, 6:])


def test_an_odd_rotary_width_is_refused_at_its_argument():
    with pytest.raises(xspec.SpecError, match=r"deepseek_v3.xspec:40:32: error: rotary_embedding: rotary positions "
                                              "rotate pairs of features, so dim must be even, got 5"):
        xspec.compile("specs/modern/deepseek_v3.xspec", overrides={"qk_rope_head_dim": 5})


def _config(**changes) -> dict:
    config = {"model_type": "deepseek_v3", "vocab_size": 61, "hidden_size": 32, "intermediate_size": 40,
              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": None,
              "kv_lora_rank": 10, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4, "v_head_dim": 8,
              "first_k_dense_replace": 2, "rms_norm_eps": 1e-6, "hidden_act": "silu", "rope_interleave": True,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "max_position_embeddings": 64}
    return config | changes


def test_import_maps_a_deepseek_config_and_its_rotary_layout():
    mapped = map_config(_config())
    assert mapped.spec == "deepseek_v3" and mapped.weights.name == "deepseek_interleaved"
    assert mapped.params["q_lora_rank"] == 0 and mapped.params["kv_lora_rank"] == 10
    assert mapped.params["n_routed_experts"] == 256 and mapped.params["n_group"] == 8  # transformers' defaults
    assert map_config(_config(rope_interleave=False)).weights.name == "deepseek"
    # DeepSeek's own config.json keys are set aside, saying why: transformers does not read them (its
    # DeepSeek-V3 always routes by sigmoid scores within groups), and the import computes what it computes.
    assert map_config(_config(topk_method="noaux_tc", scoring_func="sigmoid", moe_layer_freq=1)).params
    notes = map_config(_config(scoring_func="softmax", topk_method="greedy")).notes
    assert "always scores experts by sigmoid" in notes["scoring_func"] and "noaux_tc" in notes["topk_method"]
    with pytest.raises(UserError, match='config.json: scoring_func 3 is not a string'):
        map_config(_config(scoring_func=3))


@pytest.mark.parametrize("changes, message", [
    ({"n_routed_experts": 6, "num_experts_per_tok": 2, "n_group": 4}, "n_group 4 does not split n_routed_experts 6"),
    ({"num_key_value_heads": 1}, "num_key_value_heads 1 is not supported: latent attention"),
    ({"qk_rope_head_dim": 5}, "qk_rope_head_dim 5 is odd"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 0.5,
                          "original_max_position_embeddings": 8}}, "factor 0.5 is not supported"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, "rope_type \"linear\""),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mscale": 1.0}}, "mscale"),
    ({"quantization_config": {"quant_method": "fp8"}}, 'quantization_config ("fp8") is not supported'),
], ids=["expert-groups", "key-heads", "odd-rotary", "yarn-below-1", "linear", "mscale-without-yarn", "fp8"])
def test_import_refuses_what_the_spec_does_not_compute_by_name(changes, message):
    with pytest.raises(UserError, match=re.escape(message)):
        map_config(_config(**changes))


@torch.no_grad()
@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_decoding_with_stored_weight_formats_keeps_the_up_projection_it_reads(weights):
    """bf16 and int8 weight formats replace the plain linear layers, but not the up-projection whose weight
    the decoding step reads as matrices: decoding runs, close to float32's."""
    from xspec.runtime.weight_formats import store_weights

    net, stored = model(d_model=64, kv_lora_rank=32), model(d_model=64, kv_lora_rank=32)
    store_weights(stored, weights, torch.device("cpu"))
    attention = stored.decoder.layers[0].self_attn
    assert type(attention.kv_b_proj) is torch.nn.Linear and type(attention.kv_a_proj_with_mqa) is not torch.nn.Linear
    tokens = torch.randint(0, 61, (2, 6), generator=torch.Generator().manual_seed(3))
    expected, cache = net(tokens), DecoderCache()
    got = torch.cat([stored.decode(tokens[:, :3], cache=cache), stored.decode(tokens[:, 3:], cache=cache)], dim=1)
    assert (got - expected).abs().max() < 0.1 * expected.abs().max()


@torch.no_grad()
def test_attention_maps_read_latent_attention_through_its_own_steps():
    """The weights xspec viz draws: causal, rows summing to 1, and applied to the values the module makes
    they give its attention output."""
    from xspec.viz.attention import attention_sites, capture

    spec = xspec.compile("specs/modern/deepseek_v3.xspec", overrides={**SIZES, "first_k_dense_replace": 2})
    torch.manual_seed(0)
    net = spec.build("cpu").eval()
    tokens = torch.randint(0, 61, (1, 7), generator=torch.Generator().manual_seed(4))
    sites = attention_sites(spec)
    assert [site.module for site in sites] == ["decoder.layers.0.self_attn", "decoder.layers.1.self_attn"]
    weights = capture(net, spec, sites, None, tokens)["decoder.layers.0.self_attn"]  # [h, T, T]
    assert weights.shape == (2, 7, 7) and torch.all(weights.triu(1) == 0)
    assert_close(weights.sum(-1), torch.ones(2, 7))
    attention = net.decoder.layers[0].self_attn
    x = net.decoder.layers[0].input_layernorm(net.decoder.embed_tokens(tokens))
    q_nope, q_rope, latent, k_rope = attention.project(x, net.decoder.rotary_emb(x))
    _, values = attention.keys_values(latent, k_rope)
    assert_close(weights @ values[0], attention.attend(q_nope, q_rope, latent, k_rope)[0])


def test_packed_documents_kept_apart_compute_what_each_computes_alone():
    """data.document_boundaries = "separate": a block of three documents gives each the logits it has alone
    (rotary positions are relative), and the step's loss is their losses summed."""
    assert_documents_kept_apart(model(), (4, 2, 6), 61, seed=4)
