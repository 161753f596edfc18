"""time_optimizer_step: the optimiser alone, on a copy, leaving the original untouched."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from _profiling_doubles import ClockReadings, SlowSGD, assert_bit_identical, assert_isolated_timing
from seg_datamodule.profiling import optimizer as optimizer_module
from seg_datamodule.profiling import time_optimizer_step



def test_time_optimizer_step_leaves_the_original_untouched() -> None:
    layer = torch.nn.Linear(4, 2)
    optimizer = SlowSGD(layer.parameters(), sleep_ms=5.0)
    layer(torch.randn(3, 4)).sum().backward()
    optimizer.step()  # momentum buffers now exist
    before = [p.detach().clone() for p in layer.parameters()]
    momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in layer.parameters()]
    clock = ClockReadings()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(optimizer_module, "time", clock)
        median = time_optimizer_step(optimizer, repeats=9)
    # The copy shares the double's record: one untimed step, then the 9 timed ones. Each timing
    # brackets exactly the step the double measured, and the result is their median.
    assert len(optimizer.spans) == 1 + 1 + 9
    assert clock.readings[0] > optimizer.spans[1][1]  # the untimed step is not timed
    assert_isolated_timing(median, clock, optimizer.spans[2:], "isolated step")
    for p, b, m in zip(layer.parameters(), before, momentum):
        assert torch.equal(p, b) and torch.equal(optimizer.state[p]["momentum_buffer"], m)
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        time_optimizer_step(optimizer, repeats=0)


def _snapshot(optimizer: torch.optim.Optimizer) -> tuple[list[torch.Tensor], dict[str, Any]]:
    params = [p.detach().clone() for group in optimizer.param_groups for p in group["params"]]
    return params, copy.deepcopy(optimizer.state_dict())


OPTIMIZERS = {
    "SGD": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "Adam": lambda p: torch.optim.Adam(p, lr=0.1),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=0.1),
}
SCHEDULERS = {
    "none": None,
    "StepLR": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2),
    "OneCycleLR": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=50),
    "cosine": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10),
}


@pytest.mark.parametrize("scheduler_name", list(SCHEDULERS))
@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
def test_time_optimizer_step_never_steps_the_original(optimizer_name: str, scheduler_name: str) -> None:
    # An LR scheduler wraps `step` on the optimiser instance, bound to the original (issue 12.1).
    layer = torch.nn.Linear(4, 2)
    optimizer = OPTIMIZERS[optimizer_name](layer.parameters())
    make_scheduler = SCHEDULERS[scheduler_name]
    scheduler = None if make_scheduler is None else make_scheduler(optimizer)
    for _ in range(3):
        optimizer.zero_grad()
        layer(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    params, state = _snapshot(optimizer)
    grads = [p.grad.clone() for p in layer.parameters()]
    time_optimizer_step(optimizer, repeats=3)
    after_params, after_state = _snapshot(optimizer)
    assert_bit_identical(after_params, params, "parameters")
    assert_bit_identical(after_state, state)
    assert_bit_identical([p.grad for p in layer.parameters()], grads, "gradients")
    if scheduler is not None:  # the scheduler's bookkeeping is the original's, not the copy's
        assert not hasattr(optimizer.step, "__self__") or optimizer.step.__self__ is optimizer


def test_a_step_that_reaches_the_original_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    import seg_datamodule.profiling.optimizer as module

    layer = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    layer(torch.randn(3, 4)).sum().backward()
    monkeypatch.setattr(module, "_detached_copy", lambda o: o)  # a copy that is the original
    with pytest.raises(RuntimeError, match="changed the original's parameters or state"):
        time_optimizer_step(optimizer, repeats=1)
