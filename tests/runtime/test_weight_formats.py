"""Decoding's weight formats (runtime/weight_formats.py): bf16 and int8 linear layers whose products agree
with float32's within their rounding, float32's rows multiplied the way chosen for their count, which layers
are replaced, and which requests are refused."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from xspec.base.errors import UserError
from xspec.runtime import weight_formats
from xspec.runtime.memory_plan import FreeMemory
from xspec.runtime.weight_formats import Bf16Linear, Float32Linear, Int8Linear, choose_weight_format, store_weights

CPU = torch.device("cpu")


def _linear(in_features: int, out_features: int, bias: bool) -> nn.Linear:
    torch.manual_seed(in_features + out_features)
    return nn.Linear(in_features, out_features, bias=bias)


# torch's int8 kernel takes 48 features and 10 rows; 40 features, or 48 rows, the dequantized product.
@pytest.mark.parametrize("in_features, rows", [(48, 5), (40, 5), (48, 24)])
@pytest.mark.parametrize("bias", [True, False])
def test_int8_products_equal_the_dequantized_weights_product(in_features, rows, bias):
    linear = _linear(in_features, 33, bias)
    quantized = Int8Linear(linear)
    x = torch.randn(2, rows, in_features)
    dequantized = quantized.quantized.float() * quantized.scale.float()[:, None]
    expected = x.to(torch.bfloat16).float() @ dequantized.t() + (linear.bias.detach() if bias else 0)
    got = quantized(x)
    assert got.shape == (2, rows, 33) and got.dtype == torch.float32
    assert torch.allclose(got, expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())
    exact = linear(x).detach()  # and within int8's rounding of the float32 layer
    assert (got - exact).abs().max() < 0.03 * exact.abs().max()


def test_each_output_channel_has_its_own_scale():
    linear = _linear(32, 3, False)
    with torch.no_grad():
        linear.weight[0] *= 100.0
        linear.weight[2] = 0.0
    quantized = Int8Linear(linear)
    peaks = quantized.quantized.abs().amax(dim=1).tolist()
    assert peaks == [127, 127, 0]
    assert quantized.scale[0].item() == pytest.approx(100 * quantized.scale[1].item(), rel=0.5)
    assert torch.equal(quantized(torch.randn(4, 32))[:, 2], torch.zeros(4))


def test_bf16_layers_return_their_inputs_dtype_within_bf16_rounding():
    linear = _linear(24, 10, True)
    x = torch.randn(3, 24)
    got = Bf16Linear(linear)(x)
    exact = linear(x).detach()
    assert got.dtype == torch.float32 and linear.weight.dtype == torch.float32
    assert (got - exact).abs().max() < 0.02 * exact.abs().max()


class _Router(nn.Linear):
    """A subclass with a forward of its own, as the experts' router is."""

    def forward(self, x):
        return super().forward(x).softmax(-1)


@pytest.mark.parametrize("bias", [True, False])
def test_bf16_layers_multiply_by_their_packed_weight_without_gradients_as_f_linear_does(bias, monkeypatch):
    linear = _linear(48, 40, bias)
    layer, plain = Bf16Linear(linear, packed=True), Bf16Linear(linear)
    assert plain.packed is None and layer.packed is not None

    def not_linear(*args):
        raise AssertionError("F.linear's product")

    for shape in [(1, 48), (4, 1, 48), (3, 7, 48), (300, 48)]:
        x = torch.randn(*shape)
        with torch.no_grad():
            expected = plain(x)
            with monkeypatch.context() as patched:
                patched.setattr(weight_formats.F, "linear", not_linear)
                got = layer(x)
        assert got.shape == expected.shape and got.dtype == torch.float32
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)
    x = torch.randn(4, 48, requires_grad=True)      # a gradient asked for: F.linear's product, which has one
    layer(x).sum().backward()
    assert x.grad is not None and layer.packed.tensor is not None


