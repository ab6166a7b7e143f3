"""Attention's newer options against references written here from their definitions: biases, a head size
of its own, QK-norm, soft-capping and the scale, sliding windows and their ring-buffer cache, sinks,
partial rotary and the frequency scalings (against Hugging Face's rope functions, a test-only oracle), and
the runtime's FlexAttention against the module's own computation."""

import math

import pytest
import torch

from xspec.compiler.op_attention import AttentionAttrs
from xspec.nn import (Attention, LinearRotaryEmbedding, Llama3RotaryEmbedding,
                      RMSNorm, RotaryEmbedding, YarnRotaryEmbedding)
from xspec.runtime.attention_kernels import flex_attention, heads_of
from xspec.runtime.cache import DecoderCache
from xspec.viz.attention import scores_inputs
from attention_pieces import compose, turned
from float32 import assert_close

# FlexAttention off CUDA runs its unfused reference implementation, and says so: these tests want exactly that.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def attention(**options) -> Attention:
    torch.manual_seed(0)
    module = compose(32, heads=4, d_k=8, d_v=6, kv_heads=2, bias=False, causal=True, **options).eval()
    with torch.no_grad():  # sinks and norms start at what makes them inert: move them
        for name, parameter in module.named_parameters():
            if "norm" in name or name == "sinks":
                parameter.copy_(torch.randn_like(parameter))
    return module


def reference(module: Attention, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Attention written from the options' definitions, one head at a time."""
    T = x.size(1)
    q = module.q_proj(x)
    k = module.k_proj(x)
    normed = not isinstance(module.q_norm, torch.nn.Identity)
    q_norm, k_norm = (module.q_norm, module.k_norm) if normed else (None, None)
    d_k, d_v = module.q_proj.out_features // module.heads, module.v_proj.out_features // module.kv_heads
    norm_per_head = q_norm is not None and q_norm.weight.numel() == d_k
    if q_norm is not None and not norm_per_head:
        q, k = q_norm(q), k_norm(k)
    q = q.unflatten(-1, (module.heads, d_k)).transpose(1, 2)
    k = k.unflatten(-1, (module.kv_heads, d_k)).transpose(1, 2)
    v = module.v_proj(x).unflatten(-1, (module.kv_heads, d_v)).transpose(1, 2)
    if q_norm is not None and norm_per_head:
        q, k = q_norm(q), k_norm(k)
    if module.rotary is not None:
        q, k = turned(module.rotary, q), turned(module.rotary, k)
    softcap = module.inner_attention.softcap if module.inner_attention is not None else None
    sinks, scale = module.sinks, module.scale if module.scale is not None else d_k ** -0.5
    heads = []
    for h in range(module.heads):
        kv = h // (module.heads // module.kv_heads)
        scores = q[:, h] @ k[:, kv].transpose(-2, -1) * scale  # [B, T, T]
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        scores = scores.masked_fill(~allowed, float("-inf"))
        if sinks is not None:
            sink = sinks[h].expand(x.size(0), T, 1)
            weights = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :T]
        else:
            weights = scores.softmax(-1)
        heads.append(weights @ v[:, kv])
    return module.o_proj(torch.cat(heads, dim=-1))


