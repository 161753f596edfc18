"""Where the time of a training step goes: the ``StepTimeProfiler`` callback and its accumulator.

A training step (one batch) is split into phases whose names are a contract::

    train_dataloader_next  waiting for the next batch (Lightning's
                           ``[_TrainingEpochLoop].train_dataloader_next``)
    batch_to_device        ``on_before_batch_transfer`` + the strategy's ``batch_to_device``
                           (``transfer_batch_to_device`` and ``on_after_batch_transfer``)
    forward                the strategy's ``training_step``, less the phases nested in it
    backward               ``on_before_backward`` .. ``on_after_backward``
    optimizer_step         ``on_before_optimizer_step`` .. the end of ``optimizer.step``
                           (gradient clipping included)
    other                  the rest of the step: hooks, ``zero_grad``, LR schedulers, ``self.log``,
                           and under AMP ``scaler.unscale_`` (it runs before
                           ``on_before_optimizer_step``)
    step                   the whole, from the start of the fetch to ``on_train_batch_end``

The phases other than ``step`` are exclusive: a phase that starts inside another (the fetch
inside ``training_step`` with a ``dataloader_iter``; ``manual_backward`` and ``opt.step()`` inside
``training_step`` under manual optimisation) pauses the outer one, so the five timed phases and
``other`` add up to ``step`` exactly.

Layout, after Lightning's ``fabric/utilities/throughput.py`` under ``ThroughputMonitor``:

* :class:`StepTimeAccumulator` -- plain ``update / compute / reset`` over per-step phase times;
  knows nothing of Lightning or CUDA.
* ``_PhaseTimer`` -- a stack of open phases turned into per-step boundary times (and CUDA events).
* :class:`StepTimeProfiler` -- the thin adapter from Lightning's hooks and profiler actions to
  the two above, plus the end-of-fit report (console table, ``step_time.json``, PNG).

What exactly is measured, and where:

* **The fetch.** Lightning brackets ``next(iterator)`` with ``profiler.start/stop`` of
  ``[_TrainingEpochLoop].train_dataloader_next``; the callback wraps the Trainer's profiler to see
  those calls (and forwards everything to the profiler the user configured). For a sized
  dataloader this is the wait for the batch the step trains on. For an unsized one (an
  ``IterableDataset``) Lightning's ``_PrefetchDataFetcher`` keeps one batch in hand: step *k*
  trains on the batch fetched in step *k - 1* and waits for batch *k + 1*. Either way the
  interval measured is the time step *k* spent blocked on the loader.
* **The step** ends in this callback's ``on_train_batch_end``: callbacks listed after this one,
  the module's ``on_train_batch_end``, the loggers writing the step's metrics, validation and
  checkpointing between batches are not in any step (Lightning's own profiler reports them).
* **Gradient accumulation.** Batches that only accumulate have no optimiser call and an
  ``optimizer_step`` of 0, so with ``accumulate_grad_batches >= 2`` the phase's median is 0: read
  its ``mean_ms`` / ``share``, or ``stepped_median_ms`` (the median over batches that stepped).
* **AMP.** The phase covers ``scaler.step`` (its inf check synchronises with the device) but not
  the ``scaler.update`` after it. When the scaler skips a step (non-finite gradients)
  ``optimizer.step`` never runs, and the phase ends with Lightning's ``optimizer_step`` hook.
* **Manual optimisation.** ``forward`` is the user's ``training_step`` less the ``backward``
  (``manual_backward``) and ``optimizer_step`` (each ``opt.step()``) inside it; steps without an
  ``opt.step()`` behave like accumulation. ``batch_to_device`` is 0 when ``training_step`` takes
  a ``dataloader_iter`` (the user moves the batch, inside ``forward``).
* **CUDA.** Host phases use ``time.perf_counter``: with asynchronous kernels they measure the
  launches, and device work surfaces wherever the host next waits. Each phase boundary also
  records a CUDA event on the current stream, read back without blocking once the device has
  passed it, so ``device_<phase>_ms`` is the stream's time between the phase's markers (the GPU
  work lands in the phase that launched it). ``device_busy_share`` is a lower bound of the
  share of the step the stream was busy: between two markers the stream is certainly busy from
  the moment the host had enqueued all the interval's work until it reaches the second marker.
  Work on other streams (NCCL, side streams) is not seen. ``synchronize=True`` synchronises at
  every boundary instead, so host phases contain their device work exactly, at the cost of the
  overlap. Off CUDA no event is created.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from array import array
from collections import OrderedDict, defaultdict, deque
from collections.abc import Generator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import Profiler
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from seg_datamodule.ops.checks import check_bool, check_int
from seg_datamodule.profiling.plot import plot_step_split

__all__ = [
    "PHASES",
    "format_table",
    "StepTimeAccumulator",
    "StepTimeProfiler",
    "plot_step_split",
    "time_optimizer_step",
]

#: Phase names, a contract: keys of :meth:`StepTimeProfiler.summary`, ``step_time/<phase>_ms``.
PHASES: tuple[str, ...] = (
    "train_dataloader_next",
    "batch_to_device",
    "forward",
    "backward",
    "optimizer_step",
    "other",
    "step",
)
_FETCH, _TO_DEVICE, _FORWARD, _BACKWARD, _OPTIMIZER, _OTHER, _STEP = range(len(PHASES))
_SPLIT = PHASES[:_STEP]  # the exclusive phases, whose shares sum to 1
_TIMED_SET = frozenset(PHASES[:_OTHER])  # the phases with their own brackets
_LABELS = ("batch", "epoch", "global_step", "optimizer_calls")
# A resolved CUDA anchor goes stale as host and device clocks drift; re-anchor this often.
_ANCHOR_EVERY_N_STEPS = 1000
# Rows kept waiting for their CUDA events before the oldest is read with a blocking wait.
_MAX_PENDING = 64


# ---------------------------------------------------------------------------------------------
# Accumulator: Lightning-free
# ---------------------------------------------------------------------------------------------


class StepTimeAccumulator:
    """Per-step phase times in, summary statistics out. Knows nothing of Lightning or CUDA.

    Rows are kept column-wise in ``array('d')`` (8 bytes a value: a million steps cost about
    90 MB, 150 MB with device times), so the summary can be recomputed at any time.

    Args:
        warmup_steps (int): the first rows left out of :meth:`compute` (start-up, worker spawn,
            allocator and autotuner warm-up); they stay in :meth:`rows`.

    Raises:
        TypeError: ``warmup_steps`` is not an int.
        ValueError: ``warmup_steps`` is negative.

    Example::

        acc = StepTimeAccumulator(warmup_steps=0)
        acc.update(50.0, {"train_dataloader_next": 40.0, "forward": 6.0})
        acc.compute()["other"]["median_ms"]  # 4.0
    """

    def __init__(self, warmup_steps: int = 5) -> None:
        check_int("warmup_steps", warmup_steps, 0)
        self.warmup_steps = warmup_steps
        self._columns: dict[str, array] = {}
        self._count = 0
        self.reset()

    def __len__(self) -> int:
        return self._count

    def reset(self) -> None:
        """Forget every row."""
        self._columns = {name: array("d") for name in (*_LABELS, *(f"{p}_ms" for p in PHASES))}
        self._count = 0

    def update(
        self,
        step_ms: float,
        phase_ms: Mapping[str, float],
        *,
        device_ms: Mapping[str, float] | None = None,
        device_busy_ms: float | None = None,
        batch: int | None = None,
        epoch: int = 0,
        global_step: int | None = None,
        optimizer_calls: int = 0,
    ) -> dict[str, float]:
        """Add one step.

        Args:
            step_ms (float): the whole step, wall clock.
            phase_ms (Mapping[str, float]): the timed phases (any of the first five of
                :data:`PHASES`; a missing one is 0). ``other`` is derived:
                ``max(0, step_ms - sum(phase_ms))``.
            device_ms (Mapping[str, float] | None): device (stream) time per phase, ``other``
                included, and ``step``, the device's span of the step; ``None`` off CUDA.
            device_busy_ms (float | None): a lower bound of the time the device was busy
                within ``device_ms["step"]``.
            batch (int | None): the batch index across epochs; the row count when ``None``.
            epoch (int): the epoch.
            global_step (int | None): the optimiser steps so far; ``batch`` when ``None``.
            optimizer_calls (int): optimiser steps taken in this step (0 while accumulating).

        Returns:
            dict[str, float]: the stored row, ``<phase>_ms`` for every phase.

        Raises:
            ValueError: an unknown phase name, or a negative or non-finite time.
        """
        timed = PHASES[:_OTHER]
        if not phase_ms.keys() <= _TIMED_SET:
            unknown = sorted(set(phase_ms) - _TIMED_SET)
            raise ValueError(f"phase_ms keys must be among {timed}, got unknown {unknown}")
        batch = self._count if batch is None else batch
        row: dict[str, float] = {
            "batch": float(batch),
            "epoch": float(epoch),
            "global_step": float(batch if global_step is None else global_step),
            "optimizer_calls": float(optimizer_calls),
        }
        named = 0.0
        for p in timed:
            value = float(phase_ms.get(p, 0.0))
            if not 0.0 <= value < math.inf:  # also catches NaN
                raise ValueError(f"{p}_ms must be a finite time >= 0, got {value!r}")
            row[f"{p}_ms"] = value
            named += value
        step_ms = float(step_ms)
        if not 0.0 <= step_ms < math.inf:
            raise ValueError(f"step_ms must be a finite time >= 0, got {step_ms!r}")
        # The named phases are disjoint sub-intervals of the step, so this only clamps rounding.
        row["other_ms"] = max(0.0, step_ms - named)
        row["step_ms"] = step_ms
        if device_ms is not None:
            for p in PHASES:
                row[f"device_{p}_ms"] = float(device_ms.get(p, 0.0))
            row["device_busy_ms"] = math.nan if device_busy_ms is None else float(device_busy_ms)
        columns = self._columns
        for key, value in row.items():
            column = columns.get(key)
            if column is None:  # first row with device times: earlier rows had none
                column = columns[key] = array("d", [math.nan]) * self._count
            column.append(value)
        if len(columns) > len(row):  # a host-only row after device rows
            for column in columns.values():
                if len(column) == self._count:
                    column.append(math.nan)
        self._count += 1
        return row

    def column(self, name: str, measured_only: bool = True) -> np.ndarray:
        """One column as float64, e.g. ``"forward_ms"``; without the warm-up rows by default.

        Raises:
            KeyError: no such column.
        """
        # A copy: a view would pin the array('d') buffer, and the next update could not grow it.
        values = np.array(self._columns[name], dtype=np.float64) if self._count else np.zeros(0)
        return values[self.warmup_steps :] if measured_only else values

    def rows(self) -> list[dict[str, float | int]]:
        """Every row, warm-up included, as dicts (labels as ints): the JSON's ``rows``."""
        names = list(self._columns)
        columns = [self._columns[n] for n in names]
        out: list[dict[str, float | int]] = []
        for i in range(self._count):
            row: dict[str, float | int] = {}
            for name, column in zip(names, columns):
                value = column[i]
                row[name] = int(value) if name in _LABELS else value
            out.append(row)
        return out

    def compute(self) -> dict[str, dict[str, float]]:
        """Summary statistics over the rows after the warm-up.

        Returns:
            dict[str, dict[str, float]]: per phase of :data:`PHASES`, ``median_ms``, ``mean_ms``,
            ``p90_ms``, ``total_s`` and ``share`` (of the summed time of the phases other than
            ``step``, which is the total step time, so those shares sum to 1; ``step``'s share is
            1). ``optimizer_step`` adds ``stepped_median_ms``, the median over steps that called
            the optimiser (NaN if none did). With device times, every phase adds
            ``device_median_ms``, ``device_total_s`` and ``device_share``, and ``step`` adds
            ``device_busy_share`` and ``device_idle_share``. Empty when no step is past the
            warm-up.
        """
        if self._count <= self.warmup_steps:
            return {}
        totals = {p: float(self.column(f"{p}_ms").sum()) / 1e3 for p in PHASES}
        split_total = sum(totals[p] for p in _SPLIT)
        summary: dict[str, dict[str, float]] = {}
        for p in PHASES:
            x = self.column(f"{p}_ms")
            if split_total <= 0:
                share = math.nan
            else:
                share = 1.0 if p == "step" else totals[p] / split_total
            summary[p] = {
                "median_ms": float(np.median(x)),
                "mean_ms": float(x.mean()),
                "p90_ms": float(np.percentile(x, 90)),
                "total_s": totals[p],
                "share": share,
            }
        stepped = self.column("optimizer_calls") > 0
        opt = self.column("optimizer_step_ms")[stepped]
        summary["optimizer_step"]["stepped_median_ms"] = float(np.median(opt)) if opt.size else math.nan
        if "device_step_ms" in self._columns:
            span = self.column("device_step_ms")
            valid = np.isfinite(span)
            if valid.any():
                device_totals = {p: float(self.column(f"device_{p}_ms")[valid].sum()) / 1e3 for p in PHASES}
                device_split = sum(device_totals[p] for p in _SPLIT)
                for p in PHASES:
                    x = self.column(f"device_{p}_ms")[valid]
                    summary[p]["device_median_ms"] = float(np.median(x))
                    summary[p]["device_total_s"] = device_totals[p]
                    if device_split <= 0:
                        summary[p]["device_share"] = math.nan
                    else:
                        summary[p]["device_share"] = 1.0 if p == "step" else device_totals[p] / device_split
                busy = float(np.nansum(self.column("device_busy_ms")[valid])) / 1e3
                busy_share = min(1.0, busy / device_totals["step"]) if device_totals["step"] > 0 else math.nan
                summary["step"]["device_busy_share"] = busy_share
                summary["step"]["device_idle_share"] = 1.0 - busy_share
        return summary


