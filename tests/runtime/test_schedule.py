"""§5.3, eq. 3: lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), through torch's LambdaLR."""

import pytest
import torch

from xspec.compiler.sections import TrainSection
from xspec.runtime.schedule import make_optimizer, make_scheduler


def _lrs(train: TrainSection, d_model: int, steps: int) -> list[float]:
    model = torch.nn.Linear(2, 2)
    optimizer = make_optimizer(model.parameters(), train)
    scheduler = make_scheduler(optimizer, train, d_model)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_paper_values_for_the_base_model():
    lrs = _lrs(TrainSection(), d_model=512, steps=8000)
    # step 1 (the first update), the peak at warmup = 4000, and beyond it
    assert lrs[0] == pytest.approx(512**-0.5 * 1 * 4000**-1.5, rel=1e-12)
    assert lrs[3999] == pytest.approx(512**-0.5 * 4000**-0.5, rel=1e-12)     # ~ 7.0e-4
    assert lrs[3999] == pytest.approx(6.98771e-4, rel=1e-5)
    assert lrs[7999] == pytest.approx(512**-0.5 * 8000**-0.5, rel=1e-12)
    assert max(lrs) == lrs[3999]
    assert all(a < b for a, b in zip(lrs[:3999], lrs[1:4000]))                # linear warmup
    assert all(a > b for a, b in zip(lrs[4000:7999], lrs[4001:8000]))          # then ~ step^-0.5


def test_scale_and_warmup_from_the_spec():
    lrs = _lrs(TrainSection(warmup_steps=10, lr_scale=2.0), d_model=64, steps=20)
    assert lrs[9] == pytest.approx(2.0 * 64**-0.5 * 10**-0.5)
    assert lrs[19] == pytest.approx(2.0 * 64**-0.5 * 20**-0.5)


def test_constant_schedule_and_adam_settings():
    train = TrainSection(lr_schedule="constant", lr=3e-4)
    assert _lrs(train, d_model=512, steps=5) == [3e-4] * 5
    optimizer = make_optimizer(torch.nn.Linear(2, 2).parameters(), TrainSection())
    assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9


def test_the_cosine_schedule_warms_up_then_decays_to_zero_at_the_last_step():
    """transformers' get_cosine_schedule_with_warmup, step for step."""
    from transformers import get_cosine_schedule_with_warmup

    train = TrainSection(lr_schedule="cosine", lr=5e-5, warmup_steps=3, max_steps=20, optimizer="adamw")
    lrs = _lrs(train, d_model=64, steps=20)
    optimizer = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=5e-5)
    reference = get_cosine_schedule_with_warmup(optimizer, 3, 20)
    expected = []
    for _ in range(20):
        optimizer.step()
        reference.step()            # transformers' counts the warm-up from 0: one step ahead of ours at step 1
        expected.append(optimizer.param_groups[0]["lr"])
    assert lrs == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert lrs[2] == pytest.approx(5e-5) and lrs[-1] == pytest.approx(0.0, abs=1e-15)
    assert type(make_optimizer(torch.nn.Linear(2, 2).parameters(), train)) is torch.optim.AdamW


def test_a_run_counted_in_epochs_and_a_warmup_as_a_share_of_it():
    from xspec.runtime.schedule import run_length, warmup_warning

    train = TrainSection(epochs=2, warmup_fraction=0.1, max_steps=1500)
    assert (run_length(train, 37).max_steps, run_length(train, 37).warmup_steps) == (74, 7)
    assert run_length(train, 10_000).max_steps == 1500                       # the fewer of the two
    assert run_length(TrainSection(max_steps=50), None) == TrainSection(max_steps=50)
    assert warmup_warning(TrainSection(max_steps=50, warmup_steps=400)) == (
        "warning: train.warmup_steps 400 is not shorter than the run's 50 steps: the learning rate never leaves its "
        "warm-up (set train.warmup_steps or train.warmup_fraction)")
    assert warmup_warning(TrainSection(max_steps=50, warmup_steps=400, lr_schedule="constant")) is None
