"""StepTimeProfiler in real Trainer runs: accuracy against injected costs, not presence.

The model and data have known costs (see ``_profiling_doubles``); the summary's medians must land
within 10 % (or 3 ms) of what the doubles measured they injected.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.plugins import MixedPrecision
from lightning.pytorch.profilers import SimpleProfiler
from torch.utils.data import DataLoader

from _profiling_doubles import (
    BATCH_SIZE,
    FETCH_MS,
    FORWARD_MS,
    OPTIMIZER_MS,
    SPLIT,
    ClockReadings,
    CostModel,
    IteratorModel,
    MemoryLogger,
    NoCudaEvents,
    Run,
    SleepyDataset,
    assert_bit_identical,
    assert_close,
    assert_contains,
    assert_isolated_timing,
    assert_tracks,
    fit,
    injected,
    loader,
    make_trainer,
    sleep_ms,
)
from seg_datamodule.profiling import PHASES, StepTimeProfiler
from seg_datamodule.profiling import optimizer as optimizer_module

# torch 2.14 deprecates pytree's LeafSpec, which Lightning 2.6 still builds for every batch.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning"
)


# ---------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"warmup_steps": -1}, ValueError, "warmup_steps must be >= 0, got -1"),
        ({"warmup_steps": 2.5}, TypeError, "warmup_steps must be an int >= 0, got 2.5"),
        ({"warmup_steps": True}, TypeError, "warmup_steps must be an int"),
        ({"log_every_n_steps": -3}, ValueError, "log_every_n_steps must be >= 0, got -3"),
        ({"log_every_n_steps": "5"}, TypeError, "log_every_n_steps must be an int >= 0 or None, got '5'"),
        ({"synchronize": 1}, TypeError, "synchronize must be a bool, got 1"),
        ({"isolated_optimizer_steps": -1}, ValueError, "isolated_optimizer_steps must be >= 0"),
        ({"dirpath": 3}, TypeError, "dirpath must be a str"),
        ({"filename": ""}, ValueError, "filename must be a non-empty file stem"),
        ({"filename": "a/b"}, ValueError, "without a path separator, got 'a/b'"),
        ({"filename": None}, TypeError, "filename must be a str, got None"),
        ({"save_plot": "yes"}, TypeError, "save_plot must be a bool, got 'yes'"),
    ],
)
def test_init_rejects_bad_arguments(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        StepTimeProfiler(**kwargs)


def test_init_arguments_are_plain_and_stored() -> None:
    profiler = StepTimeProfiler(
        warmup_steps=0, log_every_n_steps=10, synchronize=True, isolated_optimizer_steps=3, dirpath="out"
    )
    assert (profiler.warmup_steps, profiler.log_every_n_steps, profiler.synchronize) == (0, 10, True)
    assert (profiler.isolated_optimizer_steps, profiler.dirpath, profiler.filename) == (3, "out", "step_time")
    assert profiler.summary() == {}


# ---------------------------------------------------------------------------- real Trainer runs


@pytest.fixture(scope="module")
def serial_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One fit with num_workers=0 (the fetch costs 40 ms in the main process), 25 steps."""
    profiler = StepTimeProfiler(log_every_n_steps=1, isolated_optimizer_steps=3)
    clock = ClockReadings()  # the isolated timing's own clock readings
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "Event", NoCudaEvents)
        patch.setattr(optimizer_module, "time", clock)
        run = fit(tmp_path_factory.mktemp("serial"), profiler, CostModel())
    run.isolated_clock = clock
    return run


