"""The recurrent mixers of hybrid models (xspec/nn/delta_rule.py: Gated DeltaNet; xspec/nn/state_space.py:
Mamba-2's SSD): the chunked form equals the recurrent one, each equals transformers' own module given the
same weights, and decoding through DecoderCache (a prefill, one-token steps, beam search's reorder) equals
the full forward with a state that does not grow."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from float32 import assert_close
from xspec.nn.delta_rule import GatedDeltaNet
from xspec.nn.state_space import GroupRMSNorm, Mamba2Mixer
from xspec.runtime.cache import DecoderCache

D_MODEL = 20


def gated_delta_net(chunk_size: int = 8) -> GatedDeltaNet:
    """Two query/key heads of 6 features, each serving three value heads of 5; a kernel of 4."""
    torch.manual_seed(0)
    return randomized(GatedDeltaNet(D_MODEL, 2, 6, 6, 5, conv_kernel=4, eps=1e-6, chunk_size=chunk_size))


def mamba2(chunk_size: int = 8) -> Mamba2Mixer:
    """Six heads of 4 features, B and C in three groups of 5; a kernel of 3; dt clamped to [0.05, 1.5]."""
    torch.manual_seed(0)
    norm = GroupRMSNorm(24, group_size=8, eps=1e-5)
    return randomized(Mamba2Mixer(D_MODEL, 6, 4, 5, 3, conv_kernel=3, conv_bias=True, bias=True, dt_limit=(0.05, 1.5),
                                  chunk_size=chunk_size, norm=norm))


MIXERS = {"gated-deltanet": gated_delta_net, "mamba2": mamba2}


@torch.no_grad()
def randomized(module: torch.nn.Module) -> torch.nn.Module:
    """Every weight random (norm weights about 1), and decays slow enough (A in [0.05, 1]) that a state
    carries across many positions, so that a position read from the wrong state would show."""
    for name, p in module.named_parameters():
        if name == "A_log":
            p.copy_(torch.empty_like(p).uniform_(0.05, 1).log())
        elif name == "norm.weight":
            p.copy_(1 + 0.3 * torch.randn_like(p))
        elif p.dim() > 1:
            p.copy_(torch.randn_like(p) * p[0].numel() ** -0.5)
        else:
            p.copy_(torch.randn_like(p))
    return module.eval()


def inputs(rows: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, length, D_MODEL, generator=torch.Generator().manual_seed(seed))


def projected(mixer, x):
    """The inputs of a mixer's chunked and recurrent forms for x, and a random state to start from."""
    if isinstance(mixer, GatedDeltaNet):
        q, k, v, _, g, beta, _ = mixer.project(x, None)
        return (q, k, v, g, beta), torch.randn(x.size(0), 6, 6, 5)
    _, xs, dt, B, C, _ = mixer.project(x, None)
    return (xs, dt, B, C), torch.randn(x.size(0), 6, 4, 5)


@torch.no_grad()
@pytest.mark.parametrize("name", MIXERS)
@pytest.mark.parametrize("chunk_size", [1, 5, 16, 64])
def test_the_chunked_form_equals_the_recurrent_one(name, chunk_size):
    """37 positions from a random state: chunks of 1, of 5 and 16 (the last one partial), of 64 (one chunk,
    mostly padding); the outputs and the final state equal those of the one-position-at-a-time form."""
    mixer = MIXERS[name](chunk_size)
    args, start = projected(mixer, inputs(2, 37))
    chunked, chunked_state = mixer.chunked(*args, start)
    recurrent, recurrent_state = mixer.recurrent(*args, start)
    assert chunked.shape == recurrent.shape and chunked.size(2) == 37
    assert_close(chunked, recurrent, rel=2e-5)
    assert_close(chunked_state, recurrent_state, rel=2e-5)
    assert (recurrent_state - start).abs().max() > 0.1  # the positions wrote to the state


@pytest.mark.parametrize("name", MIXERS)
def test_gradients_of_the_chunked_form_equal_the_recurrent_ones(name):
    """Training differentiates the chunked form (its triangular solves): the same gradients as one position
    at a time through the cache."""
    mixer = MIXERS[name](6)
    x = inputs(2, 15)
    weights = torch.randn(2, 15, D_MODEL, generator=torch.Generator().manual_seed(3))
    (mixer(x) * weights).sum().backward()
    chunked = {n: p.grad.clone() for n, p in mixer.named_parameters()}
    mixer.zero_grad()
    cache = DecoderCache()
    steps = torch.cat([mixer(x[:, t:t + 1], cache=cache) for t in range(15)], dim=1)
    (steps * weights).sum().backward()
    for n, p in mixer.named_parameters():
        assert p.grad.abs().max() > 0, n
        assert_close(chunked[n], p.grad, rel=5e-5)