@pytest.mark.parametrize("weight_format, kind", [("int8", Int8Linear), ("bf16", Bf16Linear)])
def test_only_plain_linear_layers_are_replaced(weight_format, kind):
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32)),
                          _Router(32, 4), nn.Embedding(10, 16))
    x = torch.randn(2, 16)
    before = model[:4](x).detach()
    assert store_weights(model, weight_format, CPU) == 2
    assert isinstance(model[0], kind) and isinstance(model[2][0], kind)
    assert type(model[3]) is _Router and model[3].weight.dtype == torch.float32
    assert model[4].weight.dtype == torch.float32 and model[2][1].weight.dtype == torch.float32
    assert torch.allclose(model[:4](x), before, atol=0.02)


def test_float32_layers_on_a_cpu_keep_their_tensors_and_names():
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), _Router(16, 4))
    weight, keys = model[0].weight, list(model.state_dict())
    assert store_weights(model, "fp32", torch.device("cuda")) == 0 and type(model[0]) is nn.Linear
    assert store_weights(model, "fp32", CPU) == 1
    assert type(model[0]) is Float32Linear and model[0].weight is weight and type(model[2]) is _Router
    assert list(model.state_dict()) == keys and model[0].packed is not None


@pytest.mark.parametrize("weight_format, packed_bytes", [("fp32", 16384), ("bf16", 8192)])
def test_weights_are_packed_only_where_the_copies_fit_a_share_of_free_memory(weight_format, packed_bytes,
                                                                              monkeypatch):
    monkeypatch.setattr(weight_formats, "cpu_bf16_instructions", lambda: "avx512_bf16")
    for free, packed in ((4 * packed_bytes - 1, False), (4 * packed_bytes, True)):
        model = nn.Sequential(nn.Linear(64, 64, bias=False))                   # 16 KiB of float32 weights
        monkeypatch.setattr(weight_formats, "free_memory", lambda device: FreeMemory(free, "CPU RAM"))
        store_weights(model, weight_format, CPU)
        assert (model[0].packed is not None) is packed
    model = nn.Sequential(nn.Linear(64, 64, bias=False))
    store_weights(model, "fp32", CPU)
    model[0].packed = None
    with torch.no_grad():
        assert model[0].product_for(torch.randn(20, 64)) == "linear"


@pytest.mark.parametrize("bias", [True, False])
def test_float32_rows_are_multiplied_the_way_chosen_for_their_count_with_linears_numbers(bias, monkeypatch):
    """On a CPU running 2 threads, without gradients: one row in a block of W's rows per thread, two to four
    weight first ((W x^T)^T), more through oneDNN's packed weight (without one, weight first up to 16); each
    equal to nn.Linear's product within float32's rounding and not made by it. nn.Linear's own product, exactly,
    for one row where the threads do not divide W's rows and no packed weight is allowed, and wherever
    gradients, autocast or bf16 are involved."""
    linear = _linear(48, 40, bias)
    layer = Float32Linear(linear, packed=True)
    threads = torch.get_num_threads()

    def not_linear(*args):
        raise AssertionError("nn.Linear's product")

    try:
        torch.set_num_threads(2)
        with torch.no_grad():
            for shape, product in [((1, 48), "blocks"), ((2, 48), "weight first"), ((4, 1, 48), "weight first"),
                                   ((5, 48), "packed"), ((2, 8, 48), "packed"), ((3, 7, 48), "packed"),
                                   ((300, 48), "packed")]:
                x = torch.randn(*shape)
                assert layer.product_for(x) == product, shape
                with monkeypatch.context() as patched:
                    patched.setattr(weight_formats.F, "linear", not_linear)
                    got = layer(x)
                assert got.shape == shape[:-1] + (40,) and got.is_contiguous()
                assert torch.allclose(got, linear(x), atol=1e-5), shape
            torch.set_num_threads(4)            # a block per thread
            x = torch.randn(1, 48)
            with monkeypatch.context() as patched:
                patched.setattr(weight_formats.F, "linear", not_linear)
                got = layer(x)
            assert layer.product_for(x) == "blocks" and torch.allclose(got, linear(x), atol=1e-5)
            torch.set_num_threads(2)
            uneven = _linear(48, 39, bias)
            x = torch.randn(1, 48)
            assert Float32Linear(uneven, packed=True).product_for(x) == "packed"
            assert Float32Linear(uneven).product_for(x) == "linear" and torch.equal(Float32Linear(uneven)(x), uneven(x))
            unpacked = Float32Linear(linear)
            assert [unpacked.product_for(torch.randn(rows, 48)) for rows in (3, 16, 17)] == \
                ["weight first", "weight first", "linear"]
            x = torch.randn(4, 48)
            assert layer.product_for(x.bfloat16()) == "linear"
            with torch.autocast("cpu", dtype=torch.bfloat16):
                assert layer.product_for(x) == "linear"
        # The weight needs its gradient: not the packed weight's product, which has none.
        assert layer.product_for(torch.randn(8, 48)) == "weight first"
        assert layer.product_for(torch.randn(20, 48)) == "linear"
        x = torch.randn(20, 48)
        assert torch.equal(layer(x), linear(x))
    finally:
        torch.set_num_threads(threads)


