"""Validation pictures and end-of-fit results (issue 51): the confusion matrix counted by hand, the PR
curve from COCOeval's own table, predictions drawn back where the ground truth is, and a fit that
leaves every picture in its run folder."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from pathlib import Path

import cv2
import lightning as L
import numpy as np
import pytest
from lightning.pytorch.loggers import CSVLogger
from pycocotools.coco import COCO

from seg_datamodule import COCOSegDataModule
from seg_datamodule.evaluation import evaluate_detections
from seg_datamodule.evaluation.coco_eval import load_coco
from seg_datamodule.evaluation.predictions import CocoDetections
from seg_datamodule.models import YolactLite
from seg_datamodule.pictures import ValPictures, canvas_predictions, confusion_matrix, figure_rgb, pr_figure
from seg_datamodule.pictures.writer import host_copy


def _box(x: float, y: float, w: float, h: float, category: int, score: float | None = None, crowd: int = 0) -> dict:
    entry = {"bbox": [x, y, w, h], "category_id": category, "iscrowd": crowd}
    return entry if score is None else {**entry, "score": score}


def test_the_confusion_matrix_counts_by_hand() -> None:
    truth = {1: [_box(0, 0, 10, 10, 7), _box(50, 50, 10, 10, 8), _box(100, 0, 40, 40, 7, crowd=1)],
             2: [_box(0, 0, 20, 20, 8)]}
    detections = {
        1: [_box(0, 0, 10, 10, 7, 0.9),     # matches its cat-7 truth: (7, 7)
            _box(51, 51, 10, 10, 7, 0.8),   # matches the cat-8 truth as a 7: (8, 7)
            _box(0, 0, 10, 10, 8, 0.7),     # its truth is taken: a detection of nothing, (bg, 8)
            _box(200, 200, 5, 5, 8, 0.1),   # below conf 0.25: left out
            _box(105, 5, 10, 10, 8, 0.9)],  # inside the crowd region: not counted
        # image 2: no detection; its cat-8 truth is missed, (8, bg)
    }
    matrix = confusion_matrix(truth, detections, [7, 8])
    assert matrix.tolist() == [[1, 0, 0], [1, 0, 1], [0, 1, 0]]  # [true, predicted], background last


def test_the_pr_curve_is_cocoevals_table(tmp_path: Path) -> None:
    # one image, one cat-7 truth, detections at 0.9 (a hit) and 0.8 (a miss): AP50 = 1.0 at every recall
    coco = {"images": [{"id": 1, "width": 100, "height": 100, "file_name": "a.jpg"}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 7, "bbox": [0, 0, 10, 10], "area": 100,
                             "iscrowd": 0, "segmentation": [[0, 0, 10, 0, 10, 10, 0, 10]]}],
            "categories": [{"id": 7, "name": "cat"}]}
    (tmp_path / "gt.json").write_text(json.dumps(coco))
    dets = CocoDetections(image_ids=np.array([1]), dets_per_image=np.array([2]), category_ids=np.array([7, 7]),
                          scores=np.array([0.9, 0.8], np.float32), boxes=np.array([[0, 0, 10, 10], [50, 50, 9, 9]],
                                                                                 np.float32),
                          rle_lengths=np.zeros(2, np.int64), rle_bytes=np.zeros(0, np.uint8))
    import torch

    dets = CocoDetections(**{k: torch.as_tensor(v) for k, v in vars(dets).items()})
    curves: dict[str, np.ndarray] = {}
    results = evaluate_detections(load_coco(tmp_path / "gt.json"), dets, ["bbox"], curves=curves)
    assert results["bbox_AP50"] == pytest.approx(1.0)
    precision = curves["bbox"]
    assert precision.shape == (10, 101, 1, 4, 3) and np.allclose(precision[0, :, 0, 0, -1], 1.0)
    assert figure_rgb(pr_figure(precision, ["cat"], "box")).std() > 10


@pytest.mark.slow
def test_predictions_are_drawn_where_their_objects_are(coco_mini: Path, tmp_path: Path) -> None:
    ann = coco_mini / "annotations" / "instances_val2017.json"
    dm = COCOSegDataModule(train_ann=str(ann), train_images=str(coco_mini / "val2017"), val_ann=str(ann),
                           val_images=str(coco_mini / "val2017"), image_size=256, val_batch_size=4, num_workers=0,
                           cache_dir=str(tmp_path / "cache"))
    dm.setup("validate")
    batch = host_copy(next(iter(dm.val_dataloader())), 4)
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(ann))
    # the ground truth itself as results: drawn back on the canvas, it covers the batch's own masks
    results = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0,
                "segmentation": gt.annToRLE(a)} for i in batch.image_ids.tolist() for a in gt.imgToAnns[i]
               if not a["iscrowd"]]
    names = {c["id"]: c["name"] for c in gt.dataset["categories"]}
    drawn = canvas_predictions(batch, results, names, 0.25)
    plain = canvas_predictions(batch, [], names, 0.25)
    changed = (drawn != plain).any(axis=2)
    size = batch.images.shape[-1]
    for i in range(len(batch)):
        own = batch.split_masks()[i].numpy().any(axis=0)
        union = np.repeat(np.repeat(own, 4, 0), 4, 1)[:size, :size]
        tile = changed[(i // 4) * size : (i // 4 + 1) * size, (i % 4) * size : (i % 4 + 1) * size]
        assert (tile & union).sum() >= 0.9 * union.sum()  # every object coloured
        boxes = np.zeros_like(union)
        first = int(batch.boxes_per_image[:i].sum())
        for k in range(first, first + int(batch.boxes_per_image[i])):
            x0, y0, x1, y1 = (int(round(v)) for v in batch.boxes[k].tolist())
            boxes[max(y0 - 3, 0) : y1 + 3, max(x0 - 3, 0) : x1 + 3] = True
            text = f"{names[dm.category_ids[int(batch.labels[k])]]} 1.00"  # its label's band
            (width, _), _ = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, 0.35, 1)
            boxes[max(y0, 0) : y0 + 14, max(x0, 0) : x0 + width + 6] = True
        assert not (tile & ~boxes).any()  # and nothing drawn away from them and their labels


@pytest.mark.slow
def test_a_fit_with_validation_leaves_its_results_pictures(coco_mini: Path, tmp_path: Path) -> None:
    ann = {s: str(coco_mini / "annotations" / f"instances_{s}2017.json") for s in ("train", "val")}
    dm = COCOSegDataModule(train_ann=ann["train"], train_images=str(coco_mini / "train2017"), val_ann=ann["val"],
                           val_images=str(coco_mini / "val2017"), image_size=128, batch_size=4, val_batch_size=4,
                           num_workers=0, cache_dir=str(tmp_path / "cache"))
    model = YolactLite(num_classes=dm.num_classes, width=8, num_prototypes=8)
    trainer = L.Trainer(max_epochs=2, limit_train_batches=3, limit_val_batches=2, num_sanity_val_steps=1,
                        log_every_n_steps=1, logger=CSVLogger(tmp_path, name="run"), enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, accelerator="cpu")
    trainer.fit(model, dm)
    folder = tmp_path / "run" / "version_0"
    val = next(c for c in trainer.callbacks if isinstance(c, ValPictures))
    expected = {"val_batch0_labels.jpg", "val_batch0_pred.jpg", "results.png", "MaskPR_curve.png", "BoxPR_curve.png",
                "confusion_matrix.png"}
    assert {p.name for p in val.paths} == expected
    for name in expected:
        assert cv2.imread(str(folder / name)).std() > 5, name
    # results.png's series are what the logger got: each validation once (not the sanity check)
    with open(folder / "metrics.csv", newline="") as f:
        logged = [float(r["val/segm_AP"]) for r in csv.DictReader(f) if r.get("val/segm_AP")]
    assert [v for _, v in val.series["val/segm_AP"]] == pytest.approx(logged) and len(logged) == 2
    assert [e for e, _ in val.series["val/segm_AP"]] == [0, 1] and len(val.series["train/loss"]) >= 5
