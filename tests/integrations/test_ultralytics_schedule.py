"""``schedule: ultralytics`` steps, warms up and decays as Ultralytics' trainer does (issue 61).

The reference is a transcription of ``BaseTrainer._do_train``'s loop (Ultralytics 8.4.190, lines
cited) run on a real ``torch.optim`` optimiser with Ultralytics' ``LambdaLR``: the lr of each group,
SGD's momentum and whether the optimiser steps, at every batch. :class:`UltralyticsSchedule`
answers the same for any batch without replaying the loop; a real ``Trainer`` run of
``YOLOSegModule`` is then checked against it batch by batch, its accumulated gradients against a
hand sum, its EMA updates against its steps, and a resume between two steps against the run that
never stopped.
"""

from __future__ import annotations

import copy
import math
import warnings
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from seg_datamodule import COCOSegDataModule
from seg_datamodule.integrations._ultralytics_schedule import GROUPS, UltralyticsSchedule, ultralytics_param_groups

needs_ultralytics = pytest.mark.needs("ultralytics")


def _reference_loop(lr: float, momentum: float, epochs: int, nb: int, nominal: int, lrf: float, cos_lr: bool,
                    warmup_epochs: float, warmup_bias_lr: float, warmup_momentum: float) -> list[tuple]:
    """(ni, lr per group, momentum, stepped) at every batch, as Ultralytics' loop sets them."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    groups = ultralytics_param_groups(model, 5e-4)
    opt = torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True)
    if cos_lr:  # ultralytics/utils/torch_utils.py one_cycle
        lf = lambda x: ((1 - math.cos(x * math.pi / epochs)) / 2) * (lrf - 1) + 1  # noqa: E731
    else:  # trainer.py:273
        lf = lambda x: max(1 - x / epochs, 0) * (1.0 - lrf) + lrf  # noqa: E731
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=lf)
    scheduler.last_epoch = -1  # trainer.py:465, start_epoch 0
    accumulate = min(nominal, nb * epochs)  # trainer.py:321-324
    w = min(warmup_epochs, max(epochs - 1, 0))  # trainer.py:276-279
    nw = round(w * nb) if w > 0 else 0
    last_opt_step, acc0, rows = -1, accumulate, []
    for epoch in range(epochs):
        with warnings.catch_warnings():  # as trainer.py:499-501: no optimiser steps in this replay
            warnings.simplefilter("ignore")
            scheduler.step()
        for i in range(nb):
            ni = i + nb * epoch
            if nw and ni <= nw:  # trainer.py:522-538
                xi = [0, nw]
                accumulate = max(1, int(np.interp(ni, xi, [1, acc0]).round()))
                for x in opt.param_groups:
                    x["lr"] = float(np.interp(ni, xi, [warmup_bias_lr if x.get("param_group") == "bias" else 0.0,
                                                       x["initial_lr"] * lf(epoch)]))
                    if "momentum" in x:
                        x["momentum"] = float(np.interp(ni, xi, [warmup_momentum, momentum]))
            stepped = ni - last_opt_step >= accumulate  # trainer.py:602-604
            if stepped:
                last_opt_step = ni
            rows.append((ni, tuple(x["lr"] for x in opt.param_groups), opt.param_groups[0]["momentum"], stepped))
    return rows


def _check_against_reference(**kw) -> None:
    schedule = UltralyticsSchedule(lr=kw["lr"], momentum=kw["momentum"], epochs=kw["epochs"],
                                   batches_per_epoch=kw["nb"], accumulate=kw["nominal"], lrf=kw["lrf"],
                                   cos_lr=kw["cos_lr"], warmup_epochs=kw["warmup_epochs"],
                                   warmup_bias_lr=kw["warmup_bias_lr"], warmup_momentum=kw["warmup_momentum"])
    for ni, lrs, momentum, stepped in _reference_loop(**kw):
        epoch = ni // kw["nb"]
        assert schedule.steps_on(ni) == stepped, (ni, kw)
        assert [schedule.lr_at(ni, epoch, g) for g in GROUPS] == pytest.approx(lrs, rel=1e-12, abs=0), (ni, kw)
        assert schedule.momentum_at(ni) == pytest.approx(momentum, rel=1e-12), (ni, kw)


BASE = dict(lr=0.01, momentum=0.937, lrf=0.01, cos_lr=False, warmup_epochs=3.0, warmup_bias_lr=0.1,
            warmup_momentum=0.8)


def test_a_short_run_ramps_the_accumulation_and_takes_more_steps_than_a_fixed_one() -> None:
    # Issue 61's run: 400 images in batches of 16 (25 a epoch), nbs 64, 10 epochs.
    schedule = UltralyticsSchedule(lr=0.00125, momentum=0.9, epochs=10, batches_per_epoch=25, accumulate=4)
    assert schedule.warmup_batches == 75
    steps = [ni for ni in range(250) if schedule.steps_on(ni)]
    # By hand: accumulate round(1 + 3 ni / 75) is 1 up to ni 12, 2 up to 37, 3 up to 62, 4 after: steps at
    # 0-12 (13), every 2nd to 36 (12), every 3rd to 60 (8), then 64 and every 4th to 248 (47).
    assert steps[:15] == list(range(13)) + [14, 16] and steps[24:27] == [36, 39, 42] and steps[32:34] == [60, 64]
    assert len(steps) == 80 > 250 // 4  # a fixed accumulation of 4 would step 62 times
    assert schedule.lr_at(0, 0, "bias") == 0.1 and schedule.lr_at(0, 0, "weight") == 0.0
    assert schedule.lr_at(75, 3, "weight") == pytest.approx(0.00125 * (1 - 3 / 10 * 0.99))
    assert schedule.lr_at(249, 9, "bn") == pytest.approx(0.00125 * (0.1 * 0.99 + 0.01))


@pytest.mark.parametrize("kw", [
    dict(epochs=10, nb=25, nominal=4, **BASE),
    dict(epochs=4, nb=7, nominal=4, **{**BASE, "cos_lr": True}),  # the warmup capped at epochs - 1
    dict(epochs=1, nb=9, nominal=3, **BASE),  # no warmup at all: the first step after 3 batches
    dict(epochs=3, nb=2, nominal=64, **BASE),  # the accumulation capped at the run's batches
    dict(epochs=5, nb=11, nominal=1, **{**BASE, "warmup_epochs": 0.5, "warmup_bias_lr": 0.0}),
])
def test_the_schedule_is_ultralytics_loop(kw: dict) -> None:
    _check_against_reference(**kw)


@settings(max_examples=40, deadline=None)
@given(epochs=st.integers(1, 6), nb=st.integers(1, 30), nominal=st.integers(1, 8), cos_lr=st.booleans(),
       warmup_epochs=st.sampled_from([0.0, 0.3, 1.0, 3.0]))
def test_the_schedule_is_ultralytics_loop_for_any_run(epochs, nb, nominal, cos_lr, warmup_epochs) -> None:
    _check_against_reference(**{**BASE, "epochs": epochs, "nb": nb, "nominal": nominal, "cos_lr": cos_lr,
                                "warmup_epochs": warmup_epochs})


def test_param_groups_are_ultralytics_groups_by_hand() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.GroupNorm(2, 4), nn.Linear(4, 2))
    groups = ultralytics_param_groups(model, 5e-4)
    assert [g["param_group"] for g in groups] == ["weight", "bn", "bias"]
    assert [g["weight_decay"] for g in groups] == [5e-4, 0.0, 0.0]
    named = {id(p): n for n, p in model.named_parameters()}
    assert [sorted(named[id(p)] for p in g["params"]) for g in groups] == [
        ["0.weight", "3.weight"], ["1.weight", "2.weight"], ["0.bias", "1.bias", "2.bias", "3.bias"]]


@needs_ultralytics
def test_param_groups_are_those_of_ultralytics_build_optimizer() -> None:
    from ultralytics.engine.trainer import BaseTrainer
    from ultralytics.nn.tasks import SegmentationModel

    model = SegmentationModel("yolo11n-seg.yaml", nc=4, verbose=False)
    theirs = BaseTrainer.build_optimizer(SimpleNamespace(args=None), model, name="SGD", lr=0.01, momentum=0.937,
                                         decay=5e-4)
    ours = ultralytics_param_groups(model, 5e-4)
    assert [g["param_group"] for g in theirs.param_groups] == list(GROUPS)
    for mine, their in zip(ours, theirs.param_groups):
        assert [id(p) for p in mine["params"]] == [id(p) for p in their["params"]], mine["param_group"]
        assert mine["weight_decay"] == their["weight_decay"]


# ------------------------------------------------------------------------------ a real Trainer run


class _Record(L.Callback):
    """Per batch: did the optimiser step, the groups' lrs at the step, and the gradients of the third step."""

    def __init__(self) -> None:
        self.stepped: list[bool] = []
        self.lrs: dict[int, list[float]] = {}
        self.batches: list = []
        self.start = None
        self.grads = None
        self._step_now = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step_now = False
        self.batches.append(batch)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._step_now = True
        ni = len(self.stepped)
        self.lrs[ni] = [g["lr"] for g in optimizer.param_groups]
        if sum(self.stepped) == 2 and self.grads is None:  # the third step: after batches 2 and 3
            self.grads = {n: p.grad.clone() for n, p in pl_module.model.named_parameters() if p.grad is not None}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.stepped.append(self._step_now)
        assert pl_module.optimizer_stepped == self._step_now
        if sum(self.stepped) == 2 and self.start is None:  # the weights the third step starts from
            self.start = copy.deepcopy(pl_module)