@pytest.mark.slow
def test_medians_match_injected_costs(serial_run: Run) -> None:
    profiler = serial_run.profiler
    summary = profiler.summary()
    run = serial_run
    injected(run.dataset.costs_ms, FETCH_MS, "fetch", group=BATCH_SIZE)
    optimizer = injected(run.optimizer_costs_ms[:25], OPTIMIZER_MS, "optimizer")
    assert_tracks(run.column("train_dataloader_next"), run.loader.fetch_ms, "train_dataloader_next")
    run.check_forward()
    assert_tracks(run.column("optimizer_step"), optimizer, "optimizer_step")
    assert_tracks(run.column("step"), run.step_ref_ms, "step")
    assert summary["backward"]["median_ms"] < 3.0 and summary["batch_to_device"]["median_ms"] < 3.0
    assert sum(summary[p]["share"] for p in SPLIT) == pytest.approx(1.0)
    # Every row adds up, and the warm-up rows are recorded but not summarised.
    rows = profiler.rows()
    assert len(rows) == 25 and [r["batch"] for r in rows] == list(range(25))
    for row in rows:
        assert sum(row[f"{p}_ms"] for p in SPLIT) == pytest.approx(row["step_ms"])
        assert row["optimizer_calls"] == 1
    assert summary["step"]["total_s"] == pytest.approx(sum(r["step_ms"] for r in rows[5:]) / 1e3)
    # The isolated optimiser step sleeps too; its figure is the median of its own brackets.
    opt = summary["optimizer_step"]
    # The optimiser's own record of the isolated run: one untimed step, then 3 timed ones, each
    # held by one of the timer's brackets; the in-loop figure tracks the double (above).
    spans = run.trainer.optimizers[0].spans
    assert len(spans) == 25 + 1 + 3
    assert_isolated_timing(opt["isolated_ms"], run.isolated_clock, spans[26:], "isolated optimizer step")
    assert opt["isolated_ms"] == run.profiler.isolated_optimizer_ms[0]
    assert opt["in_loop_over_isolated"] == pytest.approx(opt["stepped_median_ms"] / opt["isolated_ms"], rel=1e-12)
    assert opt["stepped_median_ms"] == pytest.approx(float(np.median(run.column("optimizer_step")[5:])))


@pytest.mark.slow
def test_json_and_logged_metrics_match_summary(serial_run: Run) -> None:
    profiler, root = serial_run.profiler, serial_run.root
    assert profiler.report_paths == [root / "step_time.json", root / "step_time.png"]
    report = json.loads((root / "step_time.json").read_text())
    assert report["phases"] == list(PHASES) and report["ranks"] is None
    summary = profiler.summary()
    assert report["summary"].keys() == summary.keys()
    for phase, stats in summary.items():
        assert report["summary"][phase] == pytest.approx(stats)
    assert len(report["rows"]) == len(profiler.rows())
    for saved, row in zip(report["rows"], profiler.rows()):
        assert saved == pytest.approx(row)
    for phase in PHASES:  # the summary is recomputable from the JSON rows
        values = [row[f"{phase}_ms"] for row in report["rows"][report["warmup_steps"] :]]
        assert np.median(values) == pytest.approx(report["summary"][phase]["median_ms"])
    logger = serial_run.trainer.logger
    assert isinstance(logger, MemoryLogger)
    logged = [(step, m) for step, m in logger.logged if "step_time/step_ms" in m]
    assert len(logged) == 25
    for (step, metrics), row in zip(logged, profiler.rows()):
        assert step == row["global_step"] - 1  # Lightning's x for this batch's metrics
        assert metrics == pytest.approx({f"step_time/{p}_ms": row[f"{p}_ms"] for p in PHASES})
    for phase in PHASES:
        values = [m[f"step_time/{phase}_ms"] for _, m in logged[5:]]
        assert np.median(values) == pytest.approx(summary[phase]["median_ms"])
    assert (root / "step_time.png").stat().st_size > 1000


@pytest.mark.slow
def test_trainer_is_left_as_found(serial_run: Run) -> None:
    trainer = serial_run.trainer
    assert "start" not in vars(trainer.profiler) and "stop" not in vars(trainer.profiler)
    assert all(not opt._optimizer_step_post_hooks for opt in trainer.optimizers)