def step(module: Attention, x: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
    """Self-attention over x's positions after those cached, as a model's decode runs it: the cache's
    length, where positions start, moves on after each step."""
    out = module(x, x, x, cache=cache)
    cache.length += x.size(1)
    return out


def causal(T: int, window: int | None = None) -> torch.Tensor:
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return (j <= i) & ((i - j < window) if window else True)


OPTIONS = [
    {},
    {"window": 3},
    {"softcap": 2.0},
    {"scale": 0.05},
    {"sinks": True},
    {"q_norm": torch.nn.RMSNorm(8, eps=1e-6), "k_norm": torch.nn.RMSNorm(8, eps=1e-6)},            # per head
    {"q_norm": torch.nn.RMSNorm(32, eps=1e-6), "k_norm": torch.nn.RMSNorm(16, eps=1e-6)},           # projection
    {"q_norm": RMSNorm(8, offset=1.0), "k_norm": RMSNorm(8, offset=1.0), "rotary": RotaryEmbedding(8, 10000.0)},
    {"rotary": RotaryEmbedding(4, 500.0)},                                               # partial
    {"window": 4, "softcap": 3.0, "sinks": True, "rotary": RotaryEmbedding(8, 10000.0), "scale": 0.2},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "+".join(o) or "plain")
@torch.no_grad()
def test_each_option_computes_its_definition(options):
    module = attention(**options)
    x = torch.randn(2, 9, 32)
    expected = reference(module, x, causal(9, options.get("window")))
    assert_close(module(x, x, x), expected)
    # FlexAttention's reference implementation: what the runtime runs compiled on CUDA.
    attrs = AttentionAttrs(heads=4, d_k=8, d_v=6, kv_heads=2, causal=True, window=options.get("window"),
                           softcap=options.get("softcap"))
    q, k, v = heads_of(module, x, x, x)
    flexed = flex_attention(q, k, v, attrs, None, module.sinks, compiled=False)
    assert_close(module.o_proj(flexed.transpose(1, 2).flatten(2)), expected)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "+".join(o) or "plain")
@torch.no_grad()
def test_cached_decoding_equals_full_decoding_past_the_window(options):
    module = attention(**options)
    x = torch.randn(2, 13, 32)
    full = module(x, x, x)
    cache = DecoderCache(capacity=2)
    steps = [step(module, x[:, :5], cache)]   # a prompt longer than a window of 3 or 4
    for t in range(5, 13):
        steps.append(step(module, x[:, t:t + 1], cache))
    assert_close(torch.cat(steps, dim=1), full)
    held = cache.tensors[module][0].size(2)
    assert held == options["window"] if "window" in options else held >= 13


def test_dropout_on_written_out_weights_drops_weights_while_training():
    """Dropout composes with soft caps and sinks: the weights written out are dropped as SDPA drops its own."""
    module = attention(softcap=2.0, sinks=True, dropout=0.5)
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        expected = reference(module, x, causal(9))
        assert_close(module(x, x, x), expected)                 # evaluating: no dropout
        module.train()
        torch.manual_seed(1)
        dropped = module(x, x, x)
        assert (dropped - expected).abs().max() > 1e-2
        # Each kept weight is scaled by 1 / (1 - p): on average, the output is the undropped one.
        drawn = torch.stack([module(x, x, x) for _ in range(300)]).mean(0)
        assert (drawn - expected).abs().mean() < 0.2 * (dropped - expected).abs().mean()


@torch.no_grad()
def test_a_window_of_none_is_full_causal_attention_and_caches_every_position():
    """A global layer of Gemma 2 or gpt-oss: window None, as the layers' one call passes it there."""
    plain = attention(rotary=RotaryEmbedding(8, 10000.0))
    windowless = attention(rotary=RotaryEmbedding(8, 10000.0), window=None)
    windowless.load_state_dict(plain.state_dict())
    windowless.eval()
    x = torch.randn(2, 11, 32)
    assert_close(windowless(x, x, x), plain(x, x, x))
    assert_close(windowless(x, x, x), reference(plain, x, causal(11)))
    cache = DecoderCache(capacity=2)
    steps = [step(windowless, x[:, :4], cache)] + [step(windowless, x[:, t:t + 1], cache) for t in range(4, 11)]
    assert_close(torch.cat(steps, dim=1), plain(x, x, x))
    assert cache.tensors[windowless][0].size(2) >= 11


@torch.no_grad()
def test_a_windowed_cache_holds_the_window_through_chunks_and_beam_reorders():
    module = attention(window=4, rotary=RotaryEmbedding(8, 10000.0))
    x = torch.randn(3, 20, 32)
    cache = DecoderCache(capacity=2)
    rows = torch.arange(3)
    t = 0
    for size, order in ((3, None), (1, [2, 0, 1]), (6, [1, 1, 0]), (1, None), (2, [0, 2, 2]), (1, None), (5, None)):
        if order is not None:
            cache.reorder(torch.tensor(order))
            rows = rows[torch.tensor(order)]
        chunk = x[rows, t:t + size]
        out = step(module, chunk, cache)
        t += size
        whole = x[rows, :t]
        assert_close(out, module(whole, whole, whole)[:, t - size:])
        assert cache.tensors[module][0].size(2) <= 4