# ---------------------------------------------------------------------------------------------
# Phase timer: a stack of open phases -> boundary times per step
# ---------------------------------------------------------------------------------------------


@dataclass
class _StepRecord:
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


class _CudaMarks:
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


class _PhaseTimer:
    """Exclusive phase times of one step at a time, from enter/exit calls in any nesting.

    A phase entered while another runs pauses it; exiting a phase also closes the phases opened
    inside it; entering a phase already open, or anything while no step is open, does nothing.

    Args:
        clock: seconds, monotonic (``time.perf_counter``).
        marks: records a device marker at each boundary (``_CudaMarks``); ``None`` off CUDA.
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
        self._record: _StepRecord | None = None

    @property
    def is_open(self) -> bool:
        return self._record is not None

    def open(self) -> None:
        if self._record is not None:
            return
        self._record = _StepRecord()
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

    def close(self, **labels: int) -> _StepRecord | None:
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


def _attribute(boundaries: Sequence[float], active: Sequence[int], scale: float = 1e3) -> list[float]:
    """Sum the intervals between boundaries per phase (plain Python: about 12 boundaries a step).

    Args:
        boundaries (Sequence[float], K + 1): times, in seconds for ``scale=1e3``.
        active (Sequence[int], >= K): phase index running after each boundary; -1 for none,
            counted as ``other``. Entries past K are ignored.
        scale: multiplies every interval (1e3: seconds to ms).

    Returns:
        list[float] of 6: time per phase of ``PHASES[:6]`` (the exclusive split).
    """
    out = [0.0] * len(_SPLIT)
    previous = boundaries[0]
    for phase, time_ in zip(active, boundaries[1:]):
        out[phase if phase >= 0 else _OTHER] += (time_ - previous) * scale
        previous = time_
    return out


def _device_split(
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
        (ms per phase of ``PHASES[:6]``, span ms, busy ms).
    """
    g = [first_s]
    for segment in segment_ms:
        g.append(g[-1] + segment / 1e3)
    busy_s = sum(max(0.0, g[i + 1] - max(g[i], enqueue_s[i + 1])) for i in range(len(segment_ms)))
    return _attribute(g, active), float(sum(segment_ms)), busy_s * 1e3


