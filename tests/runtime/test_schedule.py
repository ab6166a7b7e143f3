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
