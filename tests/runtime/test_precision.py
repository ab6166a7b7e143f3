"""The precision a run computes in on a CPU: bf16 autocast where it reports bf16 matrix instructions (read
from /proc/cpuinfo's flags, simulated here) and a run asks for it, float32 otherwise, and a message for
what the CPU cannot do. Where this CPU has them, a short training run in bf16 against float32's. On a GPU,
the context keeps attention off cuDNN's kernel, which plans again for every sequence length."""

from __future__ import annotations

import json
import math

import pytest
import torch

import xspec
from xspec.base.errors import UserError
from xspec.runtime import precision
from xspec.runtime.precision import bf16_flag, choose_precision
from xspec.runtime.train import RunOptions, train

X86_WITH_AMX = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
X86_AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
X86_WITHOUT = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n"
ARM_WITH = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
CPU = torch.device("cpu")


@pytest.mark.parametrize("cpu_info, flag", [(X86_WITH_AMX, "amx_bf16"), (X86_AVX512_BF16, "avx512_bf16"),
                                            (X86_WITHOUT, None), (ARM_WITH, "bf16"), ("", None)])
def test_the_bf16_instructions_are_read_from_the_cpus_flags(cpu_info, flag):
    assert bf16_flag(cpu_info) == flag


def simulate(monkeypatch, flag):
    """This process's CPU reports `flag` (None: no bf16 instructions)."""
    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: flag)


def test_bf16_is_there_to_ask_for_on_a_cpu_with_bf16_instructions_and_auto_is_float32(monkeypatch):
    """Measured on such a CPU, bf16 autocast ran the trainer's batches of varying shapes slower than float32."""
    simulate(monkeypatch, "amx_bf16")
    asked = choose_precision(CPU, "bf16", "decode.precision")
    assert asked.dtype == torch.bfloat16
    assert asked.describe() == 'bf16 (decode.precision = "bf16"; the CPU has amx_bf16)'
    chosen = choose_precision(CPU, "auto")
    assert chosen.dtype is None and "the CPU has amx_bf16, but" in chosen.describe()
    assert choose_precision(CPU, "fp32").dtype is None
    with pytest.raises(UserError, match='train.precision = "fp16" needs a GPU'):
        choose_precision(CPU, "fp16")


def test_auto_trains_in_bf16_where_every_batch_is_one_shape_on_a_cpu_with_bf16_instructions(monkeypatch):
    """A language model's blocks: measured 1.2-1.8x faster than float32 at one shape."""
    simulate(monkeypatch, "avx512_bf16")
    chosen = choose_precision(CPU, "auto", one_shape="a language model's blocks")
    assert chosen.dtype == torch.bfloat16
    assert chosen.describe().startswith('bf16 (train.precision = "auto"; the CPU has avx512_bf16 and every batch '
                                        "is one shape (a language model's blocks)")
    assert choose_precision(CPU, "fp32", one_shape="a language model's blocks").dtype is None
    simulate(monkeypatch, None)
    assert choose_precision(CPU, "auto", one_shape="a language model's blocks").dtype is None


def test_auto_trains_in_bf16_with_float32_attention_on_avx512_bf16_and_decodes_in_float32(monkeypatch):
    """Without AMX, torch's bf16 attention kernel is the slow part of a bf16 step: with attention in float32,
    a translation model's batches of varying shapes trained 1.3x faster than float32. With AMX (unmeasured so)
    such batches train in float32, as measured before; decoding is float32 wherever "auto" (near-ties)."""
    simulate(monkeypatch, "avx512_bf16")
    chosen = choose_precision(CPU, "auto", training=True)
    assert chosen.dtype == torch.bfloat16 and chosen.float32_attention
    assert chosen.describe() == ('bf16 (train.precision = "auto"; the CPU has avx512_bf16, where bf16 autocast with '
                                 'attention in float32 trained 1.3x faster than float32; "fp32" for float32)')
    decoding = choose_precision(CPU, "auto", "decode.precision")
    assert decoding.dtype is None and "a near-tie" in decoding.describe()
    assert choose_precision(CPU, "bf16", "decode.precision").float32_attention
    simulate(monkeypatch, "amx_bf16")
    amx = choose_precision(CPU, "auto", training=True)
    assert amx.dtype is None and "varying shapes slower" in amx.describe()
    assert not choose_precision(CPU, "bf16").float32_attention
    assert not choose_precision(CPU, "auto", one_shape="a language model's blocks", training=True).float32_attention


