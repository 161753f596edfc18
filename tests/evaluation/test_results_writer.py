"""COCOResultsWriter and the results entries: a file pycocotools reads, scoring as COCOMaskMAP does."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from _coco_gt import gt_on_canvas, letterbox_batch, letterboxed, perturbed
from seg_datamodule.data.samples.predict import empty_batch
from seg_datamodule.evaluation import STAT_NAMES, COCOMaskMAP, COCOResultsWriter, CocoDetections, detections_to_results

CANVAS = 640


class _Strategy:
    def barrier(self, name: str | None = None) -> None:
        pass


def _trainer(datamodule: object = None) -> SimpleNamespace:
    """What the writer reads of a Trainer in one process."""
    return SimpleNamespace(world_size=1, global_rank=0, strategy=_Strategy(), datamodule=datamodule)


def _batches(coco: COCO, image_ids: list[int], batch_size: int = 4):
    num_classes = len(coco.cats)
    for start in range(0, len(image_ids), batch_size):
        ids = image_ids[start : start + batch_size]
        geometry = [letterboxed(coco, i, CANVAS) for i in ids]
        batch = letterbox_batch(ids, [g[0] for g in geometry], [g[1] for g in geometry], [g[2] for g in geometry],
                                (CANVAS, CANVAS))
        yield [perturbed(gt_on_canvas(coco, i, CANVAS, 4), num_classes, i) for i in ids], batch


def _quiet(fn, *args):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args)


def _cocoeval(coco: COCO, results: list[dict], iou_type: str, image_ids: list[int]) -> dict[str, float]:
    res = _quiet(coco.loadRes, copy.deepcopy(results))
    evaluator = _quiet(COCOeval, coco, res, iou_type)
    evaluator.params.imgIds = image_ids
    _quiet(evaluator.evaluate)
    _quiet(evaluator.accumulate)
    _quiet(evaluator.summarize)
    return {f"{iou_type}_{name}": float(v) for name, v in zip(STAT_NAMES, evaluator.stats)}


def _run_writer(writer: COCOResultsWriter, batches, trainer=None) -> None:
    trainer = trainer or _trainer()
    writer.on_predict_start(trainer, None)
    for k, (preds, batch) in enumerate(batches):
        writer.write_on_batch_end(trainer, None, preds, None, batch, k)
    writer.on_predict_epoch_end(trainer, None)


@pytest.mark.slow
def test_round_trip_equals_coco_mask_map(coco_mini: Path, tmp_path: Path) -> None:
    val_ann = str(coco_mini / "annotations" / "instances_val2017.json")
    coco = _quiet(COCO, val_ann)
    image_ids = sorted(coco.imgs)
    metric = COCOMaskMAP(val_ann, backend="pycocotools")
    batches = list(_batches(coco, image_ids))
    for preds, batch in batches:
        metric.update(preds, batch)
    expected = {k: v.item() for k, v in metric.compute().items()}

    writer = COCOResultsWriter(str(tmp_path / "out" / "results.json"), max_per_image=None,
                               category_ids=sorted(coco.cats))
    _run_writer(writer, batches)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert len(results) == metric.detections().scores.numel() and all(isinstance(r["segmentation"]["counts"], str)
                                                                       for r in results)
    bbox = _cocoeval(coco, results, "bbox", image_ids)
    # segm as Detectron2 scores it: without the bbox, so a result's area is its mask's.
    segm = _cocoeval(coco, [{k: v for k, v in r.items() if k != "bbox"} for r in results], "segm", image_ids)
    for key, value in {**bbox, **segm}.items():
        assert value == pytest.approx(expected[key], abs=1e-6), key
    # Plain loadRes (area from the bbox) moves detections between area ranges only.
    plain = _cocoeval(coco, results, "segm", image_ids)
    for name in ("AP", "AP50", "AP75"):
        assert plain[f"segm_{name}"] == pytest.approx(expected[f"segm_{name}"], abs=1e-6)
    info = json.loads((tmp_path / "out" / "results_images.json").read_text())
    assert info["info"]["images_predicted"] == len(image_ids) and info["info"]["detections"] == len(results)
    assert [i["id"] for i in info["images"]] == image_ids
    assert all((i["height"], i["width"]) == (coco.imgs[i["id"]]["height"], coco.imgs[i["id"]]["width"])
               for i in info["images"])


def _dets(scores_per_image: list[list[float]], image_ids: list[int]) -> CocoDetections:
    scores = torch.tensor([s for per in scores_per_image for s in per], dtype=torch.float32)
    n = scores.numel()
    return CocoDetections(
        image_ids=torch.tensor(image_ids), dets_per_image=torch.tensor([len(p) for p in scores_per_image]),
        category_ids=torch.arange(n) + 10, scores=scores, boxes=torch.arange(4 * n, dtype=torch.float32).reshape(n, 4),
        rle_lengths=torch.zeros(n, dtype=torch.int64), rle_bytes=torch.zeros(0, dtype=torch.uint8),
    )


def test_threshold_and_cap_keep_the_best_per_image() -> None:
    dets = _dets([[0.2, 0.9, 0.5, 0.9], [0.1], []], [5, 6, 7])
    results = detections_to_results(dets, {5: (9, 9), 6: (9, 9), 7: (9, 9)}, score_threshold=0.3, max_per_image=2)
    # Image 5: 0.9 (index 1) and 0.9 (index 3) in their order, 0.5 cut by the cap; 0.2 and 0.1 below the threshold.
    assert [(r["image_id"], r["category_id"], r["score"]) for r in results] == [
        (5, 11, pytest.approx(0.9)), (5, 13, pytest.approx(0.9))]
    assert results[0]["bbox"] == [4.0, 5.0, 6.0, 7.0] and "segmentation" not in results[0]
    assert detections_to_results(_dets([[]], [1]), {1: (2, 2)}) == []
    with pytest.raises(ValueError, match="max_per_image"):
        COCOResultsWriter(max_per_image=0)


def test_empty_batches_repeats_and_counts(tmp_path: Path) -> None:
    """A batch of only bad images, an image coming through twice, and a prediction of the wrong type."""
    writer = COCOResultsWriter(str(tmp_path / "r.json"), category_ids=[1, 2])
    bad = empty_batch(64, 4, {"predicted": 0, "image_corrupt": 2, "image_missing": 0})
    batch = letterbox_batch([3, 4], [0.1, 0.1], [(0.0, 0.0)] * 2, [(64, 64), (32, 64)], (64, 64))
    preds = [{"boxes": torch.tensor([[1.0, 1.0, 9.0, 9.0]]), "scores": torch.tensor([0.7]),
              "labels": torch.tensor([1]), "masks": torch.ones(1, 16, 16, dtype=torch.bool)},
             {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.int64),
              "masks": torch.zeros(0, 16, 16, dtype=torch.bool)}]
    repeat = letterbox_batch([3], [0.1], [(0.0, 0.0)], [(64, 64)], (64, 64))
    _run_writer(writer, [([], bad), (preds, batch), (preds[:1], repeat)])
    results = json.loads((tmp_path / "r.json").read_text())
    assert len(results) == 1 and results[0]["image_id"] == 3 and results[0]["category_id"] == 2
    assert results[0]["segmentation"]["size"] == [64, 64]
    info = json.loads((tmp_path / "r_images.json").read_text())["info"]
    assert info["images_predicted"] == 2 and info["images_skipped"] == {"image_corrupt": 2}
    with pytest.raises(TypeError, match="CocoDetections or one dict"):
        writer.write_on_batch_end(_trainer(), None, torch.zeros(3), None, batch, 0)
    # The mask is all on: its RLE covers the 64 x 64 image (boxes clipped to it, in pixels).
    from pycocotools import mask as mask_utils

    assert mask_utils.area(results[0]["segmentation"]) == 64 * 64
    assert np.allclose(results[0]["bbox"], [10.0, 10.0, 64.0 - 10.0, 64.0 - 10.0])


def test_merge_keeps_each_image_once(tmp_path: Path) -> None:
    """Rank shards that share an image (a padded repeat): its first occurrence's results only."""
    writer = COCOResultsWriter(str(tmp_path / "r.json"), category_ids=[1])
    entry = {"category_id": 1, "bbox": [0.0, 0.0, 1.0, 1.0]}
    shards = [
        {"results": [dict(entry, image_id=1, score=0.5), dict(entry, image_id=2, score=0.4)],
         "images": [[1, 4, 4], [2, 4, 4]], "skipped": {"image_corrupt": 1}},
        {"results": [dict(entry, image_id=2, score=0.9), dict(entry, image_id=3, score=0.3)],
         "images": [[2, 4, 4], [3, 5, 6]], "skipped": {"image_corrupt": 2, "image_missing": 1}},
    ]
    writer._write(_trainer(), shards)
    results = json.loads((tmp_path / "r.json").read_text())
    assert [(r["image_id"], r["score"]) for r in results] == [(1, 0.5), (2, 0.4), (3, 0.3)]
    info = json.loads((tmp_path / "r_images.json").read_text())
    assert info["images"] == [{"id": 1, "height": 4, "width": 4}, {"id": 2, "height": 4, "width": 4},
                              {"id": 3, "height": 5, "width": 6}]
    assert info["info"]["images_skipped"] == {"image_corrupt": 3, "image_missing": 1}


