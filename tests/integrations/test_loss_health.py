"""Said once, not at every batch or every validation (issue 62), with a real Trainer and a tiny model that uses the
integrations' own helpers (no Ultralytics): a non-finite training loss skipped and named once per run, a non-finite
validation loss named once per validation, a peer's per-batch log line let through once, and the AP line of a
validation from a checkpoint printed once per validation with the checkpoint's epoch (while fitting, the current one).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image

from seg_datamodule import COCOSegDataModule
from seg_datamodule.integrations import NonFiniteLossError
from seg_datamodule.integrations._coco import log_coco_results, make_coco_metric
from seg_datamodule.integrations._stages import EvaluationStages, OnceFilter, check_loss

SIZE = (48, 64)  # (H, W) of every generated image
NAN = float("nan")


@pytest.fixture(scope="module")
def tiny_coco(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a COCO file of 4 random images with a square each, their folder)."""
    root = tmp_path_factory.mktemp("tiny")
    images, annotations = [], []
    for k in range(4):
        pixels = np.random.default_rng(k).integers(0, 255, (*SIZE, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"{k + 1}.jpg", "JPEG", quality=90)
        images.append({"id": k + 1, "file_name": f"{k + 1}.jpg", "height": SIZE[0], "width": SIZE[1]})
        x = 4 + 8 * k
        annotations.append({"id": k + 1, "image_id": k + 1, "category_id": 1, "iscrowd": 0, "bbox": [x, 4, 16, 16],
                            "area": 256.0, "segmentation": [[x, 4, x + 16, 4, x + 16, 20, x, 20]]})
    ann = root / "tiny.json"
    ann.write_text(json.dumps({"images": images, "annotations": annotations,
                               "categories": [{"id": 1, "name": "square"}]}))
    return ann, root


class _Tiny(EvaluationStages, L.LightningModule):
    """One weight; its training loss is NaN at the steps in ``nan_steps``, its validation loss at every batch when
    ``nan_val``; validation scores no detections on the DataModule's file and prints the AP line."""

    detections_name = "no detections"

    def __init__(self, nan_steps: tuple[int, ...] = (), nan_val: bool = False,
                 on_nonfinite_loss: str = "skip") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.test_metric = None
        self.coco_metric: Any = None
        self.num_classes = 1

    def setup(self, stage: str) -> None:
        if self.coco_metric is None and stage in ("fit", "validate"):
            self.coco_metric = make_coco_metric(self, None, self.num_classes)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        box = self.weight.sum() * (NAN if self.global_step in self.hparams.nan_steps else 1.0)
        cls = self.weight.sum() * 0.5
        loss = box + cls
        return loss if check_loss(self, loss, {"box_loss": box, "cls_loss": cls}, "train") else None

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        value = self.weight.sum() * (NAN if self.hparams.nan_val else 1.0)
        check_loss(self, value, {"seg_loss": value}, "val")
        h, w = batch.images.shape[-2:]
        empty = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.int64),
                 "masks": torch.zeros(0, h, w, dtype=torch.bool)}
        self.coco_metric.update([empty] * len(batch), batch)

    def on_validation_epoch_end(self) -> None:
        log_coco_results(self, self.coco_metric, self.detections_name)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _dm(tiny_coco: tuple[Path, Path], tmp_path: Path) -> COCOSegDataModule:
    ann, images = tiny_coco
    return COCOSegDataModule(train_ann=str(ann), train_images=str(images), val_ann=str(ann), val_images=str(images),
                             image_size=64, batch_size=2, val_batch_size=2, num_workers=0, mosaic=0.0,
                             cache_dir=str(tmp_path / "cache"))


def _trainer(tmp_path: Path, **kwargs: Any) -> L.Trainer:
    options = dict(max_epochs=2, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                   default_root_dir=tmp_path)
    return L.Trainer(**{**options, **kwargs})


# ---------------------------------------------------------------------------------------- non-finite losses


def test_a_skipped_non_finite_training_loss_is_said_once_per_run_and_every_one_counted(
        tiny_coco: tuple[Path, Path], tmp_path: Path) -> None:
    """Steps 0, 1 and 3 of 4 (two epochs of two batches) are NaN: three batches skipped, one line."""
    module = _Tiny(nan_steps=(0, 1, 3))
    with pytest.warns(UserWarning) as caught:
        _trainer(tmp_path, limit_val_batches=0).fit(module, datamodule=_dm(tiny_coco, tmp_path))
    said = [str(w.message) for w in caught if "non-finite" in str(w.message)]
    assert said == ["_Tiny: a non-finite training loss at step 0 (epoch 0) (box_loss nan): the batch is skipped "
                    "(on_nonfinite_loss: skip); later ones are counted, not printed"]
    assert not [w for w in caught if "returned `None`" in str(w.message)]  # Lightning's own line is not repeated
    assert module._nonfinite_skipped == 3
    # Skipped batches take no optimiser step: only the finite step moved the weight (SGD, gradient 1.5).
    assert module.weight.item() == pytest.approx(1.0 - 0.01 * 1.5)