def test_the_window_is_a_sliding_window_of_keys():
    module = attention(window=3)
    x = torch.randn(1, 6, 32, requires_grad=True)
    out = module(x, x, x)
    out[0, 5].sum().backward()
    reached = x.grad[0].abs().sum(-1) > 0
    assert reached.tolist() == [False, False, False, True, True, True]


@torch.no_grad()
def test_the_attention_weights_diagrams_draw_include_caps_sinks_and_windows():
    module = attention(window=3, softcap=2.0, sinks=True)
    x = torch.randn(2, 7, 32)
    q, k, mask, is_causal = scores_inputs(module, x, x, x, None)
    assert not is_causal                    # the weights written out take the causal mask as a mask
    weights = module.inner_attention.weights(q, k, mask, module.sinks)
    assert (weights.sum(-1) < 1).all()                          # the sinks take a share of each row
    assert (weights[..., causal(7, 3).logical_not()] == 0).all()


@pytest.mark.parametrize("per_head", [True, False])
@torch.no_grad()
def test_qk_norm_normalizes_before_the_rotation(per_head):
    size = 8 if per_head else 32
    module = attention(q_norm=torch.nn.RMSNorm(size), k_norm=torch.nn.RMSNorm(8 if per_head else 16),
                       rotary=RotaryEmbedding(8, 10000.0))
    x = torch.randn(1, 5, 32)
    q = module.q_proj(x)
    if not per_head:
        q = q / q.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * module.q_norm.weight
    q = q.unflatten(-1, (4, 8)).transpose(1, 2)
    if per_head:
        q = q / q.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * module.q_norm.weight
    q = turned(module.rotary, q)
    expected, _, _, _ = scores_inputs(module, x, x, x, None)
    assert_close(expected, q)


def test_gemma_rms_norm_weights_by_one_plus_w():
    norm = RMSNorm(16, eps=1e-6, offset=1.0)
    assert (norm.weight == 0).all()                             # 1 + w starts at 1, as Gemma's
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16))
    x = torch.randn(3, 16)
    assert_close(norm(x), x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * (1 + norm.weight))


# --- rotary positions: partial, and the frequency scalings, against Hugging Face's rope functions ------

def hf_frequencies(scaling: dict, head_dim: int = 64, fraction: float = 1.0) -> tuple[torch.Tensor, float]:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
                                      max_position_embeddings=8192,
                                      rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": fraction,
                                                       **scaling})
    if scaling["rope_type"] == "default":
        dim = int(head_dim * fraction)
        return 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)), 1.0
    return ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu")


SCALINGS = [
    ({"rope_type": "linear", "factor": 4.0}, LinearRotaryEmbedding, {"factor": 4.0}),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 256},
     Llama3RotaryEmbedding, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_len": 256}),
    ({"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 256, "beta_fast": 32.0,
      "beta_slow": 1.0}, YarnRotaryEmbedding, {"factor": 16.0, "original_max_len": 256, "beta_fast": 32.0,
                                               "beta_slow": 1.0, "attention_factor": 0.1 * math.log(16.0) + 1.0,
                                               "truncate": True}),
    ({"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 256, "beta_fast": 16.0,
      "beta_slow": 2.0, "truncate": False, "attention_factor": 1.5},
     YarnRotaryEmbedding, {"factor": 32.0, "original_max_len": 256, "beta_fast": 16.0, "beta_slow": 2.0,
                           "truncate": False, "attention_factor": 1.5}),
]


@pytest.mark.parametrize("hf, kind, ours", SCALINGS, ids=lambda s: s["rope_type"] if isinstance(s, dict) and "rope_type"
                         in s else "")
