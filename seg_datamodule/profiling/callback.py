"""The ``StepTimeProfiler`` callback: the thin adapter from Lightning's hooks to the phase timer.

A training step (one batch) is split into phases whose names are a contract::

    train_dataloader_next  waiting for the next batch: Lightning's profiler action
                           ``[_TrainingEpochLoop].train_dataloader_next``, the one phase no public
                           hook brackets (seen through ``tap.py``)
    batch_to_device        the end of the fetch .. this callback's ``on_train_batch_start``: the
                           transfer hooks and the strategy's ``batch_to_device`` (and the
                           ``on_train_batch_start`` of callbacks listed before this one)
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

Layout: :class:`StepTimeAccumulator` (``accumulator.py``) holds the rows, ``PhaseTimer``
(``timing.py``) turns enter/exit calls into per-step boundary times and CUDA events, this
callback feeds both from Lightning's hooks and writes the report (``report.py``, ``plot.py``).

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
  steps without an ``opt.step()`` behave like accumulation. ``batch_to_device`` is 0 when ``training_step`` takes
  a ``dataloader_iter`` (the user moves the batch, inside ``forward``).
* **CUDA.** See ``timing.py``: host phases on ``perf_counter``, device phases from CUDA events
  on the current stream, ``synchronize=True`` to wait at every boundary.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.combined_loader import _shutdown_workers_and_reset_iterator
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from seg_datamodule.ops.checks import check_bool, check_int
from seg_datamodule.profiling.accumulator import (
    _BACKWARD,
    _FETCH,
    _FORWARD,
    _OPTIMIZER,
    _TO_DEVICE,
    PHASES,
    StepTimeAccumulator,
)
from seg_datamodule.profiling.optimizer import running_beside, time_optimizer_step
from seg_datamodule.profiling.report import build_report, format_table, write_report
from seg_datamodule.profiling.tap import FETCH_ACTION_SUFFIX, attach, detach
from seg_datamodule.profiling.timing import CudaMarks, PhaseTimer, StepRecord, split_record

__all__ = ["StepTimeProfiler"]

# A resolved CUDA anchor goes stale as host and device clocks drift; re-anchor this often.
_ANCHOR_EVERY_N_STEPS = 1000
# Rows kept waiting for their CUDA events before the oldest is read with a blocking wait.
_MAX_PENDING = 64


class StepTimeProfiler(Callback):
    """Split each training step's time into phases, log it, and report where the time goes.

    Per step: the phases of :data:`PHASES` (see the module docstring for what each covers under
    accumulation, AMP, manual optimisation and CUDA) to the Trainer's loggers as
    ``step_time/<phase>_ms``, while training, labelled as Lightning labels its own step metrics:
    one point per optimiser step at ``x = `` the optimiser steps before it, every
    ``log_every_n_steps`` of them; with gradient accumulation a point sums the batches of its
    optimiser step. At the end of fit, on rank 0: a table on the console and
    ``<filename>.json`` (summary, wall time in and between steps, per-rank medians, per-step
    rows) and ``<filename>.png`` (:func:`plot_step_split`) in ``dirpath``. An exception or
    Ctrl-C during fit still writes them, from the steps done, marked ``"partial": true``. Under
    DDP the table also gives, per phase, the slowest rank and its median, so stragglers show;
    :meth:`summary` is the local rank's. With ``strategy="ddp_spawn"`` the measuring happens in
    the spawned processes, so the callback object in the launching process stays empty: read
    the JSON.

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
            starved. The training loader's workers are shut down first (Lightning would a moment
            later); the threads and child processes still running are in the report
            (``isolated_context``). 0 (default) skips it.
        dirpath (str | None): folder of the JSON and PNG; ``None`` is the Trainer's ``log_dir``:
            the first logger's ``log_dir`` (``lightning_logs/version_<n>``), or with
            ``logger=False`` the Trainer's ``default_root_dir``, which defaults to the current
            folder. The paths written are printed and kept in ``report_paths``.
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
        #: what ran beside the isolated optimiser timing (threads, child processes)
        self.isolated_context: dict[str, Any] | None = None
        #: wall time of training (``train_s``), in steps (``steps_s``) and between them
        self.wall: dict[str, float] | None = None
        #: the files written at the end of fit (rank 0)
        self.report_paths: list[Path] = []
        self._partial: str | None = None  # what stopped the fit early, for the report
        self._dirpath: str | None = None  # resolved at the start of training (a collective)
        self._train_start_s = 0.0
        self._window: list[Mapping[str, float]] = []  # rows of the optimiser step being logged
        self._timer: PhaseTimer | None = None
        self._pending: deque[StepRecord] = deque()
        self._hook_handles: list[Any] = []
        self._profiler: Any = None  # the Trainer's profiler our fetch tap is attached to
        self._fetches = 0  # fetches seen, and optimiser steps begun and ended: fired-phase checks
        self._optimizer_starts = 0
        self._optimizer_ends = 0
        self._fetch_checked = False
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
        """What ``step_time.json`` holds; see :func:`~seg_datamodule.profiling.report.build_report`."""
        return build_report(
            summary=self.summary(),
            rows=self.rows(),
            warmup_steps=self.warmup_steps,
            rank_medians_ms=self.rank_medians_ms,
            isolated_optimizer_ms=self.isolated_optimizer_ms,
            isolated_context=self.isolated_context,
            wall=self.wall,
            stopped_by=self._partial,
        )

    # -- set-up and tear-down --------------------------------------------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.accumulator.reset()
        self.rank_medians_ms = None
        self.isolated_optimizer_ms = None
        self.isolated_context = None
        self.wall = None
        self.report_paths = []
        self._partial = None
        self._window = []
        self._pending.clear()
        every = self.log_every_n_steps
        self._log_every = trainer.log_every_n_steps if every is None else every
        if self.synchronize and trainer.strategy.root_device.type != "cuda":
            rank_zero_info(
                f"StepTimeProfiler: synchronize=True has no effect on {trainer.strategy.root_device.type}"
                " (host timing is already exact there)."
            )
        self._fetches = self._optimizer_starts = self._optimizer_ends = 0
        self._fetch_checked = False
        self._detach(trainer)
        self._profiler = trainer.profiler
        attach(self._profiler, self)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # trainer.log_dir is a collective under DDP: resolved here, where every rank comes, and
        # not in on_exception, where only the failing one may.
        self._dirpath = self.dirpath if self.dirpath is not None else trainer.log_dir
        self._train_start_s = time.perf_counter()
        device = trainer.strategy.root_device
        marks = CudaMarks(device) if device.type == "cuda" else None
        self._timer = PhaseTimer(marks=marks, synchronize=self.synchronize)
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
        self._end_of_training(trainer)
        if self.isolated_optimizer_steps > 0:
            # The loader's workers would still prefetch beside the "alone" timing and hide the
            # very starvation it is there to show (issue 12.2); Lightning stops them right after
            # this hook anyway (fit_loop.teardown), so stopping them first changes nothing else.
            shut_down = _shut_down_train_workers(trainer)
            self.isolated_context = {"loader_workers_shut_down": shut_down, **running_beside()}
            self.isolated_optimizer_ms = self._time_isolated(trainer)
        if trainer.world_size > 1:
            self.rank_medians_ms = self._gather_medians(trainer)
        if trainer.is_global_zero:
            self._write_report()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._remove_hooks()
        self._detach(trainer)
        if self._timer is None or self._partial is not None:  # not training, or already written
            return
        self._partial = f"{type(exception).__name__}: {exception}"
        # No isolated timing and no gathering across ranks here: the device may be out of memory
        # and the other ranks may not be in this hook. Never hide the exception being handled.
        try:
            self._end_of_training(trainer)
            if trainer.is_global_zero:
                self._write_report()
        except Exception as error:
            rank_zero_warn(f"StepTimeProfiler: could not write the partial report: {error!r}")

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._remove_hooks()
        self._detach(trainer)
        self._timer = None

    # -- hooks -> timer ----------------------------------------------------------------------

    def on_fetch_start(self) -> None:
        """Lightning starts waiting for a batch (called by the tap): opens the step if none is."""
        timer = self._timer
        if timer is not None:
            self._fetches += 1
            timer.open()
            timer.enter(_FETCH)

    def on_fetch_end(self) -> None:
        """The batch is in hand; at the start of a step the transfer follows until the step's hook."""
        timer = self._timer
        if timer is not None:
            timer.exit(_FETCH)
            if timer.current is None:  # not a fetch nested in training_step (dataloader_iter)
                timer.enter(_TO_DEVICE)

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        timer = self._timer
        if timer is not None:
            timer.open()  # when no fetch did: a training_step taking a dataloader_iter
            timer.exit(_TO_DEVICE)
            timer.enter(_FORWARD)

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        timer = self._timer
        if timer is not None:
            if pl_module.automatic_optimization:  # training_step is over; manual: it goes on after
                timer.exit(_FORWARD)
            timer.enter(_BACKWARD)

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._timer is not None:
            self._timer.exit(_BACKWARD)

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        timer = self._timer
        if timer is not None:
            self._optimizer_starts += 1
            timer.count_optimizer_call()
            if pl_module.automatic_optimization:  # no backward when training_step returned None
                timer.exit(_FORWARD)
            timer.enter(_OPTIMIZER)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._timer is None:
            return
        record = self._timer.close(
            batch=trainer.fit_loop.total_batch_idx,
            epoch=trainer.current_epoch,
            global_step=trainer.global_step,
            # Lightning logs a step's metrics at `_batches_that_stepped` before it increments
            # (logger_connector.log_metrics); use the same x so the curves line up.
            log_step=getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step),
            automatic=int(pl_module.automatic_optimization),
        )
        if record is None:
            return
        self._pending.append(record)
        self._drain(trainer)
        self._steps_since_anchor += 1
        if self._steps_since_anchor >= _ANCHOR_EVERY_N_STEPS:
            self._reanchor()  # between steps, so the one synchronisation is in no step

    def _on_optimizer_step_end(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._timer is not None:
            self._optimizer_ends += 1
            self._timer.exit(_OPTIMIZER)

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
            step_ms, phase_ms, device_ms, busy_ms = split_record(record)
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
            self._log_step(trainer, row, labels, record.optimizer_calls)
            if len(self.accumulator) > self.warmup_steps:
                self._check_fetch_fired()

    def _check_fetch_fired(self) -> None:
        """Once a run, after the warm-up: warn if Lightning's fetch action was never seen."""
        if self._fetch_checked or not len(self.accumulator):
            return
        self._fetch_checked = True
        steps = len(self.accumulator)
        if not self._fetches:
            rank_zero_warn(
                f"StepTimeProfiler: phase 'train_dataloader_next' never fired in {steps} steps: Lightning's"
                f" profiler action '[_TrainingEpochLoop]{FETCH_ACTION_SUFFIX}' was not seen (renamed in this"
                " Lightning version?). The wait for batches and the transfer are in no phase and every step"
                " looks shorter than it is."
            )

    def _check_optimizer_end_fired(self) -> None:
        """At the end of fit (AMP may skip the first steps): warn if no optimiser step ever ended."""
        steps = len(self.accumulator)
        if self._optimizer_starts and not self._optimizer_ends:
            rank_zero_warn(
                f"StepTimeProfiler: phase 'optimizer_step' never ended in {steps} steps: torch's step post"
                " hook did not fire (an optimiser without register_step_post_hook?), so the phase runs to"
                " the end of each step and holds what would be 'other'."
            )

    def _log_step(self, trainer: Trainer, row: Mapping[str, float], labels: Mapping[str, int], calls: int) -> None:
        """Log as Lightning logs step metrics (``update_train_step_metrics``): nothing for a batch
        that only accumulates (automatic optimisation), then one point for the optimiser step,
        summed over its batches, at ``x = _batches_that_stepped`` when ``(x + 1) % n == 0``."""
        self._window.append(row)
        if labels["automatic"] and not calls:
            return
        window, self._window = self._window, []
        step = labels["log_step"]
        if not (self._log_every and (step + 1) % self._log_every == 0 and trainer.loggers):
            return
        metrics = {f"step_time/{p}_ms": sum(r[f"{p}_ms"] for r in window) for p in PHASES}
        if all("device_step_ms" in r for r in window):
            metrics.update({f"step_time/device_{p}_ms": sum(r[f"device_{p}_ms"] for r in window) for p in PHASES})
            span = metrics["step_time/device_step_ms"]
            busy = sum(r["device_busy_ms"] for r in window)
            metrics["step_time/device_busy_share"] = busy / span if span > 0 else math.nan
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)

    # -- end of fit ----------------------------------------------------------------------------

    def _end_of_training(self, trainer: Trainer) -> None:
        """Close the rows and the wall-time account; run the fired-phase checks."""
        train_s = time.perf_counter() - self._train_start_s
        self._discard_open_step()
        try:
            self._drain(trainer, flush=True)
        except Exception as error:  # e.g. a CUDA error while reading the events of the last steps
            rank_zero_warn(f"StepTimeProfiler: {len(self._pending)} steps dropped, their events unreadable: {error!r}")
            self._pending.clear()
        self._remove_hooks()
        self._check_fetch_fired()  # a run no longer than the warm-up
        self._check_optimizer_end_fired()
        steps_s = float(self.accumulator.column("step_ms", measured_only=False).sum()) / 1e3
        self.wall = {
            "train_s": train_s,
            "steps_s": steps_s,
            # Validation, checkpointing, logging, callbacks after this one, epoch starts: no step's.
            "between_steps_s": max(0.0, train_s - steps_s),
            "steps_share": steps_s / train_s if train_s > 0 else math.nan,
        }
        self._timer = None  # no step after this; on_exception from here on has nothing to add

    def _write_report(self) -> None:
        summary = self.summary()
        steps = len(self.accumulator)
        if not summary and not (self._partial and steps):
            rank_zero_warn(
                f"StepTimeProfiler: {steps} training steps, not more than"
                f" warmup_steps={self.warmup_steps}; nothing to report."
            )
            return
        if summary:
            rank_zero_info(
                format_table(
                    summary,
                    self.rank_medians_ms,
                    steps - self.warmup_steps,
                    wall=self.wall,
                    stopped_by=self._partial,
                    isolated_context=self.isolated_context,
                )
            )
        if self._dirpath is not None:
            report = self.report()
            self.report_paths = write_report(report, Path(self._dirpath), self.filename, self.save_plot)
            what = "partial report" if self._partial else "report"
            rank_zero_info(f"StepTimeProfiler: {what} written to " + ", ".join(map(str, self.report_paths)))

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

    def _remove_hooks(self) -> None:
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []

    def _detach(self, trainer: Trainer) -> None:
        if self._profiler is not None:
            detach(self._profiler, self)
            self._profiler = None


def _shut_down_train_workers(trainer: Trainer) -> bool:
    """Stop the training loader's worker processes now; whether any loader was reached.

    What ``fit_loop.teardown`` does right after ``on_train_end`` (the combined loader's reset
    shuts persistent workers down; dropping the iterators ends the others), done early.
    Private names of Lightning and torch, hence the guard.
    """
    try:
        combined = trainer.fit_loop._combined_loader
        if combined is None:
            return False
        for loader in combined.flattened:  # persistent workers: the DataLoader holds the iterator
            _shutdown_workers_and_reset_iterator(loader)
        for iterator in getattr(combined._iterator, "iterators", None) or []:  # the others
            if isinstance(iterator, _MultiProcessingDataLoaderIter):
                iterator._shutdown_workers()
    except Exception as error:
        rank_zero_warn(f"StepTimeProfiler: could not stop the loader's workers before timing alone: {error!r}")
        return False
    return True