def _fit(demo_dir, tmp_path, callbacks, max_epochs: int = 3, ckpt_path=None, **module_kwargs):
    from seg_datamodule.integrations import YOLOSegModule

    L.seed_everything(0)
    module = YOLOSegModule(num_classes=4, optimizer="SGD", lr=0.01, nominal_batch_size=16, coco_eval=False,
                           **module_kwargs)
    dm = COCOSegDataModule(image_size=64, batch_size=4, num_workers=0, demo_dir=str(demo_dir), mosaic=0.0,
                           use_cache=False)
    trainer = L.Trainer(default_root_dir=tmp_path, callbacks=callbacks, max_epochs=max_epochs, accelerator="cpu",
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=any(isinstance(c, L.pytorch.callbacks.ModelCheckpoint) for c in callbacks),
                        num_sanity_val_steps=0, limit_train_batches=6, limit_val_batches=0)
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, trainer


@pytest.mark.slow
@needs_ultralytics
def test_a_fit_steps_and_sets_the_rates_where_ultralytics_trainer_does(demo_dir, tmp_path) -> None:
    from seg_datamodule.integrations import UltralyticsEMA

    record = _Record()
    module, trainer = _fit(demo_dir, tmp_path, [record])  # with the module's own UltralyticsEMA
    (ema,) = [c for c in trainer.callbacks if isinstance(c, UltralyticsEMA)]
    # 3 epochs of 6 batches of 4, nbs 16: accumulate 4, a warmup of min(3, 3 - 1) epochs = 12 batches.
    reference = _reference_loop(lr=0.01, momentum=0.937, epochs=3, nb=6, nominal=4, lrf=0.01, cos_lr=False,
                                warmup_epochs=3.0, warmup_bias_lr=0.1, warmup_momentum=0.8)
    assert record.stepped == [row[3] for row in reference]
    assert record.stepped[:6] == [True, True, False, True, False, True]  # accumulate 1, 1, 2, 2, 2, 2
    for ni, lrs in record.lrs.items():
        assert lrs == pytest.approx(list(reference[ni][1]), rel=1e-12), ni
    assert trainer.global_step == 18  # Lightning's step is a batch here
    # By hand: accumulate round(1 + 3 ni / 12) is 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 4, 4, 4, then 4 (half to even).
    assert [ni for ni, stepped in enumerate(record.stepped) if stepped] == [0, 1, 3, 5, 8, 12, 16]
    assert module.optimizer_steps == ema.updates == 7  # the EMA follows the real steps
    # The third step's gradients are the sum of batches 2 and 3's losses' gradients (Ultralytics sums them).
    reference_module = record.start.train()
    reference_module.model.zero_grad()
    for batch in record.batches[2:4]:
        reference_module.compute_losses(batch)[0].backward()
    for name, param in reference_module.model.named_parameters():
        if param.grad is not None:
            torch.testing.assert_close(record.grads[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
@needs_ultralytics
def test_a_resume_between_two_steps_keeps_the_accumulated_gradients(demo_dir, tmp_path) -> None:
    def saver(folder: str) -> L.Callback:
        return L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / folder, filename="{step}", every_n_train_steps=1,
                                                   save_top_k=-1)

    whole, _ = _fit(demo_dir, tmp_path, [saver("ckpt")], ema=False)
    # Steps after batches 8 and 12 (see above): the checkpoint after batch 10 holds two batches' gradients.
    path = tmp_path / "ckpt" / "step=11.ckpt"
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    assert len(checkpoint["accumulated_gradients"]) > 100 and "accumulated_gradients" not in torch.load(
        tmp_path / "ckpt" / "step=13.ckpt", map_location="cpu", weights_only=True)
    resumed, _ = _fit(demo_dir, tmp_path, [saver("ckpt")], ckpt_path=path, ema=False)  # the same callback state
    for (name, value), other in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        torch.testing.assert_close(other, value, rtol=0, atol=0, msg=name)


@needs_ultralytics
def test_the_schedule_keys_are_checked() -> None:
    from seg_datamodule.integrations import YOLOSegModule

    for kwargs, error, match in (
        ({"warmup_steps": 10}, ValueError, "warmup_steps and cosine_schedule set schedule: lightning"),
        ({"schedule": "yolo"}, ValueError, "schedule"),
        ({"lrf": 1.5}, ValueError, r"lrf must be in \[0, 1\], got 1.5"),
        ({"warmup_momentum": 1.2}, ValueError, "warmup_momentum"),
        ({"cos_lr": "yes"}, ValueError, "cos_lr must be a bool"),
    ):
        with pytest.raises(error, match=match):
            YOLOSegModule(num_classes=4, **kwargs)
    assert YOLOSegModule(num_classes=4, schedule="lightning", warmup_steps=10).hparams.warmup_steps == 10