@torch.no_grad()
def test_rotary_scalings_turn_positions_beyond_the_original_context_as_hugging_face(hf, kind, ours):
    frequencies, factor = hf_frequencies(hf)
    rotary = kind(64, 10000.0, **ours)
    assert_close(rotary.inverse_frequency, frequencies)
    assert getattr(rotary, "attention_factor", 1.0) == pytest.approx(factor)
    x = torch.randn(1, 2, 3, 64)
    position = 3000                                              # far past the original 256 positions
    angles = position * frequencies
    cos, sin = torch.cat([angles.cos()] * 2) * factor, torch.cat([angles.sin()] * 2) * factor
    expected = x * cos + torch.cat([-x[..., 32:], x[..., :32]], -1) * sin
    assert_close(turned(rotary, x[:, :, :1], position), expected[:, :, :1])
    # Dropping the scaling changes what a position far out becomes.
    assert not torch.allclose(turned(RotaryEmbedding(64, 10000.0), x[:, :, :1], position), expected[:, :, :1],
                              atol=1e-3)


@torch.no_grad()
def test_partial_rotary_turns_the_first_features_and_passes_the_rest():
    frequencies, _ = hf_frequencies({"rope_type": "default"}, head_dim=16, fraction=0.5)
    rotary = RotaryEmbedding(8, 10000.0)
    assert_close(rotary.inverse_frequency, frequencies)
    x = torch.randn(1, 1, 4, 16)
    out = turned(rotary, x, 5)
    assert torch.equal(out[..., 8:], x[..., 8:])
    assert_close(out[..., :8], turned(RotaryEmbedding(8, 10000.0), x[..., :8], 5))


@pytest.mark.parametrize("spec_path, sliding_mask", [("specs/modern/gemma2.xspec", "sliding_mask"),
                                                     ("specs/modern/gpt_oss.xspec", "sliding_mask"),
                                                     ("specs/modern/mistral.xspec", "causal_mask")])
@torch.no_grad()
def test_the_runtimes_flex_attention_gives_the_models_own_logits(spec_path, sliding_mask):
    """What CUDA runs (FlexAttention for soft caps, sinks and windows, here its reference implementation): the
    modules the spec's graph names run through it, and a decoding step runs the module's own."""
    import xspec
    from xspec.runtime.attention_kernels import use_flex_attention

    spec = xspec.compile(spec_path)
    torch.manual_seed(0)
    model = spec.build("cpu").eval()
    for name, parameter in model.named_parameters():
        if name.endswith("sinks"):
            parameter.copy_(torch.randn_like(parameter))
    tokens = torch.randint(4, spec.vocab_size, (2, 19))
    expected = model(tokens)
    flexed = use_flex_attention(model, spec, compiled=False)
    assert flexed and all(".self_attn" in path for path in flexed)
    assert_close(model(tokens), expected)
    # the stack's sliding-window mask, read by those modules alone, is not made without a cache
    sliding = model.decoder.get_submodule(sliding_mask)
    x = torch.zeros(2, 19, 8)
    assert sliding(x) is None and sliding(x[:, :3], cache=DecoderCache()) is not None
    cache = DecoderCache()
    steps = [model.decode(tokens[:, :11], cache=cache)] + [model.decode(tokens[:, t:t + 1], cache=cache)
                                                           for t in range(11, 19)]
    assert_close(torch.cat(steps, dim=1), expected)


