"""YOLOSegModule trains as Ultralytics' trainer does: its EMA of the weights, its nominal-batch accumulation.

The EMA (on Lightning's own ``WeightAveraging``) is compared with Ultralytics' own ``ModelEMA`` fed
the same weights after every optimiser step of a real ``Trainer`` run. The accumulated
gradients are compared with a hand computation: the sum of the per-batch losses' gradients.
"""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from seg_datamodule import COCOSegDataModule
from seg_datamodule.integrations._optim import apply_nominal_batch, nominal_batch_accumulation
from seg_datamodule.integrations import UltralyticsEMA, YOLOSegModule

needs_ultralytics = pytest.mark.needs("ultralytics")

# A short ramp and a low decay, so the average differs from the weights after a few steps.
DECAY, TAU = 0.9, 2.0


def _datamodule(demo_dir, batch_size: int = 4) -> COCOSegDataModule:
    return COCOSegDataModule(image_size=64, batch_size=batch_size, val_batch_size=4, num_workers=0,
                             demo_dir=str(demo_dir), mosaic=0.0, use_cache=False)


def _trainer(tmp_path, callbacks: list, **kwargs) -> L.Trainer:
    options = dict(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                   enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0)
    return L.Trainer(default_root_dir=tmp_path, callbacks=callbacks, **{**options, **kwargs})


def _assert_same_state(actual: dict, expected: dict, what: str) -> None:
    assert list(actual) == list(expected), what
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=1e-5, atol=1e-6, msg=f"{what}: {name}")


class _ReferenceEMA(L.Callback):
    """Ultralytics' ``ModelEMA`` of the module's model, updated after each optimiser step, and checks."""

    def __init__(self) -> None:
        self.ema: ModelEMA | None = None
        self.validated = 0
        self.trained: dict | None = None
        self.history: dict[int, dict] = {}  # optimiser step -> the reference EMA's state

    def on_train_start(self, trainer, pl_module) -> None:
        from ultralytics.utils.torch_utils import ModelEMA

        self.ema = ModelEMA(pl_module.model, decay=DECAY, tau=TAU)
        self._step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step > self._step:  # an optimiser step happened
            self.ema.update(pl_module.model)
            self._step = trainer.global_step
            self.trained = copy.deepcopy(pl_module.model.state_dict())
            self.history[trainer.global_step] = copy.deepcopy(self.ema.ema.state_dict())

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        # What validation scores is the average, not the trained weights.
        _assert_same_state(pl_module.model.state_dict(), self.ema.ema.state_dict(), "validated weights")
        self.validated += 1


@pytest.mark.slow
# SGD at lr 0.05 without warmup moves the average far from the weights in 3 steps, and the model diverges:
# its validation loss is NaN, which the module names (check_loss) and these tests of the average ignore.
@pytest.mark.filterwarnings("ignore:YOLOSegModule. a non-finite val loss")
@needs_ultralytics
def test_the_ema_is_ultralytics_model_ema(demo_dir, tmp_path) -> None:
    module = YOLOSegModule(num_classes=4, optimizer="SGD", lr=0.05, schedule="lightning", warmup_steps=0, ema=False, nominal_batch_size=8,
                           coco_eval=False)
    reference = _ReferenceEMA()
    ema = UltralyticsEMA(decay=DECAY, tau=TAU)
    trainer = _trainer(tmp_path, [reference, ema], limit_train_batches=6, limit_val_batches=1)
    trainer.fit(module, datamodule=_datamodule(demo_dir))
    assert trainer.global_step == 3 and ema.updates == 3 and reference.ema.updates == 3  # 6 batches, accumulate 2
    assert reference.validated == 1
    _assert_same_state(module.model.state_dict(), reference.ema.ema.state_dict(), "weights after fit")
    # The average is not the trained weights (the comparison above is not trivially true).
    moved = [n for n, v in reference.trained.items() if v.is_floating_point()
             and not torch.allclose(v, reference.ema.ema.state_dict()[n], atol=1e-5)]
    assert len(moved) > 100


class _Validated(L.Callback):
    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.state = copy.deepcopy(pl_module.model.state_dict())


