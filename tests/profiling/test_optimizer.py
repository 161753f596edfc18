"""time_optimizer_step: the optimiser alone, on a copy, leaving the original untouched."""

from __future__ import annotations

import pytest
import torch

from _profiling_doubles import SlowSGD, assert_close
from seg_datamodule.profiling import time_optimizer_step



def test_time_optimizer_step_leaves_the_original_untouched() -> None:
    layer = torch.nn.Linear(4, 2)
    optimizer = SlowSGD(layer.parameters(), sleep_ms=5.0)
    layer(torch.randn(3, 4)).sum().backward()
    optimizer.step()  # momentum buffers now exist
    before = [p.detach().clone() for p in layer.parameters()]
    momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in layer.parameters()]
    median = time_optimizer_step(optimizer, repeats=3)
    assert_close(median, 5.0, "isolated step")
    for p, b, m in zip(layer.parameters(), before, momentum):
        assert torch.equal(p, b) and torch.equal(optimizer.state[p]["momentum_buffer"], m)
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        time_optimizer_step(optimizer, repeats=0)