def test_a_packed_weight_follows_its_weight_and_is_not_copied():
    linear = _linear(32, 24, True)
    layer = Float32Linear(linear, packed=True)
    x = torch.randn(5, 32)
    with torch.no_grad():
        first = layer(x)
        assert layer.packed is not None and layer.packed.tensor is not None
        linear.weight.mul_(2)                   # written in place: packed again
        assert torch.allclose(layer(x), linear(x), atol=1e-5) and not torch.allclose(layer(x), first)
        linear.weight.data = torch.randn(24, 32)  # replaced
        assert torch.allclose(layer(x), linear(x), atol=1e-5)
        copied = copy.deepcopy(nn.Sequential(layer))
        assert copied[0].packed.tensor is None and torch.allclose(copied[0](x), linear(x), atol=1e-5)


def test_auto_keeps_weights_the_cache_holds_and_the_others_need_bf16_instructions(monkeypatch):
    monkeypatch.setattr(weight_formats, "cpu_bf16_instructions", lambda: "amx_bf16")
    monkeypatch.setattr(weight_formats, "last_level_cache_bytes", lambda: 300 * 2**20)
    assert [choose_weight_format(CPU, asked, linear_bytes=2**20) for asked in ("auto", "fp32", "bf16", "int8")] == \
        ["fp32", "fp32", "bf16", "int8"]
    assert choose_weight_format(CPU, "auto", linear_bytes=480 * 2**20) == "bf16"  # streamed from memory
    assert choose_weight_format(torch.device("cuda"), "auto", linear_bytes=480 * 2**20) == "fp32"
    monkeypatch.setattr(weight_formats, "last_level_cache_bytes", lambda: None)  # a cache Linux does not report
    assert choose_weight_format(CPU, "auto", linear_bytes=480 * 2**20) == "fp32"
    monkeypatch.setattr(weight_formats, "last_level_cache_bytes", lambda: 300 * 2**20)
    monkeypatch.setattr(weight_formats, "cpu_bf16_instructions", lambda: None)
    assert choose_weight_format(CPU, "auto", linear_bytes=480 * 2**20) == "fp32"
    with pytest.raises(UserError, match=r'--weights = "int8": this CPU has no bf16 matrix instructions'):
        choose_weight_format(CPU, "int8", "--weights")
    with pytest.raises(UserError, match=r"decode.weights = 'int4': one of auto, fp32, bf16, int8"):
        choose_weight_format(CPU, "int4")


def test_the_last_level_cache_is_the_largest_linux_reports(monkeypatch, tmp_path):
    for index, size in enumerate(["48K", "32K", "2048K", "307200K", "garbage", ""]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    (tmp_path / "index9").mkdir()  # no size file
    monkeypatch.setattr(weight_formats, "CPU_CACHES", tmp_path)
    weight_formats.last_level_cache_bytes.cache_clear()
    try:
        assert weight_formats.last_level_cache_bytes() == 307200 * 1024
        monkeypatch.setattr(weight_formats, "CPU_CACHES", tmp_path / "absent")
        weight_formats.last_level_cache_bytes.cache_clear()
        assert weight_formats.last_level_cache_bytes() is None
    finally:
        weight_formats.last_level_cache_bytes.cache_clear()


def test_the_bytes_counted_are_those_of_the_layers_replaced():
    model = nn.Sequential(nn.Linear(16, 8), _Router(8, 4, bias=False), nn.Embedding(10, 16))
    assert weight_formats.linear_weight_bytes(model) == (16 * 8 + 8) * 4