@pytest.mark.slow
def test_workers_that_keep_up_hide_the_fetch(tmp_path: Path) -> None:
    profiler = StepTimeProfiler(log_every_n_steps=0, save_plot=False)
    run = fit(tmp_path, profiler, CostModel(), num_workers=2, max_steps=30)
    summary = profiler.summary()
    # Two workers each make a batch in >= 40 ms (a sleep never ends early); the loop eats one per
    # >= 45 ms. The fetch is the wait in next(), not the workers' cost: it tracks the wait the
    # loader measured, and a step whose batch was ready waited far less than a batch costs (how
    # many such steps depends on the machine's load, so only one is asked for).
    assert_tracks(run.column("train_dataloader_next"), run.loader.fetch_ms, "train_dataloader_next")
    assert min(run.column("train_dataloader_next")[5:]) < 0.5 * FETCH_MS, summary["train_dataloader_next"]
    run.check_forward()
    optimizer = injected(run.optimizer_costs_ms, OPTIMIZER_MS, "optimizer")
    assert_tracks(run.column("optimizer_step"), optimizer, "optimizer_step")
    assert sum(summary[p]["share"] for p in SPLIT) == pytest.approx(1.0)


@pytest.mark.slow
def test_gradient_accumulation_and_a_user_profiler(tmp_path: Path) -> None:
    user_profiler = SimpleProfiler()
    profiler = StepTimeProfiler(warmup_steps=4, save_plot=False)
    run = fit(
        tmp_path, profiler, CostModel(), max_steps=10, accumulate_grad_batches=2, profiler=user_profiler
    )
    rows = profiler.rows()
    assert len(rows) == 20
    assert [r["optimizer_calls"] for r in rows] == [0, 1] * 10
    assert all(r["optimizer_step_ms"] == 0.0 for r in rows if not r["optimizer_calls"])
    summary = profiler.summary()
    optimizer = injected(run.optimizer_costs_ms, OPTIMIZER_MS, "optimizer")
    assert_tracks(run.column("optimizer_step", stepped=True), optimizer, "optimizer_step", skip=2)
    assert_close(summary["optimizer_step"]["stepped_median_ms"], float(np.median(optimizer[2:])), "stepped median")
    # every other batch steps: the mean over all batches is half the stepping batches' mean
    assert_close(summary["optimizer_step"]["mean_ms"], float(np.mean(optimizer[2:])) / 2, "mean over all batches")
    run.check_forward(skip=4)
    # The user's profiler still saw every action, the fetch included.
    assert run.trainer.profiler is user_profiler
    assert len(user_profiler.recorded_durations["[_TrainingEpochLoop].train_dataloader_next"]) >= 20


@pytest.mark.slow
def test_manual_optimisation(tmp_path: Path) -> None:
    profiler = StepTimeProfiler(save_plot=False)
    run = fit(tmp_path, profiler, CostModel(manual=True), max_steps=20)
    summary = profiler.summary()
    # forward is training_step less the backward and optimiser step nested in it
    injected(run.model.costs_ms, FORWARD_MS, "forward")
    assert_contains(run.column("forward"), run.model.forward_ref_ms, "forward")
    assert_tracks(run.column("forward"), run.model.forward_ref_ms, "forward")
    optimizer = injected(run.optimizer_costs_ms, OPTIMIZER_MS, "optimizer")
    assert_tracks(run.column("optimizer_step"), optimizer, "optimizer_step")
    injected(run.dataset.costs_ms, FETCH_MS, "fetch", group=BATCH_SIZE)
    assert_tracks(run.column("train_dataloader_next"), run.loader.fetch_ms, "train_dataloader_next")
    assert summary["backward"]["median_ms"] < 3.0
    assert all(row["optimizer_calls"] == 1 for row in profiler.rows())


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:You are using the `dataloader_iter` step flavor:UserWarning")
@pytest.mark.filterwarnings("ignore:Found `dataloader_iter` argument in the `training_step`:UserWarning")
def test_dataloader_iter_fetch_nested_in_training_step(tmp_path: Path) -> None:
    profiler = StepTimeProfiler(save_plot=False)
    run = fit(tmp_path, profiler, IteratorModel(), max_steps=20)
    injected(run.dataset.costs_ms, FETCH_MS, "fetch", group=BATCH_SIZE)
    assert_tracks(run.column("train_dataloader_next"), run.loader.fetch_ms, "train_dataloader_next")
    # the fetch inside training_step is not counted as forward
    run.check_forward(nested_fetch=True)
    optimizer = injected(run.optimizer_costs_ms, OPTIMIZER_MS, "optimizer")
    assert_tracks(run.column("optimizer_step"), optimizer, "optimizer_step")