def test_a_non_finite_training_loss_stops_at_its_step_naming_the_terms_that_are_not_finite(
        tiny_coco: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(NonFiniteLossError) as caught:
        _trainer(tmp_path, limit_val_batches=0).fit(_Tiny(nan_steps=(2,), on_nonfinite_loss="stop"),
                                                    datamodule=_dm(tiny_coco, tmp_path))
    message = str(caught.value)
    assert message.startswith("_Tiny: the training loss is nan at step 2 (epoch 1); not finite: box_loss nan. ")
    assert "cls_loss" not in message and message.count("on_nonfinite_loss: skip") == 1


def test_a_non_finite_validation_loss_is_said_once_per_validation_not_per_batch(
        tiny_coco: tuple[Path, Path], tmp_path: Path) -> None:
    """Three validations of two batches each (the sanity check is one): three lines, each naming its step."""
    with pytest.warns(UserWarning) as caught:
        _trainer(tmp_path, num_sanity_val_steps=2).fit(_Tiny(nan_val=True), datamodule=_dm(tiny_coco, tmp_path))
    said = [str(w.message) for w in caught if "non-finite" in str(w.message)]
    assert said == [f"_Tiny: a non-finite val loss (nan) in the validation at step {step} (epoch {epoch}); "
                    "not finite: seg_loss nan" for step, epoch in ((0, 0), (2, 0), (4, 1))]


def test_a_peers_per_batch_line_is_let_through_once_with_the_hint() -> None:
    logger = logging.getLogger("tests.once_filter")
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Collect()
    logger.addHandler(handler)
    try:
        once = OnceFilter.install(logger, "NMS time limit", "set nms_time_limit: null")
        assert OnceFilter.install(logger, "NMS time limit", "other words") is once  # one filter per prefix
        other = OnceFilter.install(logger, "slow batch", "a second prefix, its own filter")
        assert other is not once and logger.filters == [once, other]
        for k in range(5):
            logger.warning("NMS time limit %.3fs exceeded", 2.5)
            logger.warning("batch %d done", k)
            logger.warning("slow batch %d", k)
    finally:
        logger.removeHandler(handler)
        logger.filters.clear()
    assert seen.count("NMS time limit 2.500s exceeded (set nms_time_limit: null; said once, not per batch)") == 1
    assert sum("NMS time limit" in line for line in seen) == 1
    assert [line for line in seen if line.startswith("batch")] == [f"batch {k} done" for k in range(5)]
    assert [line for line in seen if line.startswith("slow")] == [
        "slow batch 0 (a second prefix, its own filter; said once, not per batch)"]
    assert once.seen == other.seen == 5


# ---------------------------------------------------------------------------------------- the checkpoint's epoch


def test_the_ap_line_of_a_validation_from_a_checkpoint_is_its_epoch_once_per_validation(
        tiny_coco: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dm = _dm(tiny_coco, tmp_path)
    with caplog.at_level(logging.INFO):
        trainer = _trainer(tmp_path, limit_val_batches=0)
        trainer.fit(_Tiny(), datamodule=dm)
        trainer.save_checkpoint(tmp_path / "epoch2.ckpt")
        caplog.clear()
        for _ in range(2):  # two validations of two batches each, the sanity check not printed
            _trainer(tmp_path, num_sanity_val_steps=2).validate(_Tiny(), datamodule=dm, verbose=False,
                                                                ckpt_path=str(tmp_path / "epoch2.ckpt"))
        validated = [r.getMessage() for r in caplog.records if "COCO val segm AP" in r.getMessage()]
        caplog.clear()
        # Resumed: each epoch's validation prints the epoch it ends, not the checkpoint's.
        _trainer(tmp_path, max_epochs=4, num_sanity_val_steps=2).fit(_Tiny(), datamodule=dm,
                                                                      ckpt_path=str(tmp_path / "epoch2.ckpt"))
        resumed = [r.getMessage() for r in caplog.records if "COCO val segm AP" in r.getMessage()]
    assert torch.load(tmp_path / "epoch2.ckpt", weights_only=False)["epoch"] == 2
    assert validated == ["epoch 2: COCO val segm AP 0.0000, bbox AP 0.0000 (no detections)"] * 2
    assert resumed == [f"epoch {e}: COCO val segm AP 0.0000, bbox AP 0.0000 (no detections)" for e in (2, 3)]
