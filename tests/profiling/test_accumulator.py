"""StepTimeAccumulator: statistics, shares and storage from exact, made-up times."""

from __future__ import annotations

import math

import numpy as np
import pytest

from _profiling_doubles import SPLIT
from seg_datamodule.profiling import PHASES, StepLabels, StepTimeAccumulator



def test_accumulator_empty_and_warmup_only() -> None:
    acc = StepTimeAccumulator(warmup_steps=2)
    assert acc.compute() == {} and acc.rows() == [] and len(acc) == 0
    acc.update(10.0, {"forward": 4.0})
    acc.update(10.0, {"forward": 4.0})
    assert acc.compute() == {}  # both rows are warm-up
    assert len(acc.rows()) == 2 and acc.rows()[1]["batch"] == 1


def test_accumulator_statistics_and_shares() -> None:
    acc = StepTimeAccumulator(warmup_steps=1)
    acc.update(1000.0, {"train_dataloader_next": 990.0})  # warm-up: left out of the summary
    fetch = [40.0, 42.0, 44.0, 46.0]
    for i, f in enumerate(fetch):
        phases = {"train_dataloader_next": f, "optimizer_step": 30.0}
        acc.update(f + 30.0 + 5.0, phases, labels=StepLabels(optimizer_calls=i % 2))
    summary = acc.compute()
    assert set(summary) == set(PHASES)
    s = summary["train_dataloader_next"]
    assert s["median_ms"] == pytest.approx(43.0)
    assert s["mean_ms"] == pytest.approx(43.0)
    assert s["p90_ms"] == pytest.approx(np.percentile(fetch, 90))
    assert s["total_s"] == pytest.approx(sum(fetch) / 1e3)
    assert summary["other"]["median_ms"] == pytest.approx(5.0)
    assert summary["forward"]["median_ms"] == 0.0
    assert sum(summary[p]["share"] for p in SPLIT) == pytest.approx(1.0)
    assert summary["step"]["share"] == 1.0
    assert summary["optimizer_step"]["share"] == pytest.approx(120.0 / (sum(fetch) + 120 + 20))
    assert summary["optimizer_step"]["stepped_median_ms"] == pytest.approx(30.0)
    assert "device_median_ms" not in summary["step"]


def test_accumulator_clamps_other_and_shares_still_sum_to_one() -> None:
    acc = StepTimeAccumulator(warmup_steps=0)
    acc.update(10.0, {"forward": 6.0, "backward": 6.0})  # named phases exceed the step (clock skew)
    acc.update(10.0, {"forward": 2.0})
    row = acc.rows()[0]
    assert row["other_ms"] == 0.0
    summary = acc.compute()
    assert sum(summary[p]["share"] for p in SPLIT) == pytest.approx(1.0)


def test_accumulator_rejects_bad_rows() -> None:
    acc = StepTimeAccumulator()
    with pytest.raises(ValueError, match=r"unknown \['fwd'\]"):
        acc.update(10.0, {"fwd": 1.0})
    with pytest.raises(ValueError, match="forward_ms must be a finite time >= 0, got -1.0"):
        acc.update(10.0, {"forward": -1.0})
    with pytest.raises(ValueError, match="step_ms must be a finite time >= 0, got nan"):
        acc.update(float("nan"), {})
    with pytest.raises(ValueError, match="warmup_steps must be >= 0"):
        StepTimeAccumulator(-1)
    assert len(acc) == 0


def test_accumulator_device_columns_and_reset() -> None:
    acc = StepTimeAccumulator(warmup_steps=0)
    acc.update(10.0, {"forward": 4.0})  # a host-only row before device rows: NaN-filled
    device = {"forward": 6.0, "backward": 2.0, "other": 2.0, "step": 10.0}
    for _ in range(3):
        acc.update(10.0, {"forward": 4.0}, device_ms=device, device_busy_ms=7.0)
    summary = acc.compute()
    assert summary["forward"]["device_median_ms"] == pytest.approx(6.0)
    assert sum(summary[p]["device_share"] for p in SPLIT) == pytest.approx(1.0)
    assert summary["step"]["device_busy_share"] == pytest.approx(0.7)
    assert summary["step"]["device_idle_share"] == pytest.approx(0.3)
    assert math.isnan(acc.rows()[0]["device_forward_ms"])
    acc.reset()
    assert len(acc) == 0 and acc.rows() == []


def test_a_held_column_does_not_block_updates() -> None:
    acc = StepTimeAccumulator(warmup_steps=0)
    phases = {p: 1.0 for p in ("train_dataloader_next", "batch_to_device", "forward", "backward", "optimizer_step")}
    acc.update(10.0, phases)
    held = acc.column("forward_ms")
    acc.update(12.0, phases)
    assert len(held) == 1 and len(acc.column("forward_ms")) == 2 and len(acc) == 2