@pytest.mark.slow
def test_amp_scaler_skipped_steps_stay_sane(tmp_path: Path) -> None:
    # fp16 AMP is refused on CPU by the Trainer flag; the plugin with a CPU GradScaler runs the
    # same scaler.step path as on CUDA.
    # init_scale=1 so that only the injected inf losses skip steps (fp16 grads overflow at 2**16).
    amp = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=1.0))
    profiler = StepTimeProfiler(warmup_steps=0, save_plot=False)
    run = fit(tmp_path, profiler, CostModel(inf_every=3), max_steps=12, plugins=[amp])
    rows = profiler.rows()
    assert len(rows) == 12
    assert all(row["optimizer_calls"] == 1 for row in rows)  # on_before_optimizer_step runs either way
    # inf loss on every 3rd batch: the scaler skips optimizer.step (and its sleep)
    assert len(run.optimizer_costs_ms) == 8
    skipped = [row for row in rows if row["batch"] % 3 == 0]
    stepped = [row for row in rows if row["batch"] % 3 != 0]
    assert np.median([row["optimizer_step_ms"] for row in skipped]) < 3.0
    optimizer = injected(run.optimizer_costs_ms, OPTIMIZER_MS, "optimizer")
    assert_tracks([row["optimizer_step_ms"] for row in stepped], optimizer, "optimizer_step", skip=1)
    # a skipped step's optimizer_step ends with Lightning's hook, not in `other`
    assert np.median([row["other_ms"] for row in skipped]) < 3.0
    for row in rows:
        assert sum(row[f"{p}_ms"] for p in SPLIT) == pytest.approx(row["step_ms"])


@pytest.mark.slow
def test_fewer_steps_than_warmup_says_so_in_one_line_and_writes_nothing(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)  # without a progress bar the line is logged (rank_zero_info)
    profiler = StepTimeProfiler(warmup_steps=5)
    with warnings.catch_warnings():
        # a plain line (issue 51), not a Python warning with its source line
        warnings.filterwarnings("error", message="StepTimeProfiler")
        fit(tmp_path, profiler, CostModel(forward_ms=0.0), max_steps=3)
    lines = [message for message in caplog.messages if "StepTimeProfiler" in message]
    assert lines == ["StepTimeProfiler: 3 training steps, not more than warmup_steps=5; nothing to report."]
    assert profiler.summary() == {} and len(profiler.rows()) == 3
    assert not (tmp_path / "step_time.json").exists()


