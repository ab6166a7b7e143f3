"""Recurrent mixers in a spec of one's own: Gated DeltaNet layers scheduled with attention decode from
their states (a prefill, a chunk of several positions, single steps) as the full forward computes, and
`xspec stats` counts their fixed state. The shipped hybrids (bamba, qwen3_next, nemotron_h) are built
with transformers' own classes in the families' tests (tests/hf_families.py)."""

from __future__ import annotations

import torch

import xspec
from float32 import assert_close
from packed_documents import assert_documents_kept_apart
from xspec.runtime.cache import DecoderCache
from xspec.stats import decoding_cache

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
    kept = [cache.state(m) for m in model.modules() if type(m).__name__ == "GatedDeltaNet"]
    assert [tuple(t.shape) for t in kept[0]] == [(2, 2, 2 * 2 * 16 + 4 * 12), (2, 4, 16, 12)]


CONVOLVED = """
import "specs/modern/llama.xspec"
model convolved extends llama {
  set layers = 2
  block lm_layer(x, rope, mask) {
    x = sublayer(x, h => short_convolution(h, kernel = 3, bias = true) as conv)
    return sublayer(x, h => feed_forward(h) as ffn)
  }
}
"""


def test_the_short_convolution_on_its_own_is_causal_and_decodes_from_its_window():
    spec = xspec.compile_source(CONVOLVED, name="convolved.xspec")
    torch.manual_seed(5)
    model = spec.build("cpu").eval()
    conv = model.decoder.layers[0].conv
    x = torch.randn(2, 9, 128)
    with torch.no_grad():
        out = conv(x)
        by_hand = torch.stack([sum(x[:, t - k] * conv.conv1d.weight[:, 0, 2 - k] for k in range(3) if t - k >= 0)
                               + conv.conv1d.bias for t in range(9)], dim=1)
        assert_close(out, torch.nn.functional.silu(by_hand))
        tokens = torch.randint(0, 1000, (2, 11), generator=torch.Generator().manual_seed(6))
        cache = DecoderCache()
        pieces = [model.decode(tokens[:, :4], cache=cache)] + [model.decode(tokens[:, t:t + 1], cache=cache)
                                                               for t in range(4, 11)]
        assert_close(torch.cat(pieces, dim=1), model(tokens))
    assert decoding_cache(spec, 10).state == 2 * 2 * 128


PACKED = """
import "specs/modern/llama.xspec"
model packed extends llama {
  param layer_types = ["mamba", "attention", "delta"]
  set layers = 3
  block lm_layer(x, i) {
    if layer_types[i] == "mamba" {
      mix = h => mamba2(h, heads = 4, head_dim = 16, state_size = 8, groups = 2, conv_kernel = 3,
                        chunk_size = 4) as mamba
    } else {
      if layer_types[i] == "delta" {
        mix = h => gated_delta_net(h, k_heads = 2, v_heads = 4, d_k = 8, d_v = 8, chunk_size = 4) as linear_attn
      } else {
        mix = h => attention(h, h, h, heads = heads, kv_heads = kv_heads, d_k = d_k, d_v = d_v, causal = true,
                             rotary = true) as self_attn
      }
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


def test_packed_documents_kept_apart_compute_what_each_computes_alone():
    """A block of four documents (each EOS, then its tokens; chunks of 4 positions cut across them), with
    data.document_boundaries = "separate": every layer, attention, Mamba-2 and Gated DeltaNet, gives each
    document the logits it has alone; and the training step's loss is the documents' losses summed."""
    spec = xspec.compile_source(PACKED, name="packed.xspec")
    torch.manual_seed(7)
    assert_documents_kept_apart(spec.build("cpu").eval(), (5, 2, 9, 3), 1000, seed=8)