@torch.no_grad()
@pytest.mark.parametrize("name", MIXERS)
@pytest.mark.parametrize("parts", [[9, 1, 1, 1, 1, 1, 6, 1, 1], [2, 1, 1, 3, 1, 1]], ids=["prefill-9", "prefill-2"])
def test_cached_decoding_equals_the_full_forward(name, parts):
    """A prefill (of more positions than a chunk, or fewer than the convolution's window), one-position
    steps, several positions after a cache, more steps: the outputs of the full forward. The cache keeps
    the window and the state per module; the model, not the mixer, moves its length."""
    mixer = MIXERS[name](4)
    x = inputs(3, sum(parts))
    full = mixer(x)
    cache = DecoderCache()
    bounds = torch.tensor([0, *parts]).cumsum(0).tolist()
    steps = torch.cat([mixer(x[:, a:b], cache=cache) for a, b in zip(bounds, bounds[1:])], dim=1)
    assert_close(steps, full, rel=2e-5)
    assert list(cache.states) == [mixer] and cache.length == 0 and not cache.tensors
    window, state = cache.state(mixer)
    assert window.shape == (3, mixer.conv1d.kernel_size[0] - 1, mixer.conv1d.in_channels)
    # The last inputs of the convolution, projected a few positions at a time against all at once: the
    # products of different shapes round differently on some CPUs (MKL's kernels differ by vendor).
    assert_close(window, mixer.project(x, None)[-1], rel=2e-6)


@torch.no_grad()
@pytest.mark.parametrize("name", MIXERS)
def test_reordering_the_cache_moves_the_states_rows(name):
    """Beam search keeps row 2 twice and row 0 once, row 1 dropping: the steps after the reorder are those
    of the full forward over the rows chosen."""
    mixer = MIXERS[name](4)
    x = inputs(3, 13)
    cache = DecoderCache()
    mixer(x[:, :10], cache=cache)
    before = cache.state(mixer)
    order = torch.tensor([2, 2, 0])
    cache.reorder(order)
    for kept, moved in zip(before, cache.state(mixer)):
        assert torch.equal(moved, kept[order])
    steps = torch.cat([mixer(x[order, t:t + 1], cache=cache) for t in range(10, 13)], dim=1)
    assert_close(steps, mixer(x[order])[:, 10:], rel=2e-5)
    assert not torch.allclose(steps, mixer(x)[:, 10:], atol=1e-3)  # the rows did move


@torch.no_grad()
@pytest.mark.parametrize("name", MIXERS)
def test_the_cached_state_does_not_grow(name):
    """The cache holds one window and one state per mixer, the same size after 1 step or 40, and after a
    prefill of 60 positions: memory of their own, not views of the prefill's tensors."""
    mixer = MIXERS[name](4)
    x = inputs(1, 101)
    cache = DecoderCache()
    mixer(x[:, :1], cache=cache)
    sizes = [tuple(t.shape) for t in cache.state(mixer)]
    for t in range(1, 41):
        mixer(x[:, t:t + 1], cache=cache)
        assert [tuple(t.shape) for t in cache.state(mixer)] == sizes
    mixer(x[:, 41:], cache=cache)
    assert [tuple(t.shape) for t in cache.state(mixer)] == sizes
    for t in cache.state(mixer):
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
    assert len(cache.states) == 1 and not cache.tensors


# Against transformers' own modules, with the same weights copied by name ------------------------------------


def pure_torch_transformers():
    """transformers, where its recurrent layers run their PyTorch path: none of the kernel packages they
    would take first is installed."""
    transformers = pytest.importorskip("transformers")
    kernels = [name for name in ("fla", "mamba_ssm", "causal_conv1d") if importlib.util.find_spec(name)]
    if kernels:
        pytest.skip(f"transformers would run {kernels}' kernels")
    return transformers


