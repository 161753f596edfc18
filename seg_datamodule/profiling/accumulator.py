"""Per-step phase times in, summary statistics out: ``StepTimeAccumulator``, Lightning-free.

Also the phase names (:data:`PHASES`), a contract shared by the timer, the callback, the report
and the plot. Knows nothing of Lightning or CUDA (after Lightning's
``fabric/utilities/throughput.py`` under ``ThroughputMonitor``).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from seg_datamodule.ops.checks import check_int

__all__ = ["PHASES", "StepLabels", "StepTimeAccumulator"]

#: Phase names, a contract: keys of :meth:`~seg_datamodule.profiling.callback.StepTimeProfiler.summary`, ``step_time/<phase>_ms``.
PHASES: tuple[str, ...] = (
    "train_dataloader_next",
    "batch_to_device",
    "device_work",
    "forward",
    "backward",
    "optimizer_step",
    "other",
    "step",
)
_FETCH, _TO_DEVICE, _DEVICE_WORK, _FORWARD, _BACKWARD, _OPTIMIZER, _OTHER, _STEP = range(len(PHASES))
_SPLIT = PHASES[:_STEP]  # the exclusive phases, whose shares sum to 1
_TIMED_SET = frozenset(PHASES[:_OTHER])  # the phases with their own brackets
_LABELS = ("batch", "epoch", "global_step", "optimizer_calls")


@dataclass(frozen=True)
class StepLabels:
    """Where a step sits in the fit: the label columns of its row (:meth:`StepTimeAccumulator.update`).

    Attributes:
        batch (int | None): the batch index across epochs; the row count when ``None``.
        epoch (int): the epoch.
        global_step (int | None): the optimiser steps so far; ``batch`` when ``None``.
        optimizer_calls (int): optimiser steps taken in this step (0 while accumulating).
    """

    batch: int | None = None
    epoch: int = 0
    global_step: int | None = None
    optimizer_calls: int = 0


_NO_LABELS = StepLabels()


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
        labels: StepLabels = _NO_LABELS,
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
            labels (StepLabels): the step's batch index, epoch, optimiser steps so far and
                optimiser calls (the defaults: the row count, epoch 0, the batch, none).

        Returns:
            dict[str, float]: the stored row, ``<phase>_ms`` for every phase.

        Raises:
            ValueError: an unknown phase name, or a negative or non-finite time.
        """
        timed = PHASES[:_OTHER]
        if not phase_ms.keys() <= _TIMED_SET:
            unknown = sorted(set(phase_ms) - _TIMED_SET)
            raise ValueError(f"phase_ms keys must be among {timed}, got unknown {unknown}")
        batch = self._count if labels.batch is None else labels.batch
        row: dict[str, float] = {
            "batch": float(batch),
            "epoch": float(labels.epoch),
            "global_step": float(batch if labels.global_step is None else labels.global_step),
            "optimizer_calls": float(labels.optimizer_calls),
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
