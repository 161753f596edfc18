"""The end of fit: the report after an exception, honest wall-time totals, per-step logging as
Lightning logs, and an "alone" optimiser timing taken with the loader's workers stopped."""

from __future__ import annotations

import json
import logging
import multiprocessing
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from _profiling_doubles import (
    CostModel,
    SlowSGD,
    fit,
    loader,
    make_trainer,
    sleep_ms,
)
from seg_datamodule.profiling import StepTimeProfiler


class FailingModel(CostModel):
    """Raises ``error`` in the training_step of batch ``at``."""

    def __init__(self, error: BaseException, at: int = 20) -> None:
        super().__init__(forward_ms=1.0)
        self.error = error
        self.at = at

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> Any:
        if self.trainer.fit_loop.total_batch_idx == self.at:
            raise self.error
        return super().training_step(batch, batch_idx)


def test_an_exception_writes_the_partial_report(tmp_path: Path) -> None:
    # issue 12.4: an out-of-memory error at step 20 used to leave 20 rows in memory, nothing on disk.
    profiler = StepTimeProfiler(warmup_steps=5)
    trainer = make_trainer(tmp_path, profiler, max_steps=40)
    with pytest.raises(RuntimeError, match="out of memory"):
        trainer.fit(FailingModel(RuntimeError("CUDA out of memory (simulated)")), loader())
    report = json.loads((tmp_path / "step_time.json").read_text())
    assert report["partial"] is True and "RuntimeError: CUDA out of memory" in report["stopped_by"]
    assert len(report["rows"]) == 20 and report["summary"]["step"]["median_ms"] > 0
    assert profiler.report_paths == [tmp_path / "step_time.json", tmp_path / "step_time.png"]


def test_ctrl_c_writes_the_partial_report(tmp_path: Path) -> None:
    profiler = StepTimeProfiler(warmup_steps=5, save_plot=False)
    trainer = make_trainer(tmp_path, profiler, max_steps=40)
    handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit):  # Lightning turns Ctrl-C into a graceful exit(1)
            trainer.fit(FailingModel(KeyboardInterrupt(), at=12), loader())
    finally:
        signal.signal(signal.SIGINT, handler)  # Lightning ignores SIGINT from then on
    report = json.loads((tmp_path / "step_time.json").read_text())
    assert report["partial"] is True and report["stopped_by"].startswith("KeyboardInterrupt")
    assert len(report["rows"]) == 12


def test_a_complete_fit_is_not_partial(tmp_path: Path) -> None:
    profiler = StepTimeProfiler(warmup_steps=2, save_plot=False)
    fit(tmp_path, profiler, CostModel(forward_ms=0.0), max_steps=6)
    report = json.loads((tmp_path / "step_time.json").read_text())
    assert report["partial"] is False and report["stopped_by"] is None


class ValidatingModel(CostModel):
    """Validation between steps costs a known, measured time."""

    def __init__(self) -> None:
        super().__init__(forward_ms=2.0)
        self.validation_ms: list[float] = []

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.validation_ms.append(sleep_ms(20.0))


def test_time_between_steps_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # issue 12.5: steps covered 1.02 s of 1.99 s of fit, and nothing said so.
    profiler = StepTimeProfiler(warmup_steps=2, save_plot=False)
    model = ValidatingModel()
    trainer = make_trainer(
        tmp_path, profiler, max_steps=12, val_check_interval=4, limit_val_batches=3, num_sanity_val_steps=0
    )
    with caplog.at_level(logging.INFO):
        trainer.fit(model, loader(), loader())
    wall = json.loads((tmp_path / "step_time.json").read_text())["wall"]
    steps_s = sum(r["step_ms"] for r in profiler.rows()) / 1e3
    assert wall["steps_s"] == pytest.approx(steps_s)
    assert wall["between_steps_s"] == pytest.approx(wall["train_s"] - steps_s)
    # three validations of 3 batches, each measured by the model, all between steps
    assert len(model.validation_ms) == 9
    assert wall["between_steps_s"] >= sum(model.validation_ms) / 1e3
    assert wall["steps_share"] == pytest.approx(steps_s / wall["train_s"])
    assert profiler.wall == pytest.approx(wall)
    assert any("s between steps" in record.getMessage() for record in caplog.records)


