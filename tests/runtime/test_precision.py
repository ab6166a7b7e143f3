"""The precision a run computes in: bf16 autocast where the CPU reports bf16 matrix instructions (read from
/proc/cpuinfo's flags, simulated here), float32 where it does not, and a message for what the CPU cannot
do. Where this CPU has them, a short training run and the scores of a trained model in bf16 against
float32's."""

from __future__ import annotations

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
    """This process's CPU reports `flag` (None: no bf16 instructions), and no variable overrides it."""
    monkeypatch.setattr(precision, "_reported_bf16_flag", lambda: flag)
    monkeypatch.delenv(precision.NO_BF16_VARIABLE, raising=False)


def test_auto_is_bf16_on_a_cpu_with_bf16_instructions_and_says_why(monkeypatch):
    simulate(monkeypatch, "amx_bf16")
    chosen = choose_precision(CPU, "auto")
    assert chosen.dtype == torch.bfloat16
    assert chosen.describe() == 'bf16 (train.precision = "auto"; the CPU has amx_bf16)'
    assert choose_precision(CPU, "bf16", "decode.precision").dtype == torch.bfloat16
    assert choose_precision(CPU, "fp32").dtype is None
    with pytest.raises(UserError, match='train.precision = "fp16" needs a GPU'):
        choose_precision(CPU, "fp16")


def test_auto_is_float32_on_a_cpu_without_them_and_bf16_is_refused(monkeypatch):
    simulate(monkeypatch, None)
    chosen = choose_precision(CPU, "auto", "decode.precision")
    assert chosen.dtype is None
    assert chosen.describe() == 'fp32 (decode.precision = "auto"; no bf16 matrix instructions on this cpu)'
    with pytest.raises(UserError, match='decode.precision = "bf16": this cpu has no bf16 matrix instructions'):
        choose_precision(CPU, "bf16", "decode.precision")


def test_the_variable_makes_a_cpu_with_them_compute_in_float32(monkeypatch):
    simulate(monkeypatch, "amx_bf16")
    monkeypatch.setenv(precision.NO_BF16_VARIABLE, "0")
    assert choose_precision(CPU, "auto").dtype is None


needs_bf16 = pytest.mark.skipif(precision._reported_bf16_flag() is None,
                                reason="this CPU reports no bf16 matrix instructions")


@needs_bf16
def test_a_bf16_run_trains_and_scores_as_float32_does(small_corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(precision.NO_BF16_VARIABLE, raising=False)
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
    assert fp32 != bf16  # computed differently