def copy_weights(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    """Their weights, randomized as ours would be, loaded into ours by name (strict: the same names)."""
    randomized(theirs)
    ours.load_state_dict(theirs.state_dict(), strict=True)


@torch.no_grad()
@pytest.mark.parametrize("chunk_size", [64, 24])
def test_gated_deltanet_equals_qwen3_next(chunk_size):
    """Qwen3-Next's linear attention with 2 key heads of 12 and 6 value heads of 10 (three per key head),
    a kernel of 4, over 150 positions (transformers' chunks are 64; ours 64 or 24)."""
    transformers = pure_torch_transformers()
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    config = transformers.Qwen3NextConfig(
        hidden_size=36, linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=12,
        linear_value_head_dim=10, linear_conv_kernel_dim=4, rms_norm_eps=1e-6, num_hidden_layers=1,
        layer_types=["linear_attention"])
    torch.manual_seed(0)
    theirs = Qwen3NextGatedDeltaNet(config, 0).eval()
    ours = GatedDeltaNet(36, 2, 6, 12, 10, conv_kernel=4, eps=1e-6, chunk_size=chunk_size)
    copy_weights(ours, theirs)
    x = torch.randn(2, 150, 36, generator=torch.Generator().manual_seed(4))
    expected = theirs(x)
    assert_close(ours(x), expected, rel=2e-5)
    cache = DecoderCache()  # and decoding: 100 positions at once, then steps
    steps = [ours(x[:, :100], cache=cache)] + [ours(x[:, t:t + 1], cache=cache) for t in range(100, 110)]
    assert_close(torch.cat(steps, dim=1), expected[:, :110], rel=2e-5)


def bamba_and_ours(transformers, dt_limit):
    from transformers.models.bamba.modeling_bamba import BambaMixer

    config = transformers.BambaConfig(
        hidden_size=18, mamba_expand=2, mamba_n_heads=4, mamba_d_head=9, mamba_n_groups=2, mamba_d_state=7,
        mamba_d_conv=3, mamba_chunk_size=16, mamba_proj_bias=True, mamba_conv_bias=True,
        time_step_limit=(0.05, 1.5), rms_norm_eps=1e-5, num_hidden_layers=1)
    torch.manual_seed(0)
    theirs = BambaMixer(config, 0).eval()
    ours = Mamba2Mixer(18, 4, 9, 7, 2, conv_kernel=3, conv_bias=True, bias=True, dt_limit=dt_limit, chunk_size=10,
                       norm=GroupRMSNorm(36, group_size=18, eps=1e-5))
    return theirs, ours


def nemotron_h_and_ours(transformers, dt_limit):
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    config = transformers.NemotronHConfig(
        hidden_size=22, mamba_num_heads=6, mamba_head_dim=5, n_groups=3, ssm_state_size=6, conv_kernel=4,
        chunk_size=16, time_step_min=0.3, use_bias=False, use_conv_bias=True, layer_norm_epsilon=1e-5,
        layers_block_type=["mamba"])
    torch.manual_seed(0)
    theirs = NemotronHMamba2Mixer(config, 0).eval()
    assert theirs.time_step_limit == (0.3, float("inf"))
    ours = Mamba2Mixer(22, 6, 5, 6, 3, conv_kernel=4, conv_bias=True, bias=False, dt_limit=dt_limit, chunk_size=10,
                       norm=GroupRMSNorm(30, group_size=10, eps=1e-5))
    return theirs, ours


@torch.no_grad()
@pytest.mark.parametrize("family, dt_limit", [("bamba", (0.05, 1.5)), ("nemotron_h", (0.3, float("inf")))])
def test_mamba2_mixer_equals_transformers(family, dt_limit):
    """Bamba's mixer (biases, 4 heads of 9 in 2 groups of B and C of 7, dt in [0.05, 1.5]) and Nemotron-H's
    (no projection bias, 6 heads of 5 in 3 groups of 6, dt at least 0.3) over 45 positions: transformers'
    chunks are 16, ours 10. Without the clamp, ours differs: the limits do bite."""
    transformers = pure_torch_transformers()
    make = bamba_and_ours if family == "bamba" else nemotron_h_and_ours
    theirs, ours = make(transformers, dt_limit)
    copy_weights(ours, theirs)
    x = torch.randn(2, 45, ours.in_proj.in_features, generator=torch.Generator().manual_seed(5))
    expected = theirs(x)
    assert_close(ours(x), expected, rel=2e-5)
    cache = DecoderCache()  # decoding from our state: transformers' own step does not clamp dt
    steps = [ours(x[:, :30], cache=cache)] + [ours(x[:, t:t + 1], cache=cache) for t in range(30, 45)]
    assert_close(torch.cat(steps, dim=1), expected, rel=2e-5)
    ours.dt_limit = (0.0, float("inf"))
    assert (ours(x) - expected).abs().max() > 1e-3 * expected.abs().max()
