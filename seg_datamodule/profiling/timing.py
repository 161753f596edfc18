"""Phase timing: a stack of open phases turned into per-step boundary times, on the host clock
and (on CUDA) as events on the current stream, and the split of those boundaries into phases.

What is measured, and where (the callback decides which hook enters which phase):

* Host phases use ``time.perf_counter``: with asynchronous kernels they measure the launches,
  and device work surfaces wherever the host next waits.
* Each phase boundary also records a CUDA event on the current stream, read back without
  blocking once the device has passed it, so ``device_<phase>_ms`` is the stream's time between
  the phase's markers (the GPU work lands in the phase that launched it). ``device_busy_ms`` is
  a lower bound of the time the stream was busy: between two markers the stream is certainly
  busy from the moment the host had enqueued all the interval's work until it reaches the
  second marker. Work on other streams (NCCL, side streams) is not seen. ``synchronize=True``
  synchronises at every boundary instead, so host phases contain their device work exactly, at
  the cost of the overlap. Off CUDA no event is created.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from seg_datamodule.profiling.accumulator import PHASES, _OTHER, _SPLIT

__all__ = ["CudaMarks", "PhaseTimer", "StepRecord", "attribute", "device_split", "split_record"]

@dataclass
class StepRecord:
    """The boundaries of one step: after boundary ``i`` phase ``active[i]`` runs (-1: none)."""

    host: list[float] = field(default_factory=list)  # perf_counter seconds
    enqueue: list[float] = field(default_factory=list)  # host time before synchronising
    active: list[int] = field(default_factory=list)
    events: list[Any] | None = None  # one CUDA event per boundary
    anchor: tuple[Any, float] | None = None  # (event, host seconds) aligning device to host
    optimizer_calls: int = 0
    labels: dict[str, int] = field(default_factory=dict)

    def ready(self) -> bool:
        """Whether the device has passed the step's last marker (always, off CUDA)."""
        return self.events is None or bool(self.events[-1].query())


class CudaMarks:
    """CUDA events on the current stream, and a host/device clock anchor. Built only on CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.anchor: tuple[Any, float] | None = None

    def record(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def reanchor(self) -> None:
        """One synchronisation: the anchor event has run by the time ``perf_counter`` is read."""
        event = self.record()
        event.synchronize()
        self.anchor = (event, time.perf_counter())


class PhaseTimer:
    """Exclusive phase times of one step at a time, from enter/exit calls in any nesting.

    A phase entered while another runs pauses it; exiting a phase also closes the phases opened
    inside it; entering a phase already open, or anything while no step is open, does nothing.

    Args:
        clock: seconds, monotonic (``time.perf_counter``).
        marks: records a device marker at each boundary (``CudaMarks``); ``None`` off CUDA.
        synchronize: wait for the device at each boundary (needs ``marks``).
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        marks: Any = None,
        synchronize: bool = False,
    ) -> None:
        self.clock = clock
        self.marks = marks
        self.synchronize = synchronize and marks is not None
        self._stack: list[int] = []
        self._record: StepRecord | None = None

    @property
    def is_open(self) -> bool:
        return self._record is not None

    @property
    def current(self) -> int | None:
        """The phase running now (innermost), or None between phases or steps."""
        return self._stack[-1] if self._stack else None

    def open(self) -> None:
        if self._record is not None:
            return
        self._record = StepRecord()
        if self.marks is not None:
            self._record.events = []
            self._record.anchor = self.marks.anchor
        self._stack = []
        self._boundary()

    def enter(self, phase: int) -> None:
        if self._record is None or phase in self._stack:
            return
        self._stack.append(phase)
        self._boundary()

    def exit(self, phase: int) -> None:
        if self._record is None or phase not in self._stack:
            return
        del self._stack[self._stack.index(phase) :]
        self._boundary()

    def count_optimizer_call(self) -> None:
        if self._record is not None:
            self._record.optimizer_calls += 1

    def close(self, **labels: int) -> StepRecord | None:
        record = self._record
        if record is None:
            return None
        self._stack = []
        self._boundary()
        record.labels = labels
        self._record = None
        return record

    def discard(self) -> None:
        self._record = None
        self._stack = []

    def _boundary(self) -> None:
        record = self._record
        assert record is not None
        if record.events is not None:
            record.events.append(self.marks.record())
        enqueue = self.clock()
        if self.synchronize:
            self.marks.synchronize()
            now = self.clock()
        else:
            now = enqueue
        record.host.append(now)
        record.enqueue.append(enqueue)
        record.active.append(self._stack[-1] if self._stack else -1)


