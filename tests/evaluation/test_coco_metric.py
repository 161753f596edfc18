"""COCOMaskMAP on real COCO (coco-mini val): perfect ground truth scores 1.0, the stride-4 ceiling,
agreement with torchmetrics' MeanAveragePrecision, de-duplication, and named errors."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from _coco_gt import gt_full_resolution, gt_on_canvas, letterbox_batch, letterboxed, perturbed
from seg_datamodule.evaluation import COCOMaskMAP, NothingScoredError, deduplicate, load_coco
from seg_datamodule.evaluation.coco_eval import STAT_NAMES

CANVAS = 640


@pytest.fixture(scope="module")
def val_ann(coco_mini: Path) -> str:
    return str(coco_mini / "annotations" / "instances_val2017.json")


@pytest.fixture(scope="module")
def coco(val_ann: str) -> COCO:
    return load_coco(val_ann)


def _canvas_batch(coco: COCO, image_ids: list[int]):
    geometry = [letterboxed(coco, i, CANVAS) for i in image_ids]
    return letterbox_batch(
        image_ids, [g[0] for g in geometry], [g[1] for g in geometry], [g[2] for g in geometry], (CANVAS, CANVAS)
    )


def _update_on_canvas(metric: COCOMaskMAP, coco: COCO, image_ids: list[int], make) -> None:
    for start in range(0, len(image_ids), 8):
        ids = image_ids[start : start + 8]
        metric.update([make(i) for i in ids], _canvas_batch(coco, ids))


@pytest.fixture(scope="module")
def imperfect(coco: COCO) -> dict[int, dict[str, torch.Tensor]]:
    """Deterministic imperfect predictions of every val image (made once for the module)."""
    return {i: perturbed(gt_on_canvas(coco, i, CANVAS, 4), len(coco.cats), i) for i in sorted(coco.imgs)}


def test_ground_truth_at_full_resolution_scores_one(val_ann: str, coco: COCO) -> None:
    metric = COCOMaskMAP(val_ann)
    for image_id in sorted(coco.imgs):
        h, w = coco.imgs[image_id]["height"], coco.imgs[image_id]["width"]
        # A canvas equal to the original image: scale 1, no pad.
        batch = letterbox_batch([image_id], [1.0], [(0.0, 0.0)], [(h, w)], (h, w))
        metric.update([gt_full_resolution(coco, image_id)], batch)
    results = metric.compute()
    for iou_type in ("segm", "bbox"):
        for name in ("AP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large", "AR100"):
            assert results[f"{iou_type}_{name}"].item() == pytest.approx(1.0, abs=1e-12), (iou_type, name)


def test_stride4_ground_truth_gives_the_stride4_ceiling(val_ann: str, coco: COCO) -> None:
    metric = COCOMaskMAP(val_ann)
    _update_on_canvas(metric, coco, sorted(coco.imgs), lambda i: gt_on_canvas(coco, i, CANVAS, 4))
    results = {k: v.item() for k, v in metric.compute().items()}
    print("stride-4 ceiling on coco-mini val:", {k: round(v, 4) for k, v in results.items() if "AP" in k})
    # Boxes pass through the letterbox exactly.
    assert results["bbox_AP"] == pytest.approx(1.0, abs=1e-12)
    # Masks lose what a 4 px grid cannot hold; small objects most.
    assert 0.5 < results["segm_AP"] < 1.0
    assert results["segm_AP50"] > results["segm_AP75"] > results["segm_AP"]
    assert results["segm_AP_small"] < results["segm_AP_medium"] < results["segm_AP_large"]


def _torchmetrics_inputs(coco: COCO, metric: COCOMaskMAP) -> tuple[list[dict], list[dict]]:
    """Our metric's detections (decoded back from its RLE) and the file's ground truth, as the
    per-image dicts torchmetrics takes (category ids as labels, crowd and area from the JSON)."""
    dets = deduplicate(metric.detections())
    sizes = {i: (img["height"], img["width"]) for i, img in coco.imgs.items()}
    rles = dets.rles(sizes)
    preds, targets = [], []
    offsets = np.concatenate([[0], np.cumsum(dets.dets_per_image.numpy())])
    for k, image_id in enumerate(dets.image_ids.tolist()):
        lo, hi = offsets[k], offsets[k + 1]
        h, w = sizes[image_id]
        xywh = dets.boxes[lo:hi].double()
        masks = mask_utils.decode(rles[lo:hi]).transpose(2, 0, 1) if hi > lo else np.zeros((0, h, w), np.uint8)
        preds.append({
            "boxes": torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1),
            "scores": dets.scores[lo:hi].double(),
            "labels": dets.category_ids[lo:hi],
            "masks": torch.from_numpy(masks.astype(bool)),
        })
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[image_id]))
        boxes = torch.tensor([[x, y, x + bw, y + bh] for x, y, bw, bh in (a["bbox"] for a in anns)], dtype=torch.float64)
        gt_masks = [coco.annToMask(a).astype(bool) for a in anns]
        targets.append({
            "boxes": boxes.reshape(-1, 4),
            "labels": torch.tensor([a["category_id"] for a in anns], dtype=torch.int64),
            "masks": torch.from_numpy(np.stack(gt_masks)) if anns else torch.zeros(0, h, w, dtype=torch.bool),
            "iscrowd": torch.tensor([a["iscrowd"] for a in anns], dtype=torch.int64),
            "area": torch.tensor([a["area"] for a in anns], dtype=torch.float64),
        })
    return preds, targets


def test_agrees_with_torchmetrics_mean_average_precision(val_ann: str, coco: COCO, imperfect: dict) -> None:
    from torchmetrics.detection import MeanAveragePrecision

    metric = COCOMaskMAP(val_ann)
    _update_on_canvas(metric, coco, sorted(coco.imgs), imperfect.__getitem__)
    ours = {k: v.item() for k, v in metric.compute().items()}
    assert 0.05 < ours["segm_AP"] < 0.9 and 0.05 < ours["bbox_AP"] < 0.9  # a non-trivial score

    # torchmetrics' own float32 linspace thresholds differ from COCO's by ~1e-8; give it COCO's.
    reference = MeanAveragePrecision(
        iou_type=("bbox", "segm"),
        backend="pycocotools",
        iou_thresholds=np.linspace(0.5, 0.95, 10).tolist(),
        rec_thresholds=np.linspace(0.0, 1.00, 101).tolist(),
    )
    preds, targets = _torchmetrics_inputs(coco, metric)
    reference.update(preds, targets)
    theirs = reference.compute()
    names = {"AP": "map", "AP50": "map_50", "AP75": "map_75", "AP_small": "map_small", "AP_medium": "map_medium",
             "AP_large": "map_large", "AR1": "mar_1", "AR10": "mar_10", "AR100": "mar_100",
             "AR_small": "mar_small", "AR_medium": "mar_medium", "AR_large": "mar_large"}
    for iou_type in ("segm", "bbox"):
        for ours_name in STAT_NAMES:
            expected = theirs[f"{iou_type}_{names[ours_name]}"].item()
            assert ours[f"{iou_type}_{ours_name}"] == pytest.approx(expected, abs=1e-6), (iou_type, ours_name)


def test_repeated_images_count_once_and_order_does_not_matter(val_ann: str, coco: COCO, imperfect: dict) -> None:
    image_ids = sorted(coco.imgs)[:12]  # all of them in a smaller file
    make = imperfect.__getitem__
    once = COCOMaskMAP(val_ann)
    _update_on_canvas(once, coco, image_ids, make)
    twice = COCOMaskMAP(val_ann)
    # What a DistributedSampler does to even out ranks: some images come round again.
    _update_on_canvas(twice, coco, image_ids[::-1] + image_ids[:3], make)
    a, b = once.compute(), twice.compute()
    assert a.keys() == b.keys() and all(a[k].item() == b[k].item() for k in a)
    n = len(image_ids)
    assert len(twice.detections().image_ids) == n + 3 and len(deduplicate(twice.detections()).image_ids) == n


def test_images_without_predictions_and_bbox_only(val_ann: str, coco: COCO) -> None:
    image_ids = sorted(coco.imgs)[:4]
    empty = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.int64),
             "masks": torch.zeros(0, CANVAS // 4, CANVAS // 4, dtype=torch.bool)}
    metric = COCOMaskMAP(val_ann)
    _update_on_canvas(metric, coco, image_ids, lambda i: empty)
    results = metric.compute()
    assert results["segm_AP"].item() == 0.0 and results["bbox_AP"].item() == 0.0  # ground truth, all missed

    boxes_only = COCOMaskMAP(val_ann, iou_types=("bbox",))
    _update_on_canvas(boxes_only, coco, image_ids, lambda i: {k: v for k, v in gt_on_canvas(coco, i).items() if k != "masks"})
    results = boxes_only.compute()
    assert set(results) == {f"bbox_{n}" for n in STAT_NAMES} and results["bbox_AP"].item() == pytest.approx(1.0)

    fresh = COCOMaskMAP(val_ann)  # saw no image: no number at all, not AP -1 (issue 35)
    with pytest.warns(UserWarning, match="before the ``update``"), pytest.raises(NothingScoredError,
                                                                                 match="over nothing"):
        fresh.compute()


def test_pickles_without_the_parsed_file(val_ann: str, coco: COCO) -> None:
    metric = COCOMaskMAP(val_ann)
    image_id = sorted(coco.imgs)[0]
    _update_on_canvas(metric, coco, [image_id], lambda i: gt_on_canvas(coco, i))
    data = pickle.dumps(metric)
    assert len(data) < 100_000  # the JSON stays behind
    clone = pickle.loads(data)
    assert clone.compute()["bbox_AP"].item() == metric.compute()["bbox_AP"].item()


def test_bad_input_is_named(val_ann: str, coco: COCO) -> None:
    image_id = sorted(coco.imgs)[0]
    metric = COCOMaskMAP(val_ann)
    batch = _canvas_batch(coco, [image_id])
    good = gt_on_canvas(coco, image_id)
    n = len(good["scores"])

    def fails(pred: dict, error: type, match: str, the_batch=batch) -> None:
        with pytest.raises(error, match=match):
            metric.update([pred], the_batch)

    fails(good | {"scores": torch.full((n,), float("nan"))}, ValueError, rf"scores.*image id {image_id}.*NaN")
    fails(good | {"labels": torch.full((n,), 80)}, ValueError, r"labels.*in \[0, 79\], got 80")
    fails(good | {"labels": torch.full((n,), -1)}, ValueError, r"labels.*got -1")
    fails(good | {"boxes": good["boxes"][:, :3]}, ValueError, r"boxes.*must be \(N, 4\)")
    fails(good | {"boxes": good["boxes"][:, [2, 1, 0, 3]]}, ValueError, r"boxes.*x2 >= x1")
    fails(good | {"scores": good["scores"][:-1]}, ValueError, r"scores and labels of shape")
    fails(good | {"masks": good["masks"][:, :-1]}, ValueError, r"must be the canvas \(640, 640\) or its stride-4 grid \(160, 160\)")
    fails({k: v for k, v in good.items() if k != "masks"}, KeyError, r"exactly one of 'masks'")
    fails(good | {"mask_logits": good["masks"].float()}, KeyError, r"exactly one of 'masks'")
    fails(good | {"labels": good["labels"].float()}, TypeError, r"labels.*integer")
    unknown = _canvas_batch(coco, [image_id])
    unknown.image_ids[:] = 999_999_999
    fails(good, ValueError, r"image id 999999999 is not in .*instances_val2017.json", unknown)
    wrong_size = _canvas_batch(coco, [image_id])
    wrong_size.orig_sizes[:] = torch.tensor([10, 10])
    fails(good, ValueError, rf"image id {image_id}: orig_size \(10, 10\) differs", wrong_size)
    with pytest.raises(ValueError, match="preds has 2 entries but the batch has 1 images"):
        metric.update([good, good], batch)
    with pytest.raises(TypeError, match="batch must be a DetectionBatch"):
        metric.update([good], {"image_ids": batch.image_ids})
    assert metric.update_count == 0 or len(metric.detections().image_ids) == 0  # nothing half-added

    with pytest.raises(FileNotFoundError, match="ann_file"):
        COCOMaskMAP("/nonexistent/instances.json")
    with pytest.raises(ValueError, match="iou_types"):
        COCOMaskMAP(val_ann, iou_types=("keypoints",))
    with pytest.raises(ValueError, match="mask_threshold"):
        COCOMaskMAP(val_ann, mask_threshold=1.0)
    with pytest.raises(ValueError, match=r"category_ids \[12345\]"):
        COCOMaskMAP(val_ann, category_ids=[1, 12345]).coco


def test_faster_coco_eval_backend_gives_the_same_numbers(val_ann: str, coco: COCO, imperfect: dict) -> None:
    pytest.importorskip("faster_coco_eval")
    reference = COCOMaskMAP(val_ann, backend="pycocotools")
    fast = COCOMaskMAP(val_ann, backend="faster_coco_eval")
    assert COCOMaskMAP(val_ann).backend == "faster_coco_eval"  # "auto" takes it when installed
    for metric in (reference, fast):
        _update_on_canvas(metric, coco, sorted(coco.imgs), imperfect.__getitem__)
    reference, fast = reference.compute(), fast.compute()
    for key in reference:
        assert fast[key].item() == pytest.approx(reference[key].item(), abs=1e-6), key


def test_unknown_backend_is_named(val_ann: str) -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        COCOMaskMAP(val_ann, backend="detectron2")


@pytest.mark.needs("cuda")
def test_cuda_predictions_and_metric_give_the_cpu_numbers(val_ann: str, coco: COCO, imperfect: dict) -> None:
    image_ids = sorted(coco.imgs)[:16]
    on_cpu, on_gpu = COCOMaskMAP(val_ann), COCOMaskMAP(val_ann).to("cuda")
    _update_on_canvas(on_cpu, coco, image_ids, imperfect.__getitem__)
    for start in range(0, len(image_ids), 8):
        ids = image_ids[start : start + 8]
        preds = [{k: v.cuda() for k, v in imperfect[i].items()} for i in ids]
        on_gpu.update(preds, _canvas_batch(coco, ids).to("cuda"))
    cpu, gpu = on_cpu.compute(), on_gpu.compute()
    assert all(gpu[k].device.type == "cuda" and gpu[k].item() == cpu[k].item() for k in cpu)