def _split_record(
    record: _StepRecord,
) -> tuple[float, dict[str, float], dict[str, float] | None, float | None]:
    """(step ms, timed phase ms, device phase ms or None, device busy ms or None) of a record."""
    host = record.host
    per_phase = _attribute(host, record.active)
    step_ms = (host[-1] - host[0]) * 1e3
    phase_ms = dict(zip(PHASES[:_OTHER], per_phase))
    if record.events is None or record.anchor is None:
        return step_ms, phase_ms, None, None
    events = record.events
    segment_ms = [a.elapsed_time(b) for a, b in zip(events[:-1], events[1:])]
    anchor_event, anchor_host = record.anchor
    first_s = anchor_host + anchor_event.elapsed_time(events[0]) / 1e3
    device, span_ms, busy_ms = _device_split(segment_ms, first_s, record.enqueue, record.active)
    device_ms = dict(zip(_SPLIT, device))
    device_ms["step"] = span_ms
    return step_ms, phase_ms, device_ms, busy_ms


# ---------------------------------------------------------------------------------------------
# Isolated optimiser step
# ---------------------------------------------------------------------------------------------


def time_optimizer_step(optimizer: torch.optim.Optimizer, repeats: int = 10) -> float:
    """Median time of ``optimizer.step()`` alone, on a deep copy of its parameters and state.

    The copy gets the current gradients (zeros when no parameter has one), takes one untimed
    step, then ``repeats`` timed ones, each bracketed by a device synchronisation on CUDA. The
    original optimiser, parameters and state are untouched. Needs memory for a second copy of
    the parameters, gradients and optimiser state.

    Args:
        optimizer (torch.optim.Optimizer): the optimiser to time.
        repeats (int): timed steps, >= 1.

    Returns:
        float: the median step time in ms.

    Raises:
        TypeError: ``repeats`` is not an int.
        ValueError: ``repeats`` < 1.
    """
    check_int("repeats", repeats, 1)
    # Not copy.deepcopy(optimizer): Optimizer.__getstate__ keeps only defaults, state and
    # param_groups, dropping a subclass's own attributes. Same class and attributes, copied
    # parameters and state (one memo keeps the state keyed to the copied parameters), no hooks.
    clone = object.__new__(type(optimizer))
    clone.__dict__.update(optimizer.__dict__)
    memo: dict[int, Any] = {}
    clone.param_groups = copy.deepcopy(optimizer.param_groups, memo)
    clone.state = defaultdict(dict, copy.deepcopy(dict(optimizer.state), memo))
    clone._optimizer_step_pre_hooks = OrderedDict()
    clone._optimizer_step_post_hooks = OrderedDict()
    pairs = [
        (p, q)
        for group, clone_group in zip(optimizer.param_groups, clone.param_groups)
        for p, q in zip(group["params"], clone_group["params"])
    ]
    any_grad = any(p.grad is not None for p, _ in pairs)
    for p, q in pairs:
        if p.grad is not None:
            q.grad = p.grad.detach().clone()
        elif not any_grad:
            q.grad = torch.zeros_like(q)
    cuda = [q.device for _, q in pairs if q.device.type == "cuda"]

    def sync() -> None:
        for device in set(cuda):
            torch.cuda.synchronize(device)

    clone.step()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        clone.step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