@pytest.mark.parametrize("gate", [False, True])
@torch.no_grad()
def test_fused_projections_compute_what_three_matrices_do_in_one_product(gate):
    """Phi-3's qkv_proj: W^Q, W^K and W^V as rows of one matrix give the three projections' attention, in a
    forward, in cached decoding and through FlexAttention, and initialize each part as its own matrix."""
    options = dict(rotary=RotaryEmbedding(4, 10000.0), q_norm=RMSNorm(8), k_norm=RMSNorm(8), gate=gate)
    apart = compose(32, heads=4, d_k=8, d_v=6, kv_heads=2, bias=True, causal=True, **options).eval()
    for parameter in apart.parameters():   # biases and norms start at what makes them inert: move them
        parameter.copy_(torch.randn_like(parameter) * 0.3)
    fused = compose(32, heads=4, d_k=8, d_v=6, kv_heads=2, bias=True, causal=True, fused=True, **options).eval()
    assert not hasattr(fused, "q_proj") and fused.qkv_proj.weight.shape == (4 * (8 + 6 * gate) + 2 * 8 + 2 * 6, 32)
    parts = (apart.q_proj, apart.k_proj, apart.v_proj)
    fused.load_state_dict({**{n: t for n, t in apart.state_dict().items() if "_proj." not in n or "o_proj" in n},
                           "qkv_proj.weight": torch.cat([p.weight for p in parts]),
                           "qkv_proj.bias": torch.cat([p.bias for p in parts])})
    x = torch.randn(2, 7, 32)
    assert_close(fused(x, x, x), apart(x, x, x))
    cache = DecoderCache(capacity=2)
    steps = [step(fused, x[:, :3], cache)] + [step(fused, x[:, t:t + 1], cache) for t in range(3, 7)]
    assert_close(torch.cat(steps, dim=1), apart(x, x, x))
    for ours, theirs in zip(heads_of(fused, x, x, x), heads_of(apart, x, x, x)):
        assert_close(ours, theirs)
    fused.reset_parameters()
    bounds = [(6 / (32 + rows)) ** 0.5 for rows in fused.sizes]   # Xavier's, of each part's own shape
    for part, bound in zip(fused.qkv_proj.weight.split(fused.sizes), bounds):
        assert bound * 0.9 < part.abs().max() <= bound
    assert not fused.qkv_proj.bias.any()


@pytest.mark.parametrize("kind", ["self", "cross", "bias"])
def test_a_decoding_step_of_many_rows_written_out_equals_sdpa(kind, monkeypatch):
    """A step of one query a row over enough rows (beam search's) computes the weights as two products and a
    softmax: the same outputs as SDPA's, with a padding mask, a bias (T5's), and a growing cache."""
    torch.manual_seed(0)
    attention = Attention(32, 4, 4, 8, 8, bias=True, out_bias=True, causal=kind != "cross",
                          cross=kind == "cross").eval()
    rows = Attention.ONE_QUERY_ROWS // 4 + 3
    memory, padding = torch.randn(rows, 7, 32), torch.zeros(rows, 7, dtype=torch.bool)
    padding[::3, 5:] = True
    steps = torch.randn(rows, 3, 32)

    def decoded() -> torch.Tensor:
        cache, outputs = DecoderCache(), []
        for t in range(steps.size(1)):
            x = steps[:, t:t + 1]
            if kind == "cross":
                outputs.append(attention(x, memory, memory, padding, cache=cache))
            else:
                bias = torch.randn(1, 4, 1, t + 1, generator=torch.Generator().manual_seed(t)) if kind == "bias" \
                    else None
                outputs.append(attention(x, x, x, cache=cache, position_bias=bias))
                cache.length += 1
        return torch.cat(outputs, dim=1)

    with torch.no_grad():
        assert attention.one_query_step(torch.zeros(rows, 4, 1, 8), is_causal=False)
        written_out = decoded()
        monkeypatch.setattr(Attention, "ONE_QUERY_ROWS", 10 ** 9)      # SDPA for every step
        assert_close(written_out, decoded())


def test_the_layers_of_a_forward_share_one_mask_and_a_long_context_s_is_not_held():
    def layer():
        return Attention(32, 2, 2, 16, 16, bias=False, out_bias=False, causal=True, window=4)

    first, second = layer(), layer()
    assert first.visible(9, 9, "cpu") is second.visible(9, 9, "cpu")
    assert torch.equal(first.visible(9, 9, "cpu"), first.band(9, 9, "cpu"))
    assert first.visible(9, 9, "cpu") is not first.visible(8, 9, "cpu")
    side = int(Attention.MASK_KEPT_ELEMENTS ** 0.5) + 1
    kept = len(Attention.masks)
    assert first.visible(side, side, "meta") is not first.visible(side, side, "meta")
    assert len(Attention.masks) == kept