@pytest.mark.slow
def test_two_ddp_processes_write_each_image_once(tmp_path: Path, demo_dir: Path) -> None:
    import cv2
    import lightning as L

    from seg_datamodule import COCOSegDataModule
    from seg_datamodule.io.predict_source import stable_image_id
    from seg_datamodule.models import YolactLite

    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    names = [f"img{k}.png" for k in range(7)]  # odd: 4 images on rank 0, 3 on rank 1
    for k, name in enumerate(names):
        cv2.imwrite(str(folder / name), rng.integers(0, 255, (20 + k, 30, 3), dtype=np.uint8))
    # a folder names no categories: the demo's training split does
    dm = COCOSegDataModule(predict_images=str(folder), image_size=64, val_batch_size=2, num_workers=0,
                           train_ann=str(demo_dir / "annotations" / "instances_train2017.json"),
                           train_images=str(demo_dir / "train2017"), cache_dir=str(tmp_path / "cache"))
    model = YolactLite(num_classes=dm.num_classes, width=4, num_prototypes=4)
    out = tmp_path / "out" / "results.json"
    trainer = L.Trainer(accelerator="cpu", strategy="ddp_spawn", devices=2, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[COCOResultsWriter(str(out))])
    trainer.predict(model, datamodule=dm, return_predictions=False)
    results = json.loads(out.read_text())
    images = json.loads((tmp_path / "out" / "results_images.json").read_text())
    expected = sorted(stable_image_id(n) for n in names)
    assert sorted(r["image_id"] for r in results) == expected  # one whole-image detection per image, once
    assert [i["id"] for i in images["images"]] == expected and images["info"]["images_predicted"] == 7
    assert {i["file_name"] for i in images["images"]} == set(names)
    assert sorted(p.name for p in out.parent.iterdir()) == ["results.json", "results_images.json"]  # shards removed
