"""The ``StepTimeProfiler`` callback: the thin adapter from Lightning's hooks to the step recorder.

Each hook calls one method of :class:`~seg_datamodule.profiling.recorder.StepRecorder` (whose
docstring is the phase contract: which hook opens and closes which phase, and what is measured
under accumulation, AMP, manual optimisation and CUDA); the fetch, which no public hook
brackets, comes through the tap on the Trainer's profiler (``tap.py``). The callback also owns
the fit's lifecycle: set-up, per-step logging as Lightning logs, and when the end-of-fit work
runs (the report, the partial report after an exception, the isolated optimiser timing with the
loader's workers stopped); that work itself is in ``end_of_fit.py``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from seg_datamodule.compat import warn_unverified
from seg_datamodule.console import print_summary
from seg_datamodule.ops.checks import check_bool, check_int
from seg_datamodule.profiling.accumulator import StepTimeAccumulator
from seg_datamodule.profiling.end_of_fit import (
    publish_report,
    summary_with_isolated,
    time_optimizers_alone,
    wall_account,
)
from seg_datamodule.profiling.recorder import StepLogWindow, StepRecorder, step_metrics
from seg_datamodule.profiling.report import FitFacts, build_report
from seg_datamodule.profiling.tap import attach, detach
from seg_datamodule.profiling.timing import CudaMarks, PhaseTimer
from seg_datamodule.profiling.trainer_internals import gather_medians, loader_info, log_step

__all__ = ["StepTimeProfiler"]


class StepTimeProfiler(Callback):
    """Split each training step's time into phases, log it, and report where the time goes.

    Per step: the phases of :data:`~seg_datamodule.profiling.accumulator.PHASES` (see ``recorder.py`` for what each covers under
    accumulation, AMP, manual optimisation and CUDA) to the Trainer's loggers as
    ``step_time/<phase>_ms``, while training, labelled as Lightning labels its own step metrics:
    one point per optimiser step at ``x = `` the optimiser steps before it, every
    ``log_every_n_steps`` of them; with gradient accumulation a point sums the batches of its
    optimiser step. At the end of fit, on rank 0: a table on the console ending in a verdict
    (:func:`~seg_datamodule.profiling.verdict.judge_step_time`: the loader, the optimiser, the
    copy to the device or the time between steps, whichever costs most, else compute-bound),
    ``<filename>.json`` (summary, wall time in and between steps, per-rank medians, the
    verdict, per-step rows) and ``<filename>.png`` (:func:`~seg_datamodule.profiling.plot.plot_step_split`) in ``dirpath``. An exception or
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
        #: the train loader's ``num_workers``, ``batch_size``, ``pin_memory`` and the ``cores``
        #: this rank has, read at the start of training for the verdict
        self.loader_info: dict[str, Any] | None = None
        #: the files written at the end of fit (rank 0)
        self.report_paths: list[Path] = []
        self._partial: str | None = None  # what stopped the fit early, for the report
        self._dirpath: str | None = None  # resolved at the start of training (a collective)
        self._train_start_s = 0.0
        self._log_window = StepLogWindow()  # rows of the optimiser step being logged
        self._recorder: StepRecorder | None = None  # from the start to the end of training
        self._hook_handles: list[Any] = []
        self._profiler: Any = None  # the Trainer's profiler our fetch tap is attached to
        self._fetch_checked = False
        self._warned: set[str] = set()  # each silent phase is warned about once a fit

    # -- results ---------------------------------------------------------------------------

    def summary(self) -> dict[str, dict[str, float]]:
        """Per phase ``median_ms``, ``mean_ms``, ``p90_ms``, ``total_s``, ``share``, past the warm-up.

        See :meth:`StepTimeAccumulator.compute` for the extra keys; with
        ``isolated_optimizer_steps`` the ``optimizer_step`` entry adds ``isolated_ms`` (summed
        over optimisers) and ``in_loop_over_isolated`` (``stepped_median_ms / isolated_ms``).
        Empty before any step past the warm-up.
        """
        return summary_with_isolated(self.accumulator, self.isolated_optimizer_ms)

    def rows(self) -> list[dict[str, float | int]]:
        """Every step's row (warm-up included): labels and ``<phase>_ms`` (``device_*`` on CUDA)."""
        return self.accumulator.rows()

    def report(self) -> dict[str, Any]:
        """What ``step_time.json`` holds; see :func:`~seg_datamodule.profiling.report.build_report`."""
        return build_report(self.summary(), self.rows(), self.warmup_steps, self._facts())

    def _facts(self) -> FitFacts:
        return FitFacts(
            rank_medians_ms=self.rank_medians_ms,
            isolated_optimizer_ms=self.isolated_optimizer_ms,
            isolated_context=self.isolated_context,
            wall=self.wall,
            stopped_by=self._partial,
            loader=self.loader_info,
        )

    # -- set-up and tear-down --------------------------------------------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.accumulator.reset()
        self.rank_medians_ms = self.isolated_optimizer_ms = self.isolated_context = self.wall = self.loader_info = None
        self.report_paths = []
        self._partial = None
        every = self.log_every_n_steps
        self._log_window = StepLogWindow(trainer.log_every_n_steps if every is None else every)
        if self.synchronize and trainer.strategy.root_device.type != "cuda":
            rank_zero_info(
                f"StepTimeProfiler: synchronize=True has no effect on {trainer.strategy.root_device.type}"
                " (host timing is already exact there)."
            )
        self._fetch_checked = False
        self._warned = set()
        self._detach(trainer)
        self._profiler = trainer.profiler
        attach(self._profiler, self)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # trainer.log_dir is a collective under DDP: resolved here, where every rank comes, and
        # not in on_exception, where only the failing one may.
        self._dirpath = self.dirpath if self.dirpath is not None else trainer.log_dir
        self.loader_info = loader_info(trainer)
        self._train_start_s = time.perf_counter()
        device = trainer.strategy.root_device
        marks = CudaMarks(device) if device.type == "cuda" else None
        self._recorder = StepRecorder(self.accumulator, PhaseTimer(marks=marks, synchronize=self.synchronize))
        for optimizer in trainer.optimizers:
            register = getattr(optimizer, "register_step_post_hook", None)
            if register is not None:
                self._hook_handles.append(register(self._on_optimizer_step_end))

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._recorder is not None:
            self._recorder.discard()
            self._recorder.reanchor()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # A step can be left open when on_train_batch_start returned -1 (no on_train_batch_end).
        if self._recorder is not None:
            self._recorder.discard()

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._recorder is not None:
            self._recorder.discard()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._end_of_training(trainer)
        if self.isolated_optimizer_steps > 0:  # the loader's workers stopped first (issue 12.2)
            self.isolated_context, self.isolated_optimizer_ms = time_optimizers_alone(
                trainer, self.isolated_optimizer_steps
            )
        if trainer.world_size > 1:
            self.rank_medians_ms = gather_medians(trainer, self.accumulator)
        if trainer.is_global_zero:
            self._write_report(trainer)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._remove_hooks()
        self._detach(trainer)
        if self._recorder is None:  # not training, or the report is already written
            return
        self._partial = f"{type(exception).__name__}: {exception}"
        # No isolated timing and no gathering across ranks here: the device may be out of memory
        # and the other ranks may not be in this hook. Never hide the exception being handled.
        try:
            self._end_of_training(trainer)
            if trainer.is_global_zero:
                self._write_report(trainer)
        except Exception as error:
            rank_zero_warn(f"StepTimeProfiler: could not write the partial report: {error!r}")

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._remove_hooks()
        self._detach(trainer)
        self._recorder = None

    # -- hooks -> recorder --------------------------------------------------------------------

    def on_fetch_start(self) -> None:
        """Called by the tap when Lightning starts waiting for a batch."""
        if self._recorder is not None:
            self._recorder.fetch_start()

    def on_fetch_end(self) -> None:
        """Called by the tap when the batch is in hand."""
        if self._recorder is not None:
            self._recorder.fetch_end()

    def on_device_work_start(self) -> None:
        """Called by the tap when ``on_after_batch_transfer`` starts (the ``device_work`` phase)."""
        if self._recorder is not None:
            self._recorder.device_work_start()

    def on_device_work_end(self) -> None:
        if self._recorder is not None:
            self._recorder.device_work_end()

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._recorder is not None:
            self._recorder.batch_start(pl_module.automatic_optimization)

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        if self._recorder is not None:
            self._recorder.before_backward(pl_module.automatic_optimization)

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._recorder is not None:
            self._recorder.after_backward()

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self._recorder is not None:
            self._recorder.before_optimizer_step(pl_module.automatic_optimization)

    def _on_optimizer_step_end(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._recorder is not None:
            self._recorder.optimizer_step_end()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._recorder is None:
            return
        self._recorder.batch_end(
            batch=trainer.fit_loop.total_batch_idx,
            epoch=trainer.current_epoch,
            global_step=trainer.global_step,
            # Lightning logs a step's metrics at `_batches_that_stepped` before it increments
            # (logger_connector.log_metrics); the same x lines the curves up.
            log_step=log_step(trainer),
            automatic=int(pl_module.automatic_optimization),
        )
        self._drain(trainer)

    # -- rows -> loggers and checks -------------------------------------------------------------

    def _drain(self, trainer: Trainer, flush: bool = False) -> None:
        assert self._recorder is not None  # a programming error: only called while training
        for row, labels, calls in self._recorder.drain(flush):
            self._log_step(trainer, row, labels, calls)
            if len(self.accumulator) > self.warmup_steps:
                self._warn_silent_phases()

    def _log_step(self, trainer: Trainer, row: Mapping[str, float], labels: Mapping[str, int], calls: int) -> None:
        """Log as Lightning logs step metrics: one point per logged optimiser step (:class:`StepLogWindow`)."""
        due = self._log_window.add(row, labels, calls)
        if due is not None and trainer.loggers:
            step, window = due
            metrics = step_metrics(window)
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)

    def _warn_silent_phases(self, end_of_fit: bool = False) -> None:
        """Once after the warm-up and once at the end of fit: name each phase that never fired."""
        if self._recorder is None or (self._fetch_checked and not end_of_fit):
            return
        self._fetch_checked = True
        for phase, message in self._recorder.silent_phases(end_of_fit).items():
            if phase not in self._warned:
                self._warned.add(phase)
                rank_zero_warn(f"StepTimeProfiler: {message}")
        if self._recorder.hook_order_problem is not None:
            warn_unverified("fetch_action", f"hook order: {self._recorder.hook_order_problem}",
                            "The phases around it may be split at the wrong hooks.", warn=rank_zero_warn)

    # -- end of fit ----------------------------------------------------------------------------

    def _end_of_training(self, trainer: Trainer) -> None:
        """Close the rows and the wall-time account; run the fired-phase checks."""
        train_s = time.perf_counter() - self._train_start_s
        assert self._recorder is not None  # a programming error: only called while training
        self._recorder.discard()
        try:
            self._drain(trainer, flush=True)
        except Exception as error:  # e.g. a CUDA error while reading the events of the last steps
            pending = self._recorder.pending
            rank_zero_warn(f"StepTimeProfiler: {len(pending)} steps dropped, their events unreadable: {error!r}")
            pending.clear()
        self._remove_hooks()
        self._warn_silent_phases(end_of_fit=True)
        self.wall = wall_account(train_s, self.accumulator)
        self._recorder = None  # no step after this; on_exception from here on has nothing to add

    def _write_report(self, trainer: Trainer) -> None:
        self.report_paths = publish_report(
            self.summary(), self.rows(), self.warmup_steps, self._facts(),
            dirpath=self._dirpath, filename=self.filename, save_plot=self.save_plot,
            show=lambda text: print_summary(trainer, text),  # beside the progress bar, not into it
        )

    def _remove_hooks(self) -> None:
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []

    def _detach(self, trainer: Trainer) -> None:
        if self._profiler is not None:
            detach(self._profiler, self)
            self._profiler = None