@pytest.mark.slow
# Lightning 2.6.0's ddp_spawn reads its own results file back with torch.load, which torch 2.4
# (the lowest release tested, .ci/lowest.txt) warns about; nothing of the user's is unpickled.
@pytest.mark.filterwarnings("ignore:You are using `torch.load` with `weights_only=False`:FutureWarning")
def test_ddp_report_names_the_slowest_rank(tmp_path: Path) -> None:
    profiler = StepTimeProfiler(warmup_steps=3, save_plot=False)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_steps=10,
        callbacks=[profiler],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(CostModel(forward_ms=5.0, straggler_ms=20.0, costs_dir=tmp_path), loader())
    report = json.loads((tmp_path / "step_time.json").read_text())
    ranks = report["ranks"]
    forward = ranks["median_ms"]["forward"]
    assert len(forward) == 2 and ranks["slowest_rank"]["forward"] == 1
    # Each rank's rows against its training_step as the rank's model measured it, step by step
    # (the spawned processes wrote both), and the gathered medians are those rows' medians.
    for rank in range(2):
        saved = json.loads((tmp_path / f"forward_rank{rank}.json").read_text())
        measured = [row["forward_ms"] for row in saved["rows"]]
        injected(saved["forward_ref_ms"], 25.0 if rank else 5.0, f"rank {rank} forward")
        assert_tracks(measured, saved["forward_ref_ms"], f"rank {rank} forward", skip=3)
        assert forward[rank] == pytest.approx(float(np.median(measured[3:])))
    # rank 0 waits for the straggler in backward's gradient all-reduce
    assert ranks["slowest_rank"]["backward"] == 0
    assert report["summary"]["forward"]["median_ms"] == pytest.approx(forward[0])


class _TransferCostDataModule(L.LightningDataModule):
    """A DataModule whose own on_before_batch_transfer takes 20 ms (Lightning names it apart)."""

    def __init__(self) -> None:
        super().__init__()
        self.costs_ms: list[float] = []

    def train_dataloader(self) -> DataLoader:
        return DataLoader(SleepyDataset(item_ms=0.5), batch_size=BATCH_SIZE)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.costs_ms.append(sleep_ms(20.0))
        return batch


def test_datamodule_transfer_hook_counts_as_batch_to_device(tmp_path: Path) -> None:
    profiler = StepTimeProfiler(warmup_steps=3)
    datamodule = _TransferCostDataModule()
    make_trainer(tmp_path, profiler, max_steps=12).fit(CostModel(forward_ms=1.0), datamodule=datamodule)
    transfer = injected(datamodule.costs_ms, 20.0, "on_before_batch_transfer")
    assert_tracks([r["batch_to_device_ms"] for r in profiler.rows()], transfer, "batch_to_device", skip=3)
    # not counted in `other`
    assert profiler.summary()["other"]["median_ms"] < 0.5 * float(np.median(transfer))


class ScheduledModel(CostModel):
    """Adam(lr=0.1) with an LR scheduler stepped every batch (YolactLite uses a cosine one)."""

    def __init__(self, scheduler: str) -> None:
        super().__init__(forward_ms=0.0)
        self.scheduler = scheduler

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=0.1)
        schedulers = {
            "StepLR": lambda: torch.optim.lr_scheduler.StepLR(optimizer, step_size=2),
            "OneCycleLR": lambda: torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=20),
            "cosine": lambda: torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=6),
        }
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedulers[self.scheduler](), "interval": "step"}}


@pytest.mark.parametrize("scheduler", ["StepLR", "OneCycleLR", "cosine"])
def test_fit_with_the_profiler_trains_bit_identically(tmp_path: Path, scheduler: str) -> None:
    # issue 12.1: with a scheduler, the isolated timing used to step the real Adam 11 more times.
    def run(callbacks: list[Any]) -> tuple[list[torch.Tensor], dict[str, Any]]:
        torch.manual_seed(0)
        model = ScheduledModel(scheduler)
        trainer = L.Trainer(
            accelerator="cpu", devices=1, max_steps=6, callbacks=callbacks, logger=False,
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
            default_root_dir=tmp_path,
        )
        trainer.fit(model, DataLoader(SleepyDataset(item_ms=0.0), batch_size=BATCH_SIZE))
        return [p.detach().clone() for p in model.parameters()], trainer.optimizers[0].state_dict()

    params, state = run([StepTimeProfiler(warmup_steps=0, isolated_optimizer_steps=10, save_plot=False)])
    reference_params, reference_state = run([])
    assert int(state["state"][0]["step"]) == 6
    assert_bit_identical(params, reference_params, "parameters")
    assert_bit_identical(state, reference_state)
