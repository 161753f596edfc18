"""Pictures of the data at fit start (issue 51): the files in the run folder are the batches the model
got, drawn; TensorBoard gets them too; ``plots: false`` writes none and trains bit-identically."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import cv2
import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from seg_datamodule import COCOSegDataModule, DetectionBatch, FitPictures
from seg_datamodule.models import YolactLite
from seg_datamodule.pictures.writer import host_copy
from seg_datamodule.visualize import batch_grid


class _Seen(L.Callback):
    """The training batches as the model got them (host copies)."""

    def __init__(self) -> None:
        self.batches: list[DetectionBatch] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self.batches.append(host_copy(batch, 16))


def _luma_gap(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of two RGB pictures' blurred grey levels (JPEG's loss is in the fine detail)."""
    def luma(x: np.ndarray) -> np.ndarray:
        return cv2.GaussianBlur(cv2.cvtColor(np.asarray(x, np.uint8), cv2.COLOR_RGB2GRAY).astype(np.float32), (5, 5), 0)
    return float(np.abs(luma(a) - luma(b)).mean())


def _fit(coco_mini: Path, root: Path, plots: bool, loggers: list | bool,
         callbacks: tuple[L.Callback, ...] = ()) -> tuple[COCOSegDataModule, _Seen, dict]:
    ann = {s: str(coco_mini / "annotations" / f"instances_{s}2017.json") for s in ("train", "val")}
    dm = COCOSegDataModule(train_ann=ann["train"], train_images=str(coco_mini / "train2017"), val_ann=ann["val"],
                           val_images=str(coco_mini / "val2017"), image_size=128, batch_size=4, num_workers=0,
                           copy_paste=1.0, mixup=0.5, plots=plots, cache_dir=str(root / "cache"))
    torch.manual_seed(0)
    model = YolactLite(num_classes=dm.num_classes, width=8, num_prototypes=8)
    seen = _Seen()
    trainer = L.Trainer(max_steps=4, limit_val_batches=0, num_sanity_val_steps=0, logger=loggers, callbacks=[seen, *callbacks],
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        accelerator="cpu", default_root_dir=root)
    trainer.fit(model, dm)
    return dm, seen, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_a_fit_draws_its_batches_and_labels_and_trains_as_without(coco_mini: Path, tmp_path: Path) -> None:
    # TensorBoard where it is installed (not a dependency: with it, Lightning's default logger changes)
    tensorboard = importlib.util.find_spec("tensorboard") is not None
    loggers = [CSVLogger(tmp_path / "on", name="run")]
    if tensorboard:
        from lightning.pytorch.loggers import TensorBoardLogger

        loggers.append(TensorBoardLogger(tmp_path / "on", name="tb"))
    dm, seen, weights = _fit(coco_mini, tmp_path / "on", True, loggers)
    folder = tmp_path / "on" / "run" / "version_0"
    assert sorted(p.name for p in folder.glob("*.png")) == ["labels_train.png", "labels_val.png"]
    assert sorted(p.name for p in folder.glob("*.jpg")) == [f"train_batch{k}.jpg" for k in range(3)]
    for k in range(3):  # each file is the k-th batch the model got, drawn with class names
        picture = cv2.cvtColor(cv2.imread(str(folder / f"train_batch{k}.jpg")), cv2.COLOR_BGR2RGB)
        expected = batch_grid(seen.batches[k], 16, 4, dm.class_names)
        assert picture.shape == expected.shape
        assert _luma_gap(picture, expected) < 1.5  # JPEG quality 90 (4:4:4): ~0.3 grey levels
        assert np.abs(picture.astype(np.int16) - expected).mean() < 8.0
        assert _luma_gap(picture, batch_grid(seen.batches[(k + 1) % 3], 16, 4, dm.class_names)) > 20  # this one
    assert any(b.origins is not None and (b.origins == 1).any() for b in seen.batches[:3])  # pastes marked
    for name in ("labels_train.png", "labels_val.png"):
        assert cv2.imread(str(folder / name)).std() > 10
    if tensorboard:  # the same pictures in TensorBoard's Images tab
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(tmp_path / "on" / "tb" / "version_0"), size_guidance={"images": 0})
        events.Reload()
        assert {"data/labels_train", "data/labels_val", "data/train_batch0", "data/train_batch2"} <= set(
            events.Tags()["images"])

    # plots off: nothing drawn, the same weights after the same steps (drawing takes no draw of any generator)
    _, _, plain = _fit(coco_mini, tmp_path / "off", False, [CSVLogger(tmp_path / "off", name="run")])
    assert not list((tmp_path / "off").rglob("*.jpg")) and not list((tmp_path / "off").rglob("labels_*.png"))
    assert weights.keys() == plain.keys() and all(torch.equal(weights[k], plain[k]) for k in weights)


@pytest.mark.slow
def test_without_a_logger_nothing_is_drawn_and_a_users_own_callback_is_kept(coco_mini: Path, tmp_path: Path) -> None:
    _fit(coco_mini, tmp_path, True, False)
    assert not list(tmp_path.rglob("*.jpg")) and not list(tmp_path.rglob("labels_*.png"))
    own = FitPictures(batches=1)
    _fit(coco_mini, tmp_path / "own", True, [CSVLogger(tmp_path / "own", name="run")], (own,))
    assert [p.name for p in own.paths] == ["labels_train.png", "labels_val.png", "train_batch0.jpg"]
    with pytest.raises(ValueError, match="batches >= 0 and max_images >= 1"):
        FitPictures(max_images=0)