# ---------------------------------------------------------------------------------------------
# Lightning adapter
# ---------------------------------------------------------------------------------------------


class _TapProfiler(Profiler):
    """Forwards everything to the Trainer's profiler, calling taps around chosen actions.

    Lightning times the fetch with ``profiler.start/stop`` and hooks with ``profiler.profile``;
    installing this as ``trainer.profiler`` is the only way to see the fetch without patching a
    loop. Taps run inside the wrapped profiler's bracket, so its overhead is not in our phases.
    ``Profiler.__init__`` is deliberately not called: attributes not set here read through to
    the wrapped profiler.
    """

    def __init__(
        self,
        inner: Profiler,
        on_start: dict[str, Callable[[], None]],
        on_stop: dict[str, Callable[[], None]],
    ) -> None:
        self.inner = inner
        self._on_start = on_start
        self._on_stop = on_stop

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "_on_start", "_on_stop"):  # unpickling: not set yet
            raise AttributeError(name)
        return getattr(self.inner, name)

    def start(self, action_name: str) -> None:
        self.inner.start(action_name)
        tap = self._on_start.get(action_name)
        if tap is not None:
            tap()

    def stop(self, action_name: str) -> None:
        tap = self._on_stop.get(action_name)
        if tap is not None:
            tap()
        self.inner.stop(action_name)

    def profile(self, action_name: str) -> Any:
        if action_name in self._on_start or action_name in self._on_stop:
            return self._tapped(action_name)
        return self.inner.profile(action_name)

    @contextmanager
    def _tapped(self, action_name: str) -> Generator[str, None, None]:
        with self.inner.profile(action_name):
            tap = self._on_start.get(action_name)
            if tap is not None:
                tap()
            try:
                yield action_name
            finally:
                tap = self._on_stop.get(action_name)
                if tap is not None:
                    tap()

    def summary(self) -> str:
        return self.inner.summary()

    def describe(self) -> None:
        self.inner.describe()

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        self.inner.setup(stage, local_rank=local_rank, log_dir=log_dir)

    def teardown(self, stage: str | None) -> None:
        self.inner.teardown(stage)

    def __del__(self) -> None:
        # The base class tears down on deletion; the wrapped profiler is not ours to close.
        pass