@pytest.mark.slow
# SGD at lr 0.05 without warmup moves the average far from the weights in 3 steps, and the model diverges:
# its validation loss is NaN, which the module names (check_loss) and these tests of the average ignore.
@pytest.mark.filterwarnings("ignore:YOLOSegModule. a non-finite val loss")
@needs_ultralytics
def test_the_checkpoint_holds_the_ema_and_resumes_exactly(demo_dir, tmp_path) -> None:
    def run(max_steps: int, ckpt_path=None) -> tuple[YOLOSegModule, _ReferenceEMA, UltralyticsEMA]:
        L.seed_everything(0)
        module = YOLOSegModule(num_classes=4, optimizer="SGD", lr=0.05, schedule="lightning", warmup_steps=0, cosine_schedule=False,
                               ema=False, nominal_batch_size=None, coco_eval=False)  # one schedule for any max_steps
        reference, ema = _ReferenceEMA(), UltralyticsEMA(decay=DECAY, tau=TAU)
        saver = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "run4", filename="{step}",
                                                    every_n_train_steps=2, save_top_k=-1)
        trainer = _trainer(tmp_path, [reference, ema, saver], max_steps=max_steps, limit_val_batches=0,
                           enable_checkpointing=True)
        trainer.fit(module, datamodule=_datamodule(demo_dir), ckpt_path=ckpt_path)
        return module, reference, ema

    whole, whole_reference, whole_ema = run(4)
    path = tmp_path / "run4" / "step=2.ckpt"  # written mid-run, after the second step's EMA update
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)  # written by this test
    assert {"current_model_state", "averaging_state"} <= set(checkpoint)
    # The checkpoint's weights are the EMA after 2 steps: what load_from_checkpoint restores.
    restored = YOLOSegModule.load_from_checkpoint(path, map_location="cpu")
    _assert_same_state(restored.model.state_dict(), whole_reference.history[2], "load_from_checkpoint")
    # Validating it scores the EMA, and nothing warns (the module's own EMA callback restores nothing then).
    validated = _Validated()
    saver = L.pytorch.callbacks.ModelCheckpoint(dirpath=path.parent, every_n_train_steps=2, save_top_k=-1)  # as saved
    _trainer(tmp_path, [validated, saver], limit_val_batches=1, enable_checkpointing=True).validate(
        YOLOSegModule(num_classes=4, coco_eval=False), datamodule=_datamodule(demo_dir), ckpt_path=path)
    _assert_same_state(validated.state, whole_reference.history[2], "validate(ckpt_path=...)")
    # Resumed from step 2: the same trained weights and the same average as the run never stopped.
    resumed, resumed_reference, resumed_ema = run(4, ckpt_path=path)
    assert resumed_ema.updates == whole_ema.updates == 4
    _assert_same_state(resumed_reference.trained, whole_reference.trained, "trained weights after resuming")
    _assert_same_state(resumed.model.state_dict(), whole.model.state_dict(), "EMA after resuming")


def test_nominal_batch_accumulation_by_hand() -> None:
    # Ultralytics: accumulate = max(round(64 / batch), 1); weight_decay *= batch * accumulate / 64.
    table = {1: (64, 1.0), 16: (4, 1.0), 24: (3, 72 / 64), 40: (2, 80 / 64), 64: (1, 1.0), 96: (1, 1.5),
             128: (1, 2.0),  # 64 / 128 = 0.5 rounds to 0 (to even), then max(., 1)
             26: (2, 52 / 64)}  # 2.46 -> 2
    for batch, (accumulate, scale) in table.items():
        got = nominal_batch_accumulation(batch, 64)
        assert got[0] == accumulate and math.isclose(got[1], scale), (batch, got)
    assert nominal_batch_accumulation(4, 10) == (2, 0.8)  # round(2.5) = 2
    with pytest.raises(ValueError, match="batch_size"):
        nominal_batch_accumulation(0, 64)


def test_apply_nominal_batch_counts_every_device_and_refuses_conflicts() -> None:
    trainer = SimpleNamespace(datamodule=SimpleNamespace(batch_size=8), world_size=2, accumulate_grad_batches=1)
    # 16 images per step over 2 devices: 4 batches; the loss scale undoes Lightning's mean over both.
    assert apply_nominal_batch(trainer, 64) == (8.0, 1.0) and trainer.accumulate_grad_batches == 4
    assert apply_nominal_batch(trainer, 64) == (8.0, 1.0)  # a second fit with the same Trainer
    trainer.accumulate_grad_batches = 3
    with pytest.raises(ValueError, match=r"accumulate_grad_batches=3\) conflicts with the model's nominal"):
        apply_nominal_batch(trainer, 64)
    with pytest.raises(ValueError, match="nominal_batch_size needs the batch size"):
        apply_nominal_batch(SimpleNamespace(datamodule=None, world_size=1, accumulate_grad_batches=1), 64)


class _Capture(L.Callback):
    """The first optimiser step's batches, gradients and weight decays, and the starting module."""

    def __init__(self) -> None:
        self.batches, self.grads, self.decays, self.start = [], None, None, None

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = copy.deepcopy(pl_module)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.grads is None:
            self.batches.append(batch)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self.grads is None:
            self.grads = {n: p.grad.clone() for n, p in pl_module.model.named_parameters() if p.grad is not None}
            self.decays = [g["weight_decay"] for g in optimizer.param_groups]


