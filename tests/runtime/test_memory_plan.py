"""The memory plan (runtime/memory_plan.py): with a given free-memory figure, an update that does not fit
is cut into passes that do, one that cannot fit at all is refused with the numbers, an explicit
train.max_batch_tokens is kept and checked, and training in many passes takes the same steps as in one."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest

import xspec
import xspec.runtime.train as train_module
from toy_spec import toy_spec
from xspec.base.errors import UserError
from xspec.runtime.memory_plan import USABLE_SHARE, FreeMemory, Layout, estimate_peak, plan_memory
from xspec.runtime.run_dir import read_metrics_log
from xspec.runtime.train import RunOptions, train

SPECS = Path(__file__).resolve().parent.parent.parent / "specs"
CPU = Layout("cpu", 4, 1, 1)
LONGEST = 60


@pytest.fixture(scope="module")
def tiny():
    return xspec.compile(str(SPECS / "tiny.xspec"))


def test_an_update_that_does_not_fit_is_cut_into_passes_that_do(tiny):
    whole = estimate_peak(tiny, tiny.train.batch_tokens // LONGEST, LONGEST, CPU)
    free = FreeMemory(int(whole * 0.8), "test")
    plan = plan_memory(tiny, CPU, 1, LONGEST, free)
    assert not plan.explicit and plan.share == 4096 and LONGEST <= plan.cap < plan.share
    usable = USABLE_SHARE * free.bytes
    assert plan.estimate <= usable and plan.fits
    # As large as fits, within the rounding to 64 tokens (about one sentence here), plus one sentence.
    assert estimate_peak(tiny, plan.cap // LONGEST + 3, LONGEST, CPU) > usable
    assert plan.passes == math.ceil(4096 / plan.cap) >= 2
    assert re.fullmatch(rf"update of 4,096 tokens as about {plan.passes} passes of <= {plan.cap:,} tokens; "
                        rf"estimated peak \d+ MiB of \d+ MiB free \(test\)", plan.describe())


def test_plenty_of_memory_takes_the_update_in_one_pass(tiny):
    plan = plan_memory(tiny, CPU, 1, LONGEST, FreeMemory(64 * 2**30, "CPU RAM"))
    assert plan.cap == plan.share == 4096 and plan.passes == 1
    assert plan.describe().startswith("update of 4,096 tokens in one pass; estimated peak ")
    # Shared by 4 ranks, each pass holds a quarter at most.
    assert plan_memory(tiny, CPU, 4, LONGEST, FreeMemory(64 * 2**30, "CPU RAM")).cap == 1024


def test_a_model_whose_one_sequence_does_not_fit_is_refused_with_the_numbers(tiny):
    fixed = estimate_peak(tiny, 0, 256, CPU)
    with pytest.raises(UserError) as error:
        plan_memory(tiny, CPU, 1, 256, FreeMemory(fixed, "cuda:0"))
    message = str(error.value)
    assert message.startswith("train: not enough memory on cuda:0: the model's weights, gradients and Adam "
                              "moments take ")
    assert "one sequence of 256 tokens (the longest in the training data)" in message
    assert f"but {fixed / 2**20:.0f} MiB is free (90% usable)" in message
    assert "data.max_tokens" in message and 'train.sharding = "fsdp"' in message


def test_an_explicit_max_batch_tokens_is_kept_and_checked(tiny):
    spec = tiny.with_overrides({"train.max_batch_tokens": 1000})
    plenty = plan_memory(spec, CPU, 1, LONGEST, FreeMemory(64 * 2**30, "CPU RAM"))
    assert (plenty.cap, plenty.explicit, plenty.fits) == (1000, True, True)
    little = plan_memory(spec, CPU, 1, LONGEST, FreeMemory(estimate_peak(spec, 1, LONGEST, CPU), "CPU RAM"))
    assert (little.cap, little.explicit, little.fits) == (1000, True, False)     # kept: a warning, not a refusal


def test_sharding_and_half_precision_lower_the_estimate(tiny):
    full = tiny.training_memory(16, 64)
    assert tiny.training_memory(16, 64, activation_bytes=2).activations * 2 == full.activations
    sharded = tiny.training_memory(16, 64, shards=4)
    assert sharded.adam == full.adam // 4 and sharded.gradients == full.gradients // 4
    assert tiny.training_memory(16, 64, replicas=2).gradients == 2 * full.gradients      # DDP's buckets


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in read_metrics_log(run) if "loss" in r]


def test_training_in_many_passes_takes_the_same_steps_as_in_one(small_corpus, tmp_path, monkeypatch, capsys):
    """The plan only cuts an update into passes: the same sentences, the gradients accumulated."""
    spec = dataclasses.replace(toy_spec(max_steps=6, max_batch_tokens="auto", checkpoint_every_steps=None),
                               dropout=0.0)
    options = dict(device="cpu", progress=False, evaluate=False, tensorboard=False)
    train(spec, RunOptions(tmp_path / "one", small_corpus, **options))
    assert "memory plan: update of 600 tokens in one pass" in capsys.readouterr().out

    layout = Layout("cpu", 4, 1, 1)
    little = int(estimate_peak(spec, 1, 101, layout) / USABLE_SHARE) + 1       # one longest sentence a pass
    monkeypatch.setattr(train_module, "free_memory", lambda device: FreeMemory(little, "CPU RAM"))
    train(spec, RunOptions(tmp_path / "many", small_corpus, **options))
    planned = re.search(r"memory plan: update of 600 tokens as about (\d+) passes of <= (\d+) tokens",
                        capsys.readouterr().out)
    assert planned and int(planned[1]) >= 6 and int(planned[2]) <= 101
    assert _losses(tmp_path / "many") == pytest.approx(_losses(tmp_path / "one"), rel=1e-4)
    assert len(_losses(tmp_path / "one")) == 6


def test_an_explicit_cap_beyond_the_free_memory_trains_with_a_warning(small_corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train_module, "free_memory", lambda device: FreeMemory(2**20, "CPU RAM"))
    spec = toy_spec(max_steps=2, max_batch_tokens=300)
    assert train(spec, RunOptions(tmp_path / "run", small_corpus, device="cpu", progress=False, evaluate=False,
                                  tensorboard=False))["steps"] == 2
    out = capsys.readouterr().out
    assert "train.max_batch_tokens: update of 600 tokens as about 2 passes of <= 300 tokens; estimated peak " in out
    assert "warning: train.max_batch_tokens = 300: the estimated peak is more than 90% of the free memory, so the " \
           "run may run out of it; train.max_batch_tokens = \"auto\" plans passes that fit" in out
    # With "auto", the same machine refuses before building anything.
    with pytest.raises(UserError, match="not enough memory on CPU RAM"):
        train(toy_spec(max_steps=2, max_batch_tokens="auto"),
              RunOptions(tmp_path / "auto", small_corpus, device="cpu", progress=False, evaluate=False,
                         tensorboard=False))
    assert not (tmp_path / "auto" / "checkpoints").exists()


def test_a_lora_run_plans_for_its_adapters_alone_and_fits_where_a_full_fine_tune_does_not():
    """Gradients and Adam's moments for the adapters only, the frozen base at the bytes train.lora_base keeps:
    a model whose full fine-tune leaves no room for a sequence trains with LoRA."""
    from xspec.runtime.lora import lora_footprint

    spec = xspec.compile(str(SPECS / "modern" / "llama.xspec"), overrides={"train.lora_rank": 4})
    trained, weight_bytes = lora_footprint(spec)
    linears = 2 * (128 * 128 * 2 + 128 * 64 * 2 + 3 * 128 * 344)      # q, o; k, v; gate, up, down (two layers)
    assert trained == 4 * 2 * (128 + 128) * 2 + 4 * 2 * (128 + 64) * 2 + 4 * 2 * (2 * (128 + 344) + (344 + 128))
    assert weight_bytes == (spec.parameters + trained) * 4
    lora = Layout("cpu", 4, 1, 1, trained, weight_bytes)
    full_fixed, lora_fixed = (estimate_peak(spec, 0, LONGEST, layout) for layout in (CPU, lora))
    assert full_fixed - lora_fixed == 3 * (spec.parameters - trained) * 4 - trained * 4
    int8 = xspec.compile(str(SPECS / "modern" / "llama.xspec"),
                         overrides={"train.lora_rank": 4, "train.lora_base": "int8"})
    _, stored = lora_footprint(int8)
    rows = 2 * (128 + 64 + 64 + 128 + 344 + 344 + 128)
    assert stored == weight_bytes - 3 * linears + 4 * rows
    sequence = estimate_peak(spec, 1, LONGEST, CPU) - full_fixed
    between = lora_fixed + sequence + (full_fixed - lora_fixed) // 2      # room for LoRA's, not the full one's
    free = FreeMemory(int(between / USABLE_SHARE) + 1, "test")
    with pytest.raises(UserError, match="not enough memory"):
        plan_memory(spec, CPU, 1, LONGEST, free)
    assert plan_memory(spec, lora, 1, LONGEST, free).cap >= LONGEST


def test_layers_that_remake_their_activations_plan_for_their_inputs_and_one_layer():
    from xspec.compiler.cost import activation_elements

    spec = xspec.compile(str(SPECS / "modern" / "llama.xspec"), overrides={"layers": 8})
    kept, remade = (activation_elements(spec, 4, LONGEST, recomputed) for recomputed in (False, True))
    seven = xspec.compile(str(SPECS / "modern" / "llama.xspec"), overrides={"layers": 7})
    one_layer = kept - activation_elements(seven, 4, LONGEST)
    outside = kept - 8 * one_layer
    assert remade == pytest.approx(outside + 8 * 4 * LONGEST * 128 + one_layer)
    recomputing = Layout("cpu", 4, 1, 1, recomputed=True)
    assert estimate_peak(spec, 4, LONGEST, recomputing) < estimate_peak(spec, 4, LONGEST, CPU)
