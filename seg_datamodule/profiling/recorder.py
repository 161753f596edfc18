"""Which event opens and closes which phase: hook calls in, finished per-step rows out.

A training step (one batch) is split into phases whose names are a contract::

    train_dataloader_next  waiting for the next batch: Lightning's profiler action
                           ``[_TrainingEpochLoop].train_dataloader_next``, the one phase no public
                           hook brackets (seen through ``tap.py``)
    batch_to_device        the end of the fetch .. this callback's ``on_train_batch_start``: the
                           transfer hooks and the strategy's ``batch_to_device`` (and the
                           ``on_train_batch_start`` of callbacks listed before this one), less:
    device_work            ``on_after_batch_transfer``, the work done on the batch once it is on
                           its device (the DataModule's ``hsv_on_device`` HSV jitter): Lightning's
                           profiler action ``[LightningDataModule]<class>.on_after_batch_transfer``
                           (or ``[LightningModule]...``), seen through ``tap.py``
    forward                ``on_train_batch_start`` .. ``on_before_backward`` (automatic
                           optimisation: ``training_step`` and ``zero_grad``)
    backward               ``on_before_backward`` .. ``on_after_backward``
    optimizer_step         ``on_before_optimizer_step`` .. torch's ``register_step_post_hook``
                           (gradient clipping included)
    other                  the rest of the step: hooks, LR schedulers, ``self.log``, and under AMP
                           ``scaler.unscale_`` (it runs before ``on_before_optimizer_step``)
    step                   the whole, from the start of the fetch to ``on_train_batch_end``

The phases other than ``step`` are exclusive: a phase that starts inside another (the fetch
inside ``training_step`` with a ``dataloader_iter``; ``manual_backward`` and ``opt.step()`` inside
``training_step`` under manual optimisation) pauses the outer one, so the five timed phases and
``other`` add up to ``step`` exactly. Every phase but the fetch comes from public hooks; the
fetch's action name is Lightning's, so a run in which it never fires (or in which the optimiser's
post hook never does) warns once, naming the phase, instead of reporting 0.

What exactly is measured, and where:

* **The fetch.** For a sized dataloader this is the wait for the batch the step trains on. For an
  unsized one (an ``IterableDataset``) Lightning's ``_PrefetchDataFetcher`` keeps one batch in
  hand: step *k* trains on the batch fetched in step *k - 1* and waits for batch *k + 1*. Either
  way the interval measured is the time step *k* spent blocked on the loader.
* **The step** ends in this callback's ``on_train_batch_end``: callbacks listed after this one,
  the module's ``on_train_batch_end``, the loggers writing the step's metrics, validation and
  checkpointing between batches are not in any step (Lightning's own profiler reports them).
* **Gradient accumulation.** Batches that only accumulate have no optimiser call and an
  ``optimizer_step`` of 0, so with ``accumulate_grad_batches >= 2`` the phase's median is 0: read
  its ``mean_ms`` / ``share``, or ``stepped_median_ms`` (the median over batches that stepped).
* **AMP.** The phase covers ``scaler.step`` (its inf check synchronises with the device) but not
  the ``scaler.update`` after it. When the scaler skips a step (non-finite gradients)
  ``optimizer.step`` never runs and no post hook fires: the phase then runs to the end of the
  step. So does it for an optimiser without ``register_step_post_hook`` (with a warning).
* **Manual optimisation.** ``forward`` runs from ``on_train_batch_start`` to the end of the step,
  less the ``backward`` (``manual_backward``) and ``optimizer_step`` (each ``opt.step()``) inside
  it, so it also holds what Lightning does after ``training_step`` (LR schedulers, logging);
  steps without an ``opt.step()`` behave like accumulation. ``batch_to_device`` is 0 when
  ``training_step`` takes a ``dataloader_iter`` (the user moves the batch, inside ``forward``).
* **CUDA.** See ``timing.py``: host phases on ``perf_counter``, device phases from CUDA events
  on the current stream, ``synchronize=True`` to wait at every boundary.

:class:`StepRecorder` knows nothing of Lightning: the callback (``callback.py``) calls one of its
methods per hook and passes plain flags and labels; it keeps the steps whose CUDA events are not
read yet, moves finished ones into the :class:`StepTimeAccumulator`, and counts what fired.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence

from seg_datamodule.compat import verified_note
from seg_datamodule.profiling.accumulator import (
    _BACKWARD,
    _DEVICE_WORK,
    _FETCH,
    _FORWARD,
    _OPTIMIZER,
    _TO_DEVICE,
    PHASES,
    StepLabels,
    StepTimeAccumulator,
)
from seg_datamodule.profiling.tap import FETCH_ACTION_SUFFIX
from seg_datamodule.profiling.timing import PhaseTimer, StepRecord, split_record

__all__ = ["StepLogWindow", "StepRecorder", "step_metrics"]

# The public hooks of one automatically optimised step, in the order Lightning calls them (the
# closure runs training_step and backward inside optimizer.step, before the step proper).
_HOOK_ORDER = ("on_train_batch_start", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
               "optimizer step post hook")

# A resolved CUDA anchor goes stale as host and device clocks drift; re-anchor this often.
_ANCHOR_EVERY_N_STEPS = 1000
# Rows kept waiting for their CUDA events before the oldest is read with a blocking wait.
_MAX_PENDING = 64


class StepRecorder:
    """The phase state machine of one fit, over a :class:`PhaseTimer`, into an accumulator.

    Args:
        accumulator (StepTimeAccumulator): where finished rows go.
        timer (PhaseTimer): the clock and (on CUDA) the event marks.
    """

    def __init__(self, accumulator: StepTimeAccumulator, timer: PhaseTimer) -> None:
        self.accumulator = accumulator
        self.timer = timer
        self.pending: deque[StepRecord] = deque()
        #: events seen, so a phase that never fires can be named
        self.fetches = 0
        self.optimizer_starts = 0
        self.optimizer_ends = 0
        #: the first hook seen out of Lightning's order under automatic optimisation, or None
        self.hook_order_problem: str | None = None
        self._automatic = True
        self._last_event = ""
        self._steps_since_anchor = 0

    # -- events, in step order ----------------------------------------------------------------

    def fetch_start(self) -> None:
        """Lightning starts waiting for a batch: opens the step if none is."""
        self.fetches += 1
        self.timer.open()
        self.timer.enter(_FETCH)

    def fetch_end(self) -> None:
        """The batch is in hand; at the start of a step the transfer follows until batch_start."""
        self.timer.exit(_FETCH)
        if self.timer.current is None:  # not a fetch nested in training_step (dataloader_iter)
            self.timer.enter(_TO_DEVICE)

    def device_work_start(self) -> None:
        """``on_after_batch_transfer`` starts (inside the transfer; nothing outside a step)."""
        self.timer.enter(_DEVICE_WORK)

    def device_work_end(self) -> None:
        self.timer.exit(_DEVICE_WORK)

    def _in_order(self, event: str) -> None:
        """Note ``event``; the first that comes before one it should follow (automatic
        optimisation: one backward, one optimiser step, in ``_HOOK_ORDER``) is kept to warn about.
        A repeat is not (torch 2.4 fires the post hook once per patched ``step`` of a subclass chain)."""
        if self._automatic and self.hook_order_problem is None and self._last_event:
            if _HOOK_ORDER.index(event) < _HOOK_ORDER.index(self._last_event):
                self.hook_order_problem = f"{event} came after {self._last_event} in one step"
        self._last_event = event

    def batch_start(self, automatic: bool = True) -> None:
        self._automatic, self._last_event = automatic, ""
        self._in_order("on_train_batch_start")
        self.timer.open()  # when no fetch did: a training_step taking a dataloader_iter
        self.timer.exit(_TO_DEVICE)
        self.timer.enter(_FORWARD)

    def before_backward(self, automatic: bool) -> None:
        self._in_order("on_before_backward")
        if automatic:  # training_step is over; under manual optimisation it goes on after
            self.timer.exit(_FORWARD)
        self.timer.enter(_BACKWARD)

    def after_backward(self) -> None:
        self._in_order("on_after_backward")
        self.timer.exit(_BACKWARD)

    def before_optimizer_step(self, automatic: bool) -> None:
        self._in_order("on_before_optimizer_step")
        self.optimizer_starts += 1
        self.timer.count_optimizer_call()
        if automatic:  # no backward ran when training_step returned None
            self.timer.exit(_FORWARD)
        self.timer.enter(_OPTIMIZER)

    def optimizer_step_end(self) -> None:
        self._in_order("optimizer step post hook")
        self.optimizer_ends += 1
        self.timer.exit(_OPTIMIZER)

    def batch_end(self, **labels: int) -> None:
        """Close the step (labels: ``batch``, ``epoch``, ``global_step``, any others kept)."""
        self._last_event = ""
        record = self.timer.close(**labels)
        if record is None:
            return
        self.pending.append(record)
        self._steps_since_anchor += 1
        if self._steps_since_anchor >= _ANCHOR_EVERY_N_STEPS:
            self.reanchor()  # between steps, so the one synchronisation is in no step

    def discard(self) -> None:
        """Drop the open step (one ``on_train_batch_start`` returning -1 leaves unclosed)."""
        self._last_event = ""
        self.timer.discard()

    def reanchor(self) -> None:
        if self.timer.marks is not None:
            self.timer.marks.reanchor()
        self._steps_since_anchor = 0

    def silent_phases(self, end_of_fit: bool) -> dict[str, str]:
        """Per phase that should have fired in the steps so far and never did, a message.

        The fetch fires in every step; the optimiser's post hook may not fire in the first steps
        (an AMP scaler skips them), so it is judged only at the end of fit.
        """
        steps = len(self.accumulator)
        messages = {}
        if steps and not self.fetches:
            messages["train_dataloader_next"] = (
                f"phase 'train_dataloader_next' never fired in {steps} steps: Lightning's profiler action"
                f" '[_TrainingEpochLoop]{FETCH_ACTION_SUFFIX}' was not seen (renamed in this Lightning"
                f" version? {verified_note('fetch_action')}). The wait for batches and the transfer are in"
                " no phase and every step looks shorter than it is."
            )
        if end_of_fit and self.optimizer_starts and not self.optimizer_ends:
            messages["optimizer_step"] = (
                f"phase 'optimizer_step' never ended in {steps} steps: torch's step post hook did not"
                " fire (an optimiser without register_step_post_hook?), so the phase runs to the end of"
                " each step and holds what would be 'other'."
            )
        return messages

    # -- rows ---------------------------------------------------------------------------------

    def drain(self, flush: bool = False) -> list[tuple[dict[str, float], dict[str, int], int]]:
        """Move steps whose device work is done into the accumulator, oldest first.

        Returns:
            list of (row, labels, optimiser calls): the steps moved.
        """
        moved = []
        pending = self.pending
        while pending:
            record = pending[0]
            if not (flush or len(pending) > _MAX_PENDING or record.ready()):
                break
            if record.events is not None and not record.ready():
                record.events[-1].synchronize()
            pending.popleft()
            step_ms, phase_ms, device_ms, busy_ms = split_record(record)
            labels = record.labels
            row = self.accumulator.update(
                step_ms,
                phase_ms,
                device_ms=device_ms,
                device_busy_ms=busy_ms,
                labels=StepLabels(labels["batch"], labels["epoch"], labels["global_step"], record.optimizer_calls),
            )
            moved.append((row, labels, record.optimizer_calls))
        return moved


def step_metrics(window: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The logged point of one optimiser step: each ``step_time/<phase>_ms`` summed over its rows.

    Args:
        window: the rows (:meth:`StepTimeAccumulator.update`) of the batches of one optimiser
            step: one, or ``accumulate_grad_batches``.

    Returns:
        dict[str, float]: ``step_time/<phase>_ms`` per phase; with device times also
        ``step_time/device_<phase>_ms`` and ``step_time/device_busy_share`` (busy / span).
    """
    metrics = {f"step_time/{p}_ms": sum(r[f"{p}_ms"] for r in window) for p in PHASES}
    if window and all("device_step_ms" in r for r in window):
        metrics.update({f"step_time/device_{p}_ms": sum(r[f"device_{p}_ms"] for r in window) for p in PHASES})
        span = metrics["step_time/device_step_ms"]
        busy = sum(r["device_busy_ms"] for r in window)
        metrics["step_time/device_busy_share"] = busy / span if span > 0 else math.nan
    return metrics


class StepLogWindow:
    """The rows of the optimiser step being logged, and when its point is due, as Lightning logs.

    Lightning logs step metrics (``update_train_step_metrics``) as: nothing for a batch that only
    accumulates (automatic optimisation), then one point for the optimiser step, at ``x =
    _batches_that_stepped``, when ``(x + 1) % n == 0``. The point sums the step's batches
    (:func:`step_metrics`).

    Args:
        every (int): n; 0 logs nothing.
    """

    def __init__(self, every: int = 0) -> None:
        self.every = every
        self._rows: list[Mapping[str, float]] = []

    def add(self, row: Mapping[str, float], labels: Mapping[str, int], calls: int) -> tuple[int, list] | None:
        """Add a step's row (:meth:`StepRecorder.drain`); ``(x, rows of the optimiser step)`` when a point is due."""
        self._rows.append(row)
        if labels["automatic"] and not calls:
            return None
        window, self._rows = self._rows, []
        step = labels["log_step"]
        return (step, window) if self.every and (step + 1) % self.every == 0 else None
