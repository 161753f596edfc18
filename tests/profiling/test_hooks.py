"""Where the phases come from: public hooks, one profiler tap for the fetch, and loud failure.

Lightning's profiler action names are not an API. These tests simulate Lightning renaming them
(by patching the call sites that name them) and check that every phase a public hook gives
still measures, and that a fetch whose action is no longer seen is reported, not read as 0.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
from lightning.pytorch.profilers import SimpleProfiler
from lightning.pytorch.trainer import call

from _profiling_doubles import (
    FETCH_MS,
    CostModel,
    StepEnds,
    assert_contains,
    assert_tracks,
    fit,
    injected,
    loader,
    make_trainer,
    sleep_ms,
)
from seg_datamodule.profiling import StepTimeProfiler


def _renamed_strategy_hook(trainer: L.Trainer, hook_name: str, *args: Any, **kwargs: Any) -> Any:
    """Lightning's ``call._call_strategy_hook``, naming its profiler action ``strategy/<hook>``."""
    pl_module = trainer.lightning_module
    previous = pl_module._current_fx_name
    pl_module._current_fx_name = hook_name
    with trainer.profiler.profile(f"strategy/{hook_name}"):
        output = getattr(trainer.strategy, hook_name)(*args, **kwargs)
    pl_module._current_fx_name = previous
    return output


class TransferCostModel(CostModel):
    """Its ``transfer_batch_to_device`` (run inside the strategy's ``batch_to_device``) takes 15 ms."""

    def __init__(self) -> None:
        super().__init__()
        self.transfer_ms: list[float] = []

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        self.transfer_ms.append(sleep_ms(15.0))
        return super().transfer_batch_to_device(batch, device, dataloader_idx)


def test_phases_from_public_hooks_survive_renamed_actions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 12.3: forward and batch_to_device used to come from the strategy's action names.
    monkeypatch.setattr(call, "_call_strategy_hook", _renamed_strategy_hook)
    profiler = StepTimeProfiler(save_plot=False)
    run = fit(tmp_path, profiler, TransferCostModel(), max_steps=15)
    run.check_forward()
    transfer = injected(run.model.transfer_ms, 15.0, "transfer_batch_to_device")
    assert_tracks(run.column("batch_to_device"), transfer, "batch_to_device")
    optimizer = injected(run.optimizer_costs_ms, 30.0, "optimizer")
    assert_tracks(run.column("optimizer_step"), optimizer, "optimizer_step")
    assert_tracks(run.column("step"), run.step_ref_ms, "step")


def _rename_fetch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's fetch bracket under another action name."""
    name = "[_TrainingEpochLoop].next_batch"
    monkeypatch.setattr(_TrainingEpochLoop, "_on_before_fetch", lambda self: self.trainer.profiler.start(name))
    monkeypatch.setattr(_TrainingEpochLoop, "_on_after_fetch", lambda self: self.trainer.profiler.stop(name))


def test_a_fetch_that_never_fires_warns_once_naming_the_phase(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _rename_fetch(monkeypatch)
    profiler = StepTimeProfiler(warmup_steps=3, save_plot=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(tmp_path, profiler, CostModel(forward_ms=1.0), max_steps=12)
    ours = [str(w.message) for w in caught if "StepTimeProfiler" in str(w.message)]
    assert len(ours) == 1, ours
    assert "'train_dataloader_next' never fired" in ours[0] and "train_dataloader_next" in ours[0]
    assert "verified on lightning 2.6.0 to 2.6.6; this is " in ours[0]
    # still no silent zero in the report: the phase reads 0 only alongside the warning above
    assert profiler.summary()["train_dataloader_next"]["median_ms"] == 0.0


def test_two_profilers_both_measure(tmp_path: Path) -> None:
    first, second = StepTimeProfiler(save_plot=False), StepTimeProfiler(save_plot=False, filename="second")
    trainer = make_trainer(tmp_path, first, max_steps=15)
    trainer.callbacks.insert(1, second)  # first, second, then StepEnds
    data = loader()
    model = CostModel(forward_ms=5.0)
    trainer.fit(model, data)
    injected(data.dataset.costs_ms, FETCH_MS, "fetch", group=4)
    for profiler in (first, second):
        fetch = [r["train_dataloader_next_ms"] for r in profiler.rows()]
        assert_tracks(fetch, data.fetch_ms, "train_dataloader_next")
        forward = [r["forward_ms"] for r in profiler.rows()]
        assert_contains(forward, model.forward_ref_ms, "forward")
        probe = next(c for c in trainer.callbacks if isinstance(c, StepEnds))
        assert_tracks(forward, probe.forward_ms(), "forward")
    assert "start" not in vars(trainer.profiler) and "stop" not in vars(trainer.profiler)


class ProfilerProbe(L.Callback):
    """Records, during training, what a user's code sees as ``trainer.profiler``."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.seen.append(trainer.profiler)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.seen.append(trainer.profiler)


def test_the_users_profiler_stays_itself(tmp_path: Path) -> None:
    user_profiler = SimpleProfiler()
    probe = ProfilerProbe()
    profiler = StepTimeProfiler(save_plot=False)
    trainer = make_trainer(tmp_path, profiler, max_steps=8, profiler=user_profiler)
    trainer.callbacks.append(probe)
    trainer.fit(CostModel(forward_ms=1.0), loader())
    assert len(probe.seen) == 16
    assert all(seen is user_profiler and isinstance(seen, SimpleProfiler) for seen in probe.seen)
    assert all(r["train_dataloader_next_ms"] > 0.0 for r in profiler.rows())
    # the user's profiler saw every fetch, and is left without our tap
    assert len(user_profiler.recorded_durations["[_TrainingEpochLoop].train_dataloader_next"]) >= 8
    assert "start" not in vars(user_profiler) and "stop" not in vars(user_profiler)
    assert isinstance(trainer.callbacks[1], StepEnds)


class NoPostHookModel(CostModel):
    """Its optimiser offers no ``register_step_post_hook`` (as a foreign optimiser might)."""

    def configure_optimizers(self) -> torch.optim.Optimizer:
        optimizer = super().configure_optimizers()
        optimizer.register_step_post_hook = None  # type: ignore[method-assign]
        return optimizer


def test_an_optimiser_step_that_never_ends_warns(tmp_path: Path) -> None:
    profiler = StepTimeProfiler(warmup_steps=2, save_plot=False)
    with pytest.warns(UserWarning, match="phase 'optimizer_step' never ended in 6 steps"):
        run = fit(tmp_path, profiler, NoPostHookModel(forward_ms=0.0), max_steps=6)
    # the phase then runs to the end of the step: it holds at least the optimiser's own work
    for row, cost in zip(profiler.rows(), run.optimizer_costs_ms):
        assert row["optimizer_step_ms"] >= cost
