"""Phase timer and device split: exclusive nesting, boundaries to phases, fake CUDA events."""

from __future__ import annotations

import pytest

from seg_datamodule.profiling.accumulator import PHASES
from seg_datamodule.profiling.timing import PhaseTimer, attribute, device_split, split_record



class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_phase_timer_exclusive_nesting_sums_to_step() -> None:
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    fetch, to_device, forward, backward, optimizer = (
        PHASES.index(p) for p in ("train_dataloader_next", "batch_to_device", "forward", "backward", "optimizer_step"))

    def at(ms: float) -> PhaseTimer:
        clock.now = ms / 1e3
        return timer

    timer.enter(forward)  # no step open: ignored
    at(0).open()
    timer.enter(fetch)
    at(4).exit(fetch)
    at(5).enter(to_device)
    at(6).exit(to_device)
    at(7).enter(forward)
    at(8).enter(fetch)  # a dataloader_iter fetch inside training_step
    at(9).exit(fetch)
    at(10).enter(backward)  # manual_backward inside training_step
    at(12).exit(backward)
    at(13).enter(optimizer)  # opt.step() inside training_step
    at(13).enter(optimizer)  # re-entry (LBFGS closures): ignored
    at(16).exit(optimizer)
    at(18).exit(forward)
    at(20)
    record = timer.close(batch=0)
    assert record is not None and not timer.is_open and timer.close() is None
    step_ms, phase_ms, device_ms, busy_ms = split_record(record)
    assert step_ms == pytest.approx(20.0)
    expected = {"train_dataloader_next": 5.0, "batch_to_device": 1.0, "device_work": 0.0, "forward": 5.0,
                "backward": 2.0, "optimizer_step": 3.0}
    assert phase_ms == pytest.approx(expected)
    assert device_ms is None and busy_ms is None
    other = step_ms - sum(phase_ms.values())
    assert other == pytest.approx(1.0 + 1.0 + 2.0)


def test_phase_timer_exit_closes_nested_and_discard() -> None:
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    timer.open()
    timer.enter(2)
    clock.now = 0.001
    timer.enter(4)  # never exited by itself
    clock.now = 0.003
    timer.exit(2)  # closes 4 too
    timer.exit(4)  # already closed: ignored
    clock.now = 0.004
    record = timer.close()
    assert record is not None
    assert record.active == [-1, 2, 4, -1, -1]
    timer.open()
    timer.discard()
    assert not timer.is_open


def test_attribute_maps_none_to_other() -> None:
    # intervals of 1, 2 and 3 s after boundaries running none, fetch and optimizer_step
    optimizer = PHASES.index("optimizer_step")
    out = attribute([0.0, 1.0, 3.0, 6.0], [-1, 0, optimizer, -1], scale=1.0)
    assert out == [2.0, 0.0, 0.0, 0.0, 0.0, 3.0, 1.0]


# ---------------------------------------------------------------------------- device split


FORWARD, OTHER = PHASES.index("forward"), PHASES.index("other")


def test_device_split_busy_lower_bound() -> None:
    active = [-1, FORWARD, -1]
    # Starved device: each marker runs the moment it is enqueued -> nothing provably busy.
    per_phase, span, busy = device_split([5.0, 20.0], 1.0, [1.0, 1.005, 1.025], active)
    assert span == pytest.approx(25.0) and busy == pytest.approx(0.0)
    assert per_phase[FORWARD] == pytest.approx(20.0) and per_phase[OTHER] == pytest.approx(5.0)
    # Device behind: the host enqueued the forward's work in 2 ms, the device ran it for 20 ms
    # starting when it reached the marker -> busy from 1.005 s (end of enqueue is earlier) to 1.025 s.
    _, _, busy = device_split([5.0, 20.0], 1.0, [0.990, 0.992, 0.994], active)
    assert busy == pytest.approx(25.0)
    # Partly: the last work was enqueued 15 ms into the device's 20 ms interval -> 5 ms certain.
    _, _, busy = device_split([5.0, 20.0], 1.0, [1.0, 1.005, 1.020], active)
    assert busy == pytest.approx(5.0)


class FakeEvent:
    """A CUDA event stand-in: reached by the fake device at ``device_s``."""

    def __init__(self, device_s: float, done: bool = True) -> None:
        self.device_s = device_s
        self.done = done

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def elapsed_time(self, other: FakeEvent) -> float:
        return (other.device_s - self.device_s) * 1e3


class FakeMarks:
    """``_CudaMarks`` stand-in: the device runs ``lag_s`` behind the host clock."""

    def __init__(self, clock: FakeClock, lag_s: float) -> None:
        self.clock = clock
        self.lag_s = lag_s
        self.anchor = (FakeEvent(0.0), 0.0)
        self.synchronized = 0

    def record(self) -> FakeEvent:
        return FakeEvent(self.clock.now + self.lag_s)

    def synchronize(self) -> None:
        self.synchronized += 1


def test_timer_with_device_marks_reports_device_split() -> None:
    clock = FakeClock()
    marks = FakeMarks(clock, lag_s=0.010)  # the device is 10 ms behind throughout: always busy
    timer = PhaseTimer(clock=clock, marks=marks)
    timer.open()
    clock.now = 0.002
    timer.enter(FORWARD)
    clock.now = 0.012
    timer.exit(FORWARD)
    clock.now = 0.015
    record = timer.close()
    assert record is not None and record.ready() and len(record.events) == 4
    step_ms, phase_ms, device_ms, busy_ms = split_record(record)
    assert phase_ms["forward"] == pytest.approx(10.0) and step_ms == pytest.approx(15.0)
    assert device_ms is not None and device_ms["forward"] == pytest.approx(10.0)
    assert device_ms["step"] == pytest.approx(15.0)
    assert busy_ms == pytest.approx(15.0)
    record.events[-1].done = False
    assert not record.ready()
    # synchronize=True waits at every boundary
    timer = PhaseTimer(clock=clock, marks=marks, synchronize=True)
    timer.open()
    timer.close()
    assert marks.synchronized == 2