def test_float32_attention_computes_attention_in_float32_and_gives_bf16_back():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 9, 16, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, 4, 9, 9).bfloat16()              # an additive mask, as ALiBi's, widened too
    with precision.Precision("cpu", torch.bfloat16, "", True).context():
        out = torch.nn.functional.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(),
                                                               attn_mask=bias)
        projected = torch.nn.functional.linear(q, torch.randn(16, 16))
        with torch.autocast("cpu", enabled=False):              # where the autocast is off, torch's own
            plain = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert out.dtype == torch.bfloat16 and projected.dtype == torch.bfloat16      # other ops: the autocast's
    assert plain.dtype == torch.float32
    exact = torch.nn.functional.scaled_dot_product_attention(q.bfloat16().float(), k.bfloat16().float(),
                                                             v.bfloat16().float(), attn_mask=bias.float())
    torch.testing.assert_close(out, exact.bfloat16(), rtol=0, atol=0)
    out.float().sum().backward()                             # and gradients flow back through the casts
    assert q.grad is not None and q.grad.dtype == torch.float32 and q.grad.abs().sum() > 0
    with precision.Precision("cpu", torch.bfloat16, "", False).context():
        bf16 = torch.nn.functional.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(),
                                                                attn_mask=bias)
    assert not torch.equal(bf16, out)                        # torch's bf16 kernel rounds otherwise


def test_bf16_is_refused_on_a_cpu_without_them(monkeypatch):
    simulate(monkeypatch, None)
    assert choose_precision(CPU, "auto").describe() == 'fp32 (train.precision = "auto" on a cpu)'
    with pytest.raises(UserError, match='decode.precision = "bf16": this cpu has no bf16 matrix instructions'):
        choose_precision(CPU, "bf16", "decode.precision")


@pytest.mark.parametrize("device_type, cudnn_inside", [("cuda", False), ("cpu", True)])
def test_the_context_turns_cudnn_attention_off_on_a_gpu_and_back_on_after(device_type, cudnn_inside):
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        context = precision.Precision(device_type, None).context()  # fp32: no autocast, any build of torch
        assert torch.backends.cuda.cudnn_sdp_enabled()  # nothing changes before the `with`
        with context:
            assert torch.backends.cuda.cudnn_sdp_enabled() is cudnn_inside
            assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_the_context_autocasts_to_the_chosen_dtype():
    with precision.Precision("cpu", torch.bfloat16).context():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled("cpu")


needs_bf16 = pytest.mark.skipif(precision.cpu_bf16_instructions() is None,
                                reason="this CPU reports no bf16 matrix instructions")


@needs_bf16
def test_a_bf16_run_trains_as_float32_does(small_corpus, tmp_path, capsys):
    runs = {}
    for name in ("fp32", "bf16"):
        spec = xspec.compile("specs/tiny.xspec", overrides={
            "vocab": 160, "layers": 1, "d_model": 64, "d_ff": 128, "train.precision": name, "train.max_steps": 40,
            "train.warmup_steps": 20, "train.batch_tokens": 600, "train.validate_every_steps": 20,
            "train.checkpoint_every_steps": 20, "data.vocab_size": 160})
        runs[name] = train(spec, RunOptions(tmp_path / name, small_corpus, device="cpu", progress=False))
    said = capsys.readouterr()
    assert 'bf16 (train.precision = "bf16"; the CPU has' in said.out + said.err
    fp32, bf16 = runs["fp32"]["valid_loss"], runs["bf16"]["valid_loss"]
    assert math.isfinite(bf16) and bf16 == pytest.approx(fp32, rel=0.05), (fp32, bf16)
    logged = {name: (tmp_path / name / "metrics.jsonl").read_text().splitlines() for name in runs}
    losses = {name: [row["loss"] for row in map(json.loads, lines) if "loss" in row] for name, lines in logged.items()}
    assert len(losses["fp32"]) == 40 and losses["fp32"] != losses["bf16"]  # computed differently
