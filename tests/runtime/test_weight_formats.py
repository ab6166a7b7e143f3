"""Decoding's weight formats (runtime/weight_formats.py): bf16 and int8 linear layers whose products agree
with float32's within their rounding, float32's few rows multiplied weight first, which layers are replaced,
and which requests are refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from xspec.base.errors import UserError
from xspec.runtime import weight_formats
from xspec.runtime.weight_formats import Bf16Linear, FewRowsLinear, Int8Linear, choose_weight_format, store_weights

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
    assert type(model[0]) is FewRowsLinear and model[0].weight is weight and type(model[2]) is _Router
    assert list(model.state_dict()) == keys


@pytest.mark.parametrize("bias", [True, False])
def test_few_float32_rows_go_weight_first_on_several_threads_with_linears_numbers(bias, monkeypatch):
    """1 to 16 rows, float32, on a CPU running 2 threads: (W x^T)^T, or for one row W's rows in a block per
    thread, not nn.Linear's product, equal to it within float32's rounding; otherwise nn.Linear's own product,
    exactly (as for one row where the threads do not divide W's rows)."""
    linear = _linear(48, 40, bias)
    few = FewRowsLinear(linear)
    threads = torch.get_num_threads()

    def not_linear(*args):
        raise AssertionError("nn.Linear's product")

    try:
        torch.set_num_threads(2)
        for shape in [(1, 48), (2, 48), (4, 1, 48), (2, 8, 48), (17, 48), (3, 7, 48)]:
            x = torch.randn(*shape)
            rows, expected = x.numel() // 48, linear(x).detach()
            assert few.shares_rows(x) == (1 <= rows <= 16), shape
            if few.shares_rows(x):
                with monkeypatch.context() as patched:
                    patched.setattr(weight_formats.F, "linear", not_linear)
                    got = few(x).detach()
                assert got.shape == expected.shape and got.is_contiguous()
                assert torch.allclose(got, expected, atol=1e-5)
            else:
                assert torch.equal(few(x), expected)
        uneven = FewRowsLinear(_linear(48, 39, bias))
        x = torch.randn(1, 48)
        assert few.blocks(1) == 2 and uneven.blocks(1) == 1 and not uneven.shares_rows(x)
        assert uneven.shares_rows(torch.randn(2, 48))
        torch.set_num_threads(4)            # a block per thread
        with monkeypatch.context() as patched:
            patched.setattr(weight_formats.F, "linear", not_linear)
            got = few(x).detach()
        assert few.blocks(1) == 4 and torch.allclose(got, linear(x).detach(), atol=1e-5)
        torch.set_num_threads(2)
        x = torch.randn(4, 48)
        assert not few.shares_rows(x.bfloat16())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not few.shares_rows(x)
        torch.set_num_threads(1)
        assert not few.shares_rows(x) and torch.equal(few(x), linear(x))
    finally:
        torch.set_num_threads(threads)


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
