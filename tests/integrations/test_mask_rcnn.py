"""MaskRCNNModule with torchvision's real Mask R-CNN: learning, gradients, empty images, a fit."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from seg_datamodule import COCOSegDataModule, StepTimeProfiler, collate_detection
from seg_datamodule.integrations import MaskRCNNModule

ROOT = Path(__file__).resolve().parents[2]

# Few proposals and a small backbone keep a CPU step cheap; the mechanics are those of the default.
SMALL = dict(backbone="resnet18", min_size=128, max_size=128, mask_rcnn_kwargs=dict(
    rpn_pre_nms_top_n_train=300, rpn_post_nms_top_n_train=100, rpn_pre_nms_top_n_test=300,
    rpn_post_nms_top_n_test=100, box_batch_size_per_image=64))


def test_arguments_are_checked() -> None:
    for kwargs, match in (({"backbone": "vgg16"}, "backbone"), ({"min_size": 0}, "min_size"),
                          ({"box_score_thresh": 2.0}, "box_score_thresh"), ({"lr": 0.0}, "lr"),
                          ({"mask_rcnn_kwargs": {"num_classes": 3}}, "mask_rcnn_kwargs")):
        with pytest.raises(ValueError, match=match):
            MaskRCNNModule(num_classes=4, **kwargs)
    assert "val_ann" not in MaskRCNNModule(num_classes=4, **SMALL).hparams


@pytest.mark.slow
def test_losses_decrease_when_overfitting_one_batch(demo_val_samples) -> None:
    batch = collate_detection(demo_val_samples, mask_stride=4)
    module = MaskRCNNModule(num_classes=4, **SMALL)
    module.train()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    history = []
    for _ in range(6):
        loss, losses = module.compute_losses(batch)
        optimizer.zero_grad()
        loss.backward()
        for name, param in module.named_parameters():
            assert param.grad is None or torch.isfinite(param.grad).all(), name
        optimizer.step()
        history.append({"loss": float(loss.detach()), **{k: float(v.detach()) for k, v in losses.items()}})
    # Measured 4.16 -> 1.22 (mask 1.56 -> 0.44) over these steps; the bounds leave room for noise.
    assert set(history[0]) == {"loss", "loss_classifier", "loss_box_reg", "loss_mask", "loss_objectness",
                               "loss_rpn_box_reg"}
    assert history[-1]["loss"] < 0.7 * history[0]["loss"], [h["loss"] for h in history]
    assert history[-1]["loss_mask"] < 0.7 * history[0]["loss_mask"]


def test_images_without_instances(demo_val_samples) -> None:
    batch = collate_detection(demo_val_samples[3:], mask_stride=4)
    module = MaskRCNNModule(num_classes=4, **SMALL)
    loss, losses = module.compute_losses(batch)
    assert torch.isfinite(loss) and float(losses["loss_mask"].detach()) == 0.0
    loss.backward()
    module.eval()
    with torch.no_grad():
        (pred,) = module.predict_batch(batch)
    assert pred["masks"].shape[1:] == (128, 128) and bool((pred["labels"] >= 0).all())


@pytest.mark.slow
@pytest.mark.extended  # default tier: the models guide's Mask R-CNN fit logs val/segm_AP (test_readme.py)
def test_fit_on_the_demo_logs_coco_ap_of_real_detections(demo_dir, tmp_path) -> None:
    dm = COCOSegDataModule(image_size=128, batch_size=4, val_batch_size=8, num_workers=0, demo_dir=str(demo_dir),
                           mosaic=0.0, use_cache=False)
    module = MaskRCNNModule(num_classes=4, lr=0.01, warmup_steps=1, **SMALL)
    profiler = StepTimeProfiler(warmup_steps=1, save_plot=False)
    logger = L.pytorch.loggers.CSVLogger(tmp_path, name="rcnn")
    trainer = L.Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=1, accelerator="cpu", logger=logger,
                        callbacks=[profiler], enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, num_sanity_val_steps=0, log_every_n_steps=1)
    trainer.fit(module, datamodule=dm)
    metrics = trainer.callback_metrics
    for name in ("val/segm_AP", "val/bbox_AP", "train/loss_mask"):
        assert name in metrics and torch.isfinite(metrics[name]), name
    report = json.loads((tmp_path / "rcnn" / "version_0" / "step_time.json").read_text())
    for phase in ("train_dataloader_next", "forward", "backward", "optimizer_step"):
        assert report["summary"][phase]["median_ms"] > 0, phase


def _sizes(module: MaskRCNNModule) -> tuple[tuple[int, ...], int]:
    return tuple(module.model.transform.min_size), int(module.model.transform.max_size)


def test_unset_sizes_follow_the_datamodules_image_size() -> None:
    # issue 40: configs/maskrcnn.yaml fixed 640 / 640, so --data.image_size 320 trained at 640 (4x the compute).
    trainer = SimpleNamespace(datamodule=SimpleNamespace(image_size=320))
    module = MaskRCNNModule(num_classes=4, backbone="resnet18")
    assert _sizes(module) == ((640,), 1333)  # without a DataModule: torchvision's internal resize as before
    module.trainer = trainer
    module.setup("predict")
    assert _sizes(module) == ((320,), 320)
    fixed = MaskRCNNModule(num_classes=4, backbone="resnet18", min_size=640, max_size=640)
    fixed.trainer = trainer
    with pytest.warns(UserWarning, match="min_size 640 / max_size 640 do not match data.image_size 320"):
        fixed.setup("predict")
    assert _sizes(fixed) == ((640,), 640)  # the user's explicit sizes stay


@pytest.mark.slow
# LightningCLI's own call of a jsonargparse API that jsonargparse deprecates (add_instantiator).
@pytest.mark.filterwarnings("ignore::jsonargparse._deprecated.JsonargparseDeprecationWarning")
def test_the_config_trains_at_the_image_size_given(coco_mini: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from seg_datamodule.cli import _DataOnlyCLI

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    coco = {f"--data.{s}_ann": str(coco_mini / "annotations" / f"instances_{s}2017.json") for s in ("train", "val")}
    images = {f"--data.{s}_images": str(coco_mini / f"{s}2017") for s in ("train", "val")}
    args = ["--config", str(ROOT / "configs" / "maskrcnn.yaml"), *[x for kv in {**coco, **images}.items() for x in kv],
            "--data.image_size", "320", "--data.cache_dir", str(tmp_path / "cache"),
            "--model.init_args.backbone", "resnet18", "--model.init_args.weights_backbone", "null",
            "--model.init_args.trainable_backbone_layers", "null"]
    cli = _DataOnlyCLI(L.LightningModule, COCOSegDataModule, subclass_mode_model=True, run=False,
                       save_config_callback=None, args=args)
    cli.model.trainer = SimpleNamespace(datamodule=cli.datamodule)
    cli.model.setup("predict")
    assert _sizes(cli.model) == ((320,), 320)
