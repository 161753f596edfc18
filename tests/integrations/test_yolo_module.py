"""YOLOSegModule with the real Ultralytics model and loss: learning, gradients, empty images, a fit."""

from __future__ import annotations

import dataclasses
import json

import lightning as L
import pytest
import torch

from seg_datamodule import COCOSegDataModule, StepTimeProfiler, collate_detection
from seg_datamodule.integrations import YOLOSegModule

pytestmark = pytest.mark.needs("ultralytics")


def _step(module: YOLOSegModule, optimizer: torch.optim.Optimizer, batch) -> tuple[float, dict[str, float]]:
    loss, items, _ = module.compute_losses(batch)
    optimizer.zero_grad()
    loss.backward()
    for name, param in module.named_parameters():
        assert param.grad is None or torch.isfinite(param.grad).all(), name
    optimizer.step()
    return float(loss.detach()), {k: float(v) for k, v in items.items()}


@pytest.mark.slow
def test_losses_decrease_when_overfitting_one_batch(demo_val_samples) -> None:
    batch = collate_detection(demo_val_samples, mask_stride=4)
    module = YOLOSegModule(num_classes=4)
    module.train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=2e-3)
    history = [_step(module, optimizer, batch) for _ in range(8)]
    (first, first_items), (last, last_items) = history[0], history[-1]
    # Measured 114 -> 44 over these 8 steps (every term falls); the bounds leave room for noise.
    assert last < 0.7 * first, [h[0] for h in history]
    assert set(first_items) == {"box_loss", "seg_loss", "cls_loss", "dfl_loss"}
    for name in ("seg_loss", "cls_loss"):
        assert last_items[name] < first_items[name], (name, first_items, last_items)


def test_an_image_without_instances(demo_val_samples) -> None:
    batch = collate_detection(demo_val_samples[3:], mask_stride=4)
    module = YOLOSegModule(num_classes=4)
    loss, items, _ = module.compute_losses(batch)
    assert torch.isfinite(loss) and items["box_loss"] == 0 and items["seg_loss"] == 0
    loss.backward()  # connected to the mask branch too (Ultralytics' zero terms)
    module.eval()
    with torch.no_grad():
        (pred,) = module.predict_batch(batch)
    assert pred["masks"].dtype == torch.bool and pred["masks"].shape[1:] == (32, 32)
    assert pred["boxes"].shape == (pred["scores"].shape[0], 4) == (pred["labels"].shape[0], 4)


def test_arguments_canvas_and_weights(demo_val_samples, tmp_path) -> None:
    for kwargs in ({"num_classes": 0}, {"num_classes": 4, "conf": 1.5}, {"num_classes": 4, "optimizer": "Adam"},
                   {"num_classes": 4, "max_det": 0}, {"num_classes": 4, "box": -1.0}):
        with pytest.raises(ValueError, match=next(k for k in kwargs if k != "num_classes") if len(kwargs) > 1
                           else "num_classes"):
            YOLOSegModule(**kwargs)
    batch = collate_detection(demo_val_samples, mask_stride=4)
    module = YOLOSegModule(num_classes=4)
    cropped = dataclasses.replace(batch, images=batch.images[..., :120, :120])
    with pytest.raises(ValueError, match="multiple of 32"):
        module.compute_losses(cropped)
    # A plain state_dict round-trips; a pickled object that is no model is refused (and not built).
    path = tmp_path / "state.pt"
    torch.save(module.model.state_dict(), path)
    loaded = YOLOSegModule(num_classes=4, weights=str(path))
    for (name, a), b in zip(module.model.state_dict().items(), loaded.model.state_dict().values()):
        assert torch.equal(a, b), name
    torch.save({"model": torch.nn.Linear(2, 2)}, tmp_path / "pickled.pt")
    with pytest.raises(ValueError, match="fills 0 of the model's"):
        YOLOSegModule(num_classes=4, weights=str(tmp_path / "pickled.pt"))
    # Another class count: the class branch starts afresh, everything else is loaded.
    other = YOLOSegModule(num_classes=3, weights=str(path)).pretrained
    assert other.skipped and all(name.startswith("model.23.cv3.") for name, _, _ in other.skipped)
    assert "val_ann" not in module.hparams


@pytest.mark.slow
def test_fit_on_the_demo_logs_coco_ap_of_real_detections(demo_dir, tmp_path) -> None:
    dm = COCOSegDataModule(image_size=128, batch_size=8, val_batch_size=8, num_workers=0, demo_dir=str(demo_dir),
                           mosaic=0.0, use_cache=False)
    module = YOLOSegModule(num_classes=4, max_det=50, nominal_batch_size=None)  # a step per batch
    profiler = StepTimeProfiler(warmup_steps=1, save_plot=False)
    logger = L.pytorch.loggers.CSVLogger(tmp_path, name="yolo")
    trainer = L.Trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=2, accelerator="cpu", logger=logger,
                        callbacks=[profiler], enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, num_sanity_val_steps=0, log_every_n_steps=1)
    trainer.fit(module, datamodule=dm)
    metrics = trainer.callback_metrics
    for name in ("val/segm_AP", "val/bbox_AP", "val/segm_AP50", "val/loss", "train/seg_loss"):
        assert name in metrics and torch.isfinite(metrics[name]), name
    assert 0.0 <= float(metrics["val/segm_AP"]) <= 1.0
    assert module.coco_metric is not None and module.coco_metric.update_count == 0  # computed and reset
    report = json.loads((tmp_path / "yolo" / "version_0" / "step_time.json").read_text())
    for phase in ("train_dataloader_next", "forward", "backward", "optimizer_step"):
        assert report["summary"][phase]["median_ms"] > 0, phase
    header = (tmp_path / "yolo" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert "val/segm_AP" in header and "step_time/forward_ms" in header