@pytest.mark.slow
@needs_ultralytics
def test_accumulated_gradients_are_the_sum_of_the_batches_losses(demo_dir, tmp_path) -> None:
    module = YOLOSegModule(num_classes=4, optimizer="SGD", weight_decay=5e-4, schedule="lightning", warmup_steps=0, ema=False,
                           nominal_batch_size=10, coco_eval=False)  # batch 4: accumulate round(2.5) = 2
    capture = _Capture()
    trainer = _trainer(tmp_path, [capture], limit_train_batches=2, limit_val_batches=0)
    trainer.fit(module, datamodule=_datamodule(demo_dir))
    assert trainer.accumulate_grad_batches == 2 and trainer.global_step == 1 and len(capture.batches) == 2
    assert capture.decays == pytest.approx([5e-4 * 4 * 2 / 10, 0.0])  # scaled decay; none on norms and biases
    # By hand: Ultralytics back-propagates loss.sum() of each batch and steps on the summed gradients.
    reference = capture.start.train()
    for batch in capture.batches:
        reference.compute_losses(batch)[0].backward()
    for name, param in reference.model.named_parameters():
        if param.grad is not None:
            torch.testing.assert_close(capture.grads[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)


@needs_ultralytics
def test_the_keys_turn_both_off_and_are_checked() -> None:
    assert [type(c) for c in YOLOSegModule(num_classes=4).configure_callbacks()] == [UltralyticsEMA]
    module = YOLOSegModule(num_classes=4, ema=False, nominal_batch_size=None)
    assert module.configure_callbacks() == []
    for kwargs, match in (({"ema_decay": 1.0}, "decay"), ({"ema_tau": 0}, "tau"), ({"ema": "yes"}, "ema"),
                          ({"nominal_batch_size": 0}, "nominal_batch_size")):
        with pytest.raises(ValueError, match=match):
            YOLOSegModule(num_classes=4, **kwargs)


class _Clipped(L.Callback):
    """The gradients before clipping (Lightning's hook runs before it) and those the optimiser
    stepped with (a step leaves them; the next batch's closure zeroes them)."""

    def __init__(self) -> None:
        self.before: dict[str, torch.Tensor] = {}
        self.stepped: dict[str, torch.Tensor] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.stepped:
            self.stepped = {n: p.grad.clone() for n, p in pl_module.model.named_parameters() if p.grad is not None}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if not self.before:
            self.before = {n: p.grad.clone() for n, p in pl_module.model.named_parameters() if p.grad is not None}


@pytest.mark.slow
@needs_ultralytics
def test_gradients_are_clipped_at_ultralytics_norm_unless_the_trainer_says_otherwise(demo_dir, tmp_path) -> None:
    """Ultralytics' trainer clips the total gradient norm at 10 before every step (issue 61: without
    it YOLO11n-seg from scratch learned about 8x slower); here the module's default, the Trainer's
    ``gradient_clip_val`` winning where set."""
    assert YOLOSegModule(num_classes=4, coco_eval=False).hparams.max_grad_norm == 10.0
    with pytest.raises(ValueError, match="max_grad_norm must be a number > 0 or None, got 0"):
        YOLOSegModule(num_classes=4, max_grad_norm=0)

    def run(max_grad_norm: float | None, **trainer_kwargs) -> _Clipped:
        L.seed_everything(0)
        module = YOLOSegModule(num_classes=4, optimizer="SGD", schedule="lightning", warmup_steps=0, ema=False, nominal_batch_size=None,
                               coco_eval=False, max_grad_norm=max_grad_norm)
        clipped = _Clipped()
        _trainer(tmp_path, [clipped], limit_train_batches=1, limit_val_batches=0, **trainer_kwargs).fit(
            module, datamodule=_datamodule(demo_dir))
        assert clipped.before and set(clipped.stepped) == set(clipped.before)
        return clipped

    def norm(grads: dict[str, torch.Tensor]) -> float:
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])))

    # The reference: torch.nn.utils.clip_grad_norm_ at that norm, the call Ultralytics makes.
    for max_norm, kwargs, expected in ((0.01, {}, 0.01), (0.01, {"gradient_clip_val": 0.02}, 0.02)):
        clipped = run(max_norm, **kwargs)
        assert norm(clipped.before) > 10 * expected  # so the clipping changed them
        reference = {n: torch.nn.Parameter(torch.zeros_like(g)) for n, g in clipped.before.items()}
        for name, param in reference.items():
            param.grad = clipped.before[name].clone()
        torch.nn.utils.clip_grad_norm_(list(reference.values()), max_norm=expected)
        for name, grad in clipped.stepped.items():
            torch.testing.assert_close(grad, reference[name].grad, rtol=1e-5, atol=1e-9, msg=name)
        assert norm(clipped.stepped) == pytest.approx(expected, rel=1e-4)
    unclipped = run(None)  # None: only what the Trainer asks (nothing here)
    for name, grad in unclipped.stepped.items():
        assert torch.equal(grad, unclipped.before[name]), name