class LoggingModel(CostModel):
    """Logs its loss with ``self.log`` (Lightning's own step metrics), and, in each training_step,
    how many of the profiler's points the logger already holds."""

    def __init__(self) -> None:
        super().__init__(forward_ms=0.0)
        self.points_seen: list[int] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> Any:
        logger = self.trainer.logger
        self.points_seen.append(sum("step_time/step_ms" in m for _, m in logger.logged))
        loss = super().training_step(batch, batch_idx)
        self.log("loss", loss)
        return loss


@pytest.mark.parametrize("log_every_n_steps", [1, 2])
def test_per_step_metrics_are_labelled_as_lightnings(tmp_path: Path, log_every_n_steps: int) -> None:
    # issue 12.5: with accumulation the x axis read 0, 0, 1, 1, ...: one point per batch at the
    # optimiser-step count. Lightning logs one point per optimiser step.
    profiler = StepTimeProfiler(warmup_steps=0, save_plot=False)
    trainer = make_trainer(
        tmp_path, profiler, max_steps=8, accumulate_grad_batches=2, log_every_n_steps=log_every_n_steps
    )
    trainer.fit(LoggingModel(), loader())
    logged = trainer.logger.logged
    lightning_x = [step for step, metrics in logged if "loss" in metrics]
    ours = [(step, metrics) for step, metrics in logged if "step_time/step_ms" in metrics]
    assert [step for step, _ in ours] == lightning_x
    assert lightning_x == list(range(log_every_n_steps - 1, 8, log_every_n_steps))
    rows = profiler.rows()
    for step, metrics in ours:  # a point sums the two batches of its optimiser step
        window = rows[2 * step : 2 * step + 2]
        assert metrics["step_time/step_ms"] == pytest.approx(sum(r["step_ms"] for r in window))
        assert metrics["step_time/forward_ms"] == pytest.approx(sum(r["forward_ms"] for r in window))


def test_per_step_metrics_are_logged_while_training(tmp_path: Path) -> None:
    # issue 17: logged during the fit, not only at its end.
    model = LoggingModel()
    trainer = make_trainer(tmp_path, StepTimeProfiler(warmup_steps=0, save_plot=False), max_steps=10, log_every_n_steps=1)
    trainer.fit(model, loader())
    assert model.points_seen == list(range(10))  # step k sees the points of the k steps before it


def test_logger_false_writes_to_default_root_dir_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # issue 12.5: with logger=False the files go to the Trainer's default_root_dir (the current
    # folder unless set); the console says where.
    profiler = StepTimeProfiler(warmup_steps=2)
    with caplog.at_level(logging.INFO):
        fit(tmp_path, profiler, CostModel(forward_ms=0.0), max_steps=5, logger=False)
    assert profiler.report_paths == [tmp_path / "step_time.json", tmp_path / "step_time.png"]
    assert any(f"written to {tmp_path / 'step_time.json'}" in record.getMessage() for record in caplog.records)


class ChildCountingSGD(SlowSGD):
    """Records, at every step (the isolated copy's included), the live child processes."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, sleep_ms=1.0)
        self.children_seen: list[int] = []

    def step(self, closure: Any = None) -> Any:
        self.children_seen.append(len(multiprocessing.active_children()))
        return super().step(closure)


class ChildCountingModel(CostModel):
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return ChildCountingSGD(self.parameters())


def test_the_alone_timing_runs_with_the_loaders_workers_stopped(tmp_path: Path) -> None:
    # issue 12.2: it ran while 2 workers still prefetched, hiding the starvation it should show.
    stop = threading.Event()
    user_thread = threading.Thread(target=stop.wait, name="user-numpy-thread", daemon=True)
    user_thread.start()
    profiler = StepTimeProfiler(warmup_steps=2, isolated_optimizer_steps=3, save_plot=False)
    try:
        run = fit(tmp_path, profiler, ChildCountingModel(forward_ms=1.0), num_workers=2, max_steps=8)
    finally:
        stop.set()
        user_thread.join()
    seen = run.trainer.optimizers[0].children_seen
    assert len(seen) == 8 + 1 + 3  # the loop's steps, then one untimed and 3 timed alone
    assert min(seen[:8]) >= 2  # the workers ran during training
    assert seen[8:] == [0, 0, 0, 0]  # and were gone for the timing alone
    context = json.loads((tmp_path / "step_time.json").read_text())["isolated_context"]
    assert context["loader_workers_shut_down"] is True and context["child_processes"] == 0
    assert "user-numpy-thread" in context["threads"]  # what still ran is said