class StepTimeProfiler(Callback):
    """Split each training step's time into phases, log it, and report where the time goes.

    Per step: the phases of :data:`PHASES` (see the module docstring for what each covers under
    accumulation, AMP, manual optimisation and CUDA) to the Trainer's loggers as
    ``step_time/<phase>_ms`` every ``log_every_n_steps``. At the end of fit, on rank 0: a table
    on the console and ``<filename>.json`` (summary, per-rank medians, per-step rows) and
    ``<filename>.png`` (:func:`plot_step_split`) in ``dirpath``. Under DDP the table also gives,
    per phase, the slowest rank and its median, so stragglers show; :meth:`summary` is the local
    rank's. With ``strategy="ddp_spawn"`` the measuring happens in the spawned processes, so the
    callback object in the launching process stays empty: read the JSON.

    Example::

        trainer = Trainer(callbacks=[StepTimeProfiler(warmup_steps=10)])
        trainer.fit(model, datamodule)
        trainer.callbacks[0].summary()["train_dataloader_next"]["share"]

    Args:
        warmup_steps (int): first steps left out of the summary (they are still logged and in
            the JSON rows).
        log_every_n_steps (int | None): log every n-th step's phases; ``None`` follows the
            Trainer's ``log_every_n_steps``; 0 logs nothing per step.
        synchronize (bool): on CUDA, synchronise at every phase boundary so host phases contain
            their device work exactly; costs the host/device overlap. No effect off CUDA.
        isolated_optimizer_steps (int): if > 0, at the end of fit time this many steps of each
            optimiser alone on a copy of its parameters and state and report in-loop / isolated
            (``optimizer_step``'s ``in_loop_over_isolated``): far above 1 means the optimiser is
            starved. 0 (default) skips it.
        dirpath (str | None): folder of the JSON and PNG; ``None`` is the Trainer's ``log_dir``.
        filename (str): stem of the files written (``step_time.json``, ``step_time.png``).
        save_plot (bool): write the PNG beside the JSON.

    Raises:
        TypeError: an argument of the wrong type (the message names it).
        ValueError: a negative count, or a ``filename`` that is empty or holds a path separator.
    """

    def __init__(
        self,
        warmup_steps: int = 5,
        log_every_n_steps: int | None = None,
        synchronize: bool = False,
        isolated_optimizer_steps: int = 0,
        dirpath: str | None = None,
        filename: str = "step_time",
        save_plot: bool = True,
    ) -> None:
        super().__init__()
        check_int("warmup_steps", warmup_steps, 0)
        check_int("log_every_n_steps", log_every_n_steps, 0, allow_none=True)
        check_bool("synchronize", synchronize)
        check_int("isolated_optimizer_steps", isolated_optimizer_steps, 0)
        if dirpath is not None and not isinstance(dirpath, (str, os.PathLike)):
            raise TypeError(f"dirpath must be a str, a path or None, got {dirpath!r}")
        if not isinstance(filename, str):
            raise TypeError(f"filename must be a str, got {filename!r}")
        if not filename or "/" in filename or os.sep in filename:
            raise ValueError(
                f"filename must be a non-empty file stem without a path separator, got {filename!r}"
            )
        check_bool("save_plot", save_plot)
        self.warmup_steps = warmup_steps
        self.log_every_n_steps = log_every_n_steps
        self.synchronize = synchronize
        self.isolated_optimizer_steps = isolated_optimizer_steps
        self.dirpath = None if dirpath is None else os.fspath(dirpath)
        self.filename = filename
        self.save_plot = save_plot

        self.accumulator = StepTimeAccumulator(warmup_steps)
        #: per phase, each rank's median (ms), gathered at the end of fit under DDP
        self.rank_medians_ms: dict[str, list[float]] | None = None
        #: per optimiser, the isolated step's median (ms), when measured
        self.isolated_optimizer_ms: list[float] | None = None
        #: the files written at the end of fit (rank 0)
        self.report_paths: list[Path] = []
        self._timer: _PhaseTimer | None = None
        self._pending: deque[_StepRecord] = deque()
        self._hook_handles: list[Any] = []
        self._tap: _TapProfiler | None = None
        self._log_every = 0
        self._steps_since_anchor = 0

    # -- results ---------------------------------------------------------------------------

    def summary(self) -> dict[str, dict[str, float]]:
        """Per phase ``median_ms``, ``mean_ms``, ``p90_ms``, ``total_s``, ``share``, past the warm-up.

        See :meth:`StepTimeAccumulator.compute` for the extra keys; with
        ``isolated_optimizer_steps`` the ``optimizer_step`` entry adds ``isolated_ms`` (summed
        over optimisers) and ``in_loop_over_isolated`` (``stepped_median_ms / isolated_ms``).
        Empty before any step past the warm-up.
        """
        summary = self.accumulator.compute()
        if summary and self.isolated_optimizer_ms:
            isolated = float(sum(self.isolated_optimizer_ms))
            opt = summary["optimizer_step"]
            opt["isolated_ms"] = isolated
            opt["in_loop_over_isolated"] = opt["stepped_median_ms"] / isolated if isolated > 0 else math.nan
        return summary

    def rows(self) -> list[dict[str, float | int]]:
        """Every step's row (warm-up included): labels and ``<phase>_ms`` (``device_*`` on CUDA)."""
        return self.accumulator.rows()

    def report(self) -> dict[str, Any]:
        """What ``step_time.json`` holds: ``phases``, ``warmup_steps``, ``summary``, ``ranks``, ``rows``.

        ``ranks`` is ``None`` on one process, else ``{"median_ms": {phase: [per rank]},
        "slowest_rank": {phase: rank}}``. NaN is written as ``null``.
        """
        ranks = None
        if self.rank_medians_ms is not None:
            ranks = {
                "median_ms": self.rank_medians_ms,
                "slowest_rank": {p: _slowest(v) for p, v in self.rank_medians_ms.items()},
            }
        return _finite(
            {
                "phases": list(PHASES),
                "warmup_steps": self.warmup_steps,
                "summary": self.summary(),
                "ranks": ranks,
                "isolated_optimizer_ms": self.isolated_optimizer_ms,
                "rows": self.rows(),
            }
        )

    # -- set-up and tear-down --------------------------------------------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._restore_profiler(trainer)
        self.accumulator.reset()
        self.rank_medians_ms = None
        self.isolated_optimizer_ms = None
        self.report_paths = []
        self._pending.clear()
        every = self.log_every_n_steps
        self._log_every = trainer.log_every_n_steps if every is None else every
        if self.synchronize and trainer.strategy.root_device.type != "cuda":
            rank_zero_info(
                f"StepTimeProfiler: synchronize=True has no effect on {trainer.strategy.root_device.type}"
                " (host timing is already exact there)."
            )
        # Lightning's action names (loops/training_epoch_loop.py, trainer/call.py,
        # loops/optimization/manual.py), built from the classes in this run.
        loop = f"[{type(trainer.fit_loop.epoch_loop).__name__}]"
        strategy = f"[Strategy]{type(trainer.strategy).__name__}"
        module = f"[LightningModule]{type(pl_module).__name__}"
        # A DataModule that overrides the transfer hooks runs them under its own name.
        transfer_hooks = [f"{module}.on_before_batch_transfer"]
        if trainer.datamodule is not None:
            transfer_hooks.append(f"[LightningDataModule]{type(trainer.datamodule).__name__}.on_before_batch_transfer")
        on_start = {
            f"{loop}.train_dataloader_next": self._on_fetch_start,
            **{hook: lambda: self._enter(_TO_DEVICE) for hook in transfer_hooks},
            f"{strategy}.batch_to_device": lambda: self._enter(_TO_DEVICE),
            f"{strategy}.training_step": lambda: self._enter(_FORWARD),
        }
        on_stop = {
            f"{loop}.train_dataloader_next": lambda: self._exit(_FETCH),
            **{hook: lambda: self._exit(_TO_DEVICE) for hook in transfer_hooks},
            f"{strategy}.batch_to_device": lambda: self._exit(_TO_DEVICE),
            f"{strategy}.training_step": lambda: self._exit(_FORWARD),
            # Where the optimiser step ends if optimizer.step never ran (AMP skipped it) or the
            # optimiser has no step hooks: the end of the module's optimizer_step hook
            # (automatic) or of LightningOptimizer.step (manual).
            f"{module}.optimizer_step": lambda: self._exit(_OPTIMIZER),
            "optimizer_step": lambda: self._exit(_OPTIMIZER),
        }
        self._tap = _TapProfiler(trainer.profiler, on_start, on_stop)
        trainer.profiler = self._tap

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        device = trainer.strategy.root_device
        marks = _CudaMarks(device) if device.type == "cuda" else None
        self._timer = _PhaseTimer(marks=marks, synchronize=self.synchronize)
        for optimizer in trainer.optimizers:
            register = getattr(optimizer, "register_step_post_hook", None)
            if register is not None:
                self._hook_handles.append(register(self._on_optimizer_step_end))

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._discard_open_step()
        self._reanchor()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # A step can be left open when on_train_batch_start returned -1 (no on_train_batch_end).
        self._discard_open_step()

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._discard_open_step()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._discard_open_step()
        self._drain(trainer, flush=True)
        self._remove_hooks()
        if self.isolated_optimizer_steps > 0:
            self.isolated_optimizer_ms = self._time_isolated(trainer)
        if trainer.world_size > 1:
            self.rank_medians_ms = self._gather_medians(trainer)
        dirpath = self.dirpath if self.dirpath is not None else trainer.log_dir  # a collective
        if not trainer.is_global_zero:
            return
        summary = self.summary()
        if not summary:
            rank_zero_warn(
                f"StepTimeProfiler: {len(self.accumulator)} training steps, not more than"
                f" warmup_steps={self.warmup_steps}; nothing to report."
            )
            return
        measured = len(self.accumulator) - self.warmup_steps
        rank_zero_info(format_table(summary, self.rank_medians_ms, measured))
        if dirpath is not None:
            self.report_paths = self._write(Path(dirpath))

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._remove_hooks()
        self._restore_profiler(trainer)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._remove_hooks()
        self._restore_profiler(trainer)

    # -- hooks -> timer ----------------------------------------------------------------------

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # Opens the step when no fetch did (a training_step taking a dataloader_iter).
        if self._timer is not None:
            self._timer.open()

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        self._enter(_BACKWARD)

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._exit(_BACKWARD)

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self._timer is not None:
            self._timer.count_optimizer_call()
            self._timer.enter(_OPTIMIZER)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._timer is None:
            return
        record = self._timer.close(
            batch=trainer.fit_loop.total_batch_idx,
            epoch=trainer.current_epoch,
            global_step=trainer.global_step,
            # Lightning logs a batch's metrics at `_batches_that_stepped` before it increments
            # (logger_connector.log_metrics); use the same x so the curves line up.
            log_step=getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step),
        )
        if record is None:
            return
        self._pending.append(record)
        self._drain(trainer)
        self._steps_since_anchor += 1
        if self._steps_since_anchor >= _ANCHOR_EVERY_N_STEPS:
            self._reanchor()  # between steps, so the one synchronisation is in no step

    def _on_fetch_start(self) -> None:
        if self._timer is not None:
            self._timer.open()
            self._timer.enter(_FETCH)

    def _on_optimizer_step_end(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._exit(_OPTIMIZER)

    def _enter(self, phase: int) -> None:
        if self._timer is not None:
            self._timer.enter(phase)

    def _exit(self, phase: int) -> None:
        if self._timer is not None:
            self._timer.exit(phase)

    def _discard_open_step(self) -> None:
        if self._timer is not None:
            self._timer.discard()

    def _reanchor(self) -> None:
        if self._timer is not None and self._timer.marks is not None:
            self._timer.marks.reanchor()
        self._steps_since_anchor = 0

    # -- rows -> accumulator and loggers -----------------------------------------------------

    def _drain(self, trainer: Trainer, flush: bool = False) -> None:
        """Move steps whose device work is done into the accumulator, oldest first."""
        pending = self._pending
        while pending:
            record = pending[0]
            if not (flush or len(pending) > _MAX_PENDING or record.ready()):
                break
            if record.events is not None and not record.ready():
                record.events[-1].synchronize()
            pending.popleft()
            step_ms, phase_ms, device_ms, busy_ms = _split_record(record)
            labels = record.labels
            row = self.accumulator.update(
                step_ms,
                phase_ms,
                device_ms=device_ms,
                device_busy_ms=busy_ms,
                batch=labels["batch"],
                epoch=labels["epoch"],
                global_step=labels["global_step"],
                optimizer_calls=record.optimizer_calls,
            )
            if self._log_every and len(self.accumulator) % self._log_every == 0 and trainer.loggers:
                self._log(trainer, row, labels["log_step"])

    @staticmethod
    def _log(trainer: Trainer, row: Mapping[str, float], step: int) -> None:
        metrics = {f"step_time/{p}_ms": row[f"{p}_ms"] for p in PHASES}
        if "device_step_ms" in row:
            metrics.update({f"step_time/device_{p}_ms": row[f"device_{p}_ms"] for p in PHASES})
            span = row["device_step_ms"]
            metrics["step_time/device_busy_share"] = row["device_busy_ms"] / span if span > 0 else math.nan
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)

    # -- end of fit ----------------------------------------------------------------------------

    def _time_isolated(self, trainer: Trainer) -> list[float] | None:
        try:
            return [time_optimizer_step(opt, self.isolated_optimizer_steps) for opt in trainer.optimizers]
        except Exception as error:  # an optimiser that cannot be deep-copied (ZeRO, foreign types)
            rank_zero_warn(f"StepTimeProfiler: could not time the optimiser step in isolation: {error!r}")
            return None

    def _gather_medians(self, trainer: Trainer) -> dict[str, list[float]]:
        summary = self.accumulator.compute()
        local = [summary[p]["median_ms"] if summary else math.nan for p in PHASES]
        tensor = torch.tensor(local, dtype=torch.float64, device=trainer.strategy.root_device)
        gathered = trainer.strategy.all_gather(tensor).reshape(-1, len(PHASES)).cpu()
        return {p: [float(v) for v in gathered[:, i]] for i, p in enumerate(PHASES)}

    def _write(self, dirpath: Path) -> list[Path]:
        dirpath.mkdir(parents=True, exist_ok=True)
        report = self.report()
        json_path = dirpath / f"{self.filename}.json"
        json_path.write_text(json.dumps(report, indent=1))
        paths = [json_path]
        if self.save_plot:
            figure = plot_step_split(report)
            png_path = dirpath / f"{self.filename}.png"
            figure.savefig(png_path, dpi=100)
            paths.append(png_path)
        return paths

    def _remove_hooks(self) -> None:
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []

    def _restore_profiler(self, trainer: Trainer) -> None:
        profiler = trainer.profiler
        while isinstance(profiler, _TapProfiler):  # ours, possibly left by an earlier fit
            profiler = profiler.inner
        trainer.profiler = profiler
        self._tap = None