def attribute(boundaries: Sequence[float], active: Sequence[int], scale: float = 1e3) -> list[float]:
    """Sum the intervals between boundaries per phase (plain Python: about 12 boundaries a step).

    Args:
        boundaries (Sequence[float], K + 1): times, in seconds for ``scale=1e3``.
        active (Sequence[int], >= K): phase index running after each boundary; -1 for none,
            counted as ``other``. Entries past K are ignored.
        scale: multiplies every interval (1e3: seconds to ms).

    Returns:
        list[float]: time per phase of ``PHASES[:-1]`` (the exclusive split).
    """
    out = [0.0] * len(_SPLIT)
    previous = boundaries[0]
    for phase, time_ in zip(active, boundaries[1:]):
        out[phase if phase >= 0 else _OTHER] += (time_ - previous) * scale
        previous = time_
    return out


def device_split(
    segment_ms: Sequence[float], first_s: float, enqueue_s: Sequence[float], active: Sequence[int]
) -> tuple[list[float], float, float]:
    """Device time per phase, the device span and a lower bound of the busy time of one step.

    Marker ``i`` was enqueued by the host at ``enqueue_s[i]`` and reached by the stream at
    ``g[i]`` (both host-clock seconds). Between markers ``i`` and ``i + 1`` the stream is busy at
    least from ``max(g[i], enqueue_s[i + 1])`` -- all the interval's work is queued by then and
    only the device holds it back -- until ``g[i + 1]``; before that it may have been waiting
    for the host.

    Args:
        segment_ms (Sequence[float], K): device time between consecutive markers.
        first_s (float): ``g[0]``.
        enqueue_s (Sequence[float], K + 1): host enqueue times of the markers.
        active (Sequence[int], K + 1): phase after each marker (-1: none).

    Returns:
        (ms per phase of ``PHASES[:-1]``, span ms, busy ms).
    """
    g = [first_s]
    for segment in segment_ms:
        g.append(g[-1] + segment / 1e3)
    busy_s = sum(max(0.0, g[i + 1] - max(g[i], enqueue_s[i + 1])) for i in range(len(segment_ms)))
    return attribute(g, active), float(sum(segment_ms)), busy_s * 1e3


def split_record(
    record: StepRecord,
) -> tuple[float, dict[str, float], dict[str, float] | None, float | None]:
    """(step ms, timed phase ms, device phase ms or None, device busy ms or None) of a record."""
    host = record.host
    per_phase = attribute(host, record.active)
    step_ms = (host[-1] - host[0]) * 1e3
    phase_ms = dict(zip(PHASES[:_OTHER], per_phase))
    if record.events is None or record.anchor is None:
        return step_ms, phase_ms, None, None
    events = record.events
    segment_ms = [a.elapsed_time(b) for a, b in zip(events[:-1], events[1:])]
    anchor_event, anchor_host = record.anchor
    first_s = anchor_host + anchor_event.elapsed_time(events[0]) / 1e3
    device, span_ms, busy_ms = device_split(segment_ms, first_s, record.enqueue, record.active)
    device_ms = dict(zip(_SPLIT, device))
    device_ms["step"] = span_ms
    return step_ms, phase_ms, device_ms, busy_ms