def _slowest(medians: Sequence[float]) -> int | None:
    values = np.asarray(medians, dtype=np.float64)
    if not np.isfinite(values).any():
        return None
    return int(np.nanargmax(values))


def _finite(value: Any) -> Any:
    """Replace NaN and infinities with None, recursively, so the JSON is standard."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def format_table(
    summary: Mapping[str, Mapping[str, float]],
    rank_medians_ms: Mapping[str, Sequence[float]] | None = None,
    num_steps: int | None = None,
) -> str:
    """The console table of a summary, with each phase's slowest rank under DDP.

    Args:
        summary: :meth:`StepTimeProfiler.summary` (or :meth:`StepTimeAccumulator.compute`).
        rank_medians_ms: per phase, each rank's median; adds "slowest rank" columns.
        num_steps: steps summarised, for the title.

    Returns:
        str: the table, one line per phase.
    """
    title = "StepTimeProfiler"
    if num_steps is not None:
        title += f": {num_steps} steps after warm-up"
    header = f"{'phase':<22} {'median ms':>10} {'mean ms':>10} {'p90 ms':>10} {'total s':>9} {'share':>7}"
    device = "device_median_ms" in summary.get("step", {})
    if device:
        header += f" {'device ms':>10} {'dev share':>9}"
    if rank_medians_ms is not None:
        header += f" {'slowest rank':>12} {'its median':>10}"
    lines = [title, header, "-" * len(header)]
    for phase in PHASES:
        s = summary[phase]
        line = (
            f"{phase:<22} {s['median_ms']:>10.2f} {s['mean_ms']:>10.2f} {s['p90_ms']:>10.2f}"
            f" {s['total_s']:>9.2f} {s['share']:>7.1%}"
        )
        if device:
            line += f" {s['device_median_ms']:>10.2f} {s['device_share']:>9.1%}"
        if rank_medians_ms is not None:
            medians = rank_medians_ms[phase]
            rank = _slowest(medians)
            slowest = math.nan if rank is None else medians[rank]
            line += f" {'-' if rank is None else rank:>12} {slowest:>10.2f}"
        lines.append(line)
    step = summary["step"]
    if "device_busy_share" in step:
        lines.append(
            f"accelerator busy >= {step['device_busy_share']:.1%} of the step,"
            f" idle <= {step['device_idle_share']:.1%}"
        )
    opt = summary["optimizer_step"]
    if "in_loop_over_isolated" in opt:
        lines.append(
            f"optimizer step: {opt['stepped_median_ms']:.2f} ms in the loop,"
            f" {opt['isolated_ms']:.2f} ms alone (x{opt['in_loop_over_isolated']:.2f})"
        )
    return "\n".join(lines)

