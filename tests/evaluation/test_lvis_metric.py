"""LVISMaskMAP: federated LVIS AP against the official ``lvis`` package, a hand-computed case, and
the federated rules (unverified categories ignored, not-exhaustive ones not penalised)."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from seg_datamodule.evaluation import COCOMaskMAP, LVISMaskMAP, NothingScoredError, deduplicate
from seg_datamodule.evaluation.lvis_eval import LVIS_STAT_NAMES, LVISFileError
from _coco_gt import letterbox_batch
from _lvis import LVIS_VAL_100, load_json, gt_predictions

_OFFICIAL_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "APr", "APc", "APf",
                   "AR@300", "ARs@300", "ARm@300", "ARl@300")


@pytest.fixture(scope="module")
def data() -> dict:
    return load_json()


def _full_res_batch(img: dict):
    h, w = img["height"], img["width"]
    return letterbox_batch([img["id"]], [1.0], [(0.0, 0.0)], [(h, w)], (h, w))


def _imperfect(data: dict, img: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Shifted ground truth with some wrong labels, plus boxes of random categories (mostly not
    verified in the image), of its negative and of its not-exhaustive categories."""
    cats = sorted(c["id"] for c in data["categories"])
    p = gt_predictions(data, img["id"])
    n, (h, w) = len(p["scores"]), (img["height"], img["width"])
    masks = torch.roll(p["masks"], shifts=int(torch.randint(0, 6, (1,), generator=gen)), dims=2)
    labels = p["labels"].clone()
    wrong = torch.rand(n, generator=gen) < 0.2
    labels[wrong] = torch.randint(0, len(cats), (int(wrong.sum()),), generator=gen)
    extra = [int(x) for x in torch.randint(0, len(cats), (3,), generator=gen)]
    extra += [cats.index(c) for c in img["neg_category_ids"][:2] + img["not_exhaustive_category_ids"][:2]]
    xy = torch.rand(len(extra), 2, generator=gen) * torch.tensor([w * 0.6, h * 0.6])
    boxes_extra = torch.cat([xy, xy + torch.rand(len(extra), 2, generator=gen) * torch.tensor([w * 0.3, h * 0.3]) + 4], 1)
    masks_extra = torch.zeros(len(extra), h, w, dtype=torch.bool)
    for j, (x0, y0, x1, y1) in enumerate(boxes_extra.round().long().tolist()):
        masks_extra[j, y0:y1, x0:x1] = True
    jitter = p["boxes"] + torch.randn(n, 4, generator=gen, dtype=torch.float64) * 2
    jitter = torch.cat([torch.minimum(jitter[:, :2], jitter[:, 2:]), torch.maximum(jitter[:, :2], jitter[:, 2:])], 1)
    return {"boxes": torch.cat([jitter, boxes_extra.double()]), "scores": torch.rand(n + len(extra), generator=gen),
            "labels": torch.cat([labels, torch.tensor(extra, dtype=torch.int64)]),
            "masks": torch.cat([masks, masks_extra])}


def _official(metric: LVISMaskMAP, iou_type: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """The lvis package's LVISEval on the metric's own detections (as Detectron2 hands them over:
    segm results without a bbox)."""
    import lvis

    monkeypatch.setattr(np, "float", float, raising=False)  # lvis 0.5.3 still calls np.float
    dets = deduplicate(metric.detections())
    det_image = np.repeat(dets.image_ids.numpy(), dets.dets_per_image.numpy())
    rles = dets.rles(metric.coco.sizes)
    results = []
    for k in range(len(det_image)):
        r = {"image_id": int(det_image[k]), "category_id": int(dets.category_ids[k]), "score": float(dets.scores[k])}
        if iou_type == "segm":
            r["segmentation"] = rles[k]
        else:
            r["bbox"] = dets.boxes[k].double().tolist()
        results.append(r)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # its logger.warn calls
        gt = lvis.LVIS(str(LVIS_VAL_100))
        evaluator = lvis.LVISEval(gt, lvis.LVISResults(gt, results), iou_type)
        evaluator.params.img_ids = sorted(set(det_image.tolist()))
        evaluator.run()
    return {name: float(evaluator.get_results()[official]) for name, official in zip(LVIS_STAT_NAMES, _OFFICIAL_NAMES)}


@pytest.mark.slow
@pytest.mark.needs("lvis")
def test_equals_the_official_lvis_eval(data: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    metric = LVISMaskMAP(LVIS_VAL_100)
    gen = torch.Generator().manual_seed(0)
    for img in data["images"][:60]:
        metric.update([_imperfect(data, img, gen)], _full_res_batch(img))
    ours = {k: float(v) for k, v in metric.compute().items()}
    assert 0.2 < ours["segm_AP"] < 0.9 and ours["segm_APr"] != -1 and ours["segm_APf"] != -1
    for iou_type in ("segm", "bbox"):
        ref = _official(metric, iou_type, monkeypatch)
        for name in LVIS_STAT_NAMES:
            assert ours[f"{iou_type}_{name}"] == pytest.approx(ref[name], abs=1e-6), (iou_type, name)


def test_ground_truth_scores_one_and_unverified_detections_are_ignored(data: dict) -> None:
    cats = sorted(c["id"] for c in data["categories"])
    plain, federated = LVISMaskMAP(LVIS_VAL_100), LVISMaskMAP(LVIS_VAL_100)
    images = data["images"][:12]
    for img in images:
        p = gt_predictions(data, img["id"])
        plain.update([p], _full_res_batch(img))
        # The best-scored detection of the image: a category nobody checked there.
        present = {a["category_id"] for a in data["annotations"] if a["image_id"] == img["id"]}
        unchecked = next(c for c in cats if c not in present and c not in img["neg_category_ids"])
        h, w = img["height"], img["width"]
        federated.update([{
            "boxes": torch.cat([torch.tensor([[0.0, 0.0, w / 2, h / 2]], dtype=torch.float64), p["boxes"]]),
            "scores": torch.cat([torch.tensor([2.0]), p["scores"]]),
            "labels": torch.cat([torch.tensor([cats.index(unchecked)]), p["labels"]]),
            "masks": torch.cat([torch.ones(1, h, w, dtype=torch.bool), p["masks"]]),
        }], _full_res_batch(img))
    for metric in (plain, federated):
        results = metric.compute()
        for key in ("segm_AP", "segm_AP50", "segm_AP75", "bbox_AP", "segm_APf", "segm_APc"):
            assert float(results[key]) == pytest.approx(1.0), key
        assert float(results["segm_APr"]) in (pytest.approx(1.0), -1.0)


def _tiny_lvis(tmp_path: Path, not_exhaustive: list[int]) -> Path:
    """Two 100 x 100 images; category 1 (rare) has two boxes in image 10; category 2 (frequent)
    is verified absent from image 10; category 3 (common) is checked nowhere."""
    def box(aid, x, y):
        return {"id": aid, "image_id": 10, "category_id": 1, "bbox": [x, y, 20, 20], "area": 400.0,
                "segmentation": [[x, y, x + 20, y, x + 20, y + 20, x, y + 20]]}
    data = {
        "images": [{"id": 10, "height": 100, "width": 100, "coco_url": "http://h/val2017/10.jpg",
                    "neg_category_ids": [2], "not_exhaustive_category_ids": not_exhaustive},
                   {"id": 11, "height": 100, "width": 100, "coco_url": "http://h/val2017/11.jpg",
                    "neg_category_ids": [], "not_exhaustive_category_ids": []}],
        "annotations": [box(1, 10, 10), box(2, 60, 60)],
        "categories": [{"id": 1, "name": "a", "frequency": "r"}, {"id": 2, "name": "b", "frequency": "f"},
                       {"id": 3, "name": "c", "frequency": "c"}],
    }
    path = tmp_path / f"tiny{len(not_exhaustive)}.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("not_exhaustive", "want"), [
    # TP (0.9), FP (0.8), TP (0.7): precision 1, 1/2, 2/3 at recall 1/2, 1/2, 1; interpolated
    # 1 up to recall 0.50 (51 of the 101 points) and 2/3 above (50 points).
    ([], (51 + 50 * 2 / 3) / 101),
    # Category 1 not exhaustively annotated in image 10: its unmatched detection is ignored.
    ([1], 1.0),
])
def test_a_hand_computed_case(tmp_path: Path, not_exhaustive: list[int], want: float) -> None:
    metric = LVISMaskMAP(_tiny_lvis(tmp_path, not_exhaustive), iou_types=("bbox",))
    boxes = torch.tensor([[10, 10, 30, 30], [40, 10, 60, 30], [60, 60, 80, 80],
                          [0, 0, 50, 50], [0, 0, 90, 90]], dtype=torch.float64)
    preds = {"boxes": boxes, "scores": torch.tensor([0.9, 0.8, 0.7, 0.95, 0.99]),
             # labels are positions of the sorted ids: category 1 -> 0, 2 -> 1, 3 -> 2
             "labels": torch.tensor([0, 0, 0, 1, 2])}
    batch = letterbox_batch([10, 11], [1.0, 1.0], [(0.0, 0.0)] * 2, [(100, 100)] * 2, (100, 100))
    metric.update([preds, {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.int64)}],
                  batch)
    results = {k: float(v) for k, v in metric.compute().items()}
    # Category 2's detection is an FP of a verified-absent category with no ground truth anywhere
    # (no AP of its own); category 3's is dropped (nobody checked it). Only category 1 is scored.
    assert results["bbox_AP"] == pytest.approx(want, abs=1e-6)
    assert results["bbox_APr"] == pytest.approx(want, abs=1e-6)
    assert results["bbox_APc"] == -1.0 and results["bbox_APf"] == -1.0
    assert results["bbox_AR"] == pytest.approx(1.0)


def test_max_detections_keeps_the_best_per_image(tmp_path: Path) -> None:
    metric = LVISMaskMAP(_tiny_lvis(tmp_path, []), iou_types=("bbox",), max_detections=2)
    boxes = torch.tensor([[10, 10, 30, 30], [40, 10, 60, 30], [60, 60, 80, 80]], dtype=torch.float64)
    preds = {"boxes": boxes, "scores": torch.tensor([0.9, 0.8, 0.7]), "labels": torch.tensor([0, 0, 0])}
    metric.update([preds], letterbox_batch([10], [1.0], [(0.0, 0.0)], [(100, 100)], (100, 100)))
    results = metric.compute()
    assert float(results["bbox_AR"]) == pytest.approx(0.5)  # the third (a TP) is cut
    assert float(results["bbox_AP"]) == pytest.approx(51 / 101, abs=1e-6)


def test_nothing_to_score(tmp_path: Path) -> None:
    metric = LVISMaskMAP(_tiny_lvis(tmp_path, []), iou_types=("bbox",))
    with pytest.warns(UserWarning, match="before the ``update`` method"), pytest.raises(NothingScoredError):
        metric.compute()  # no image updated: no number at all (issue 35)
    empty = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.int64)}
    metric.update([empty], letterbox_batch([10], [1.0], [(0.0, 0.0)], [(100, 100)], (100, 100)))
    results = metric.compute()
    assert float(results["bbox_AP"]) == 0.0 and float(results["bbox_APf"]) == -1.0


def test_the_wrong_metric_for_the_file_is_named(tmp_path: Path, coco_mini: Path) -> None:
    coco_metric = COCOMaskMAP(LVIS_VAL_100)
    with pytest.raises(LVISFileError, match="use seg_datamodule.evaluation.LVISMaskMAP"):
        coco_metric.category_ids  # noqa: B018
    assert issubclass(LVISFileError, ValueError)
    with pytest.raises(ValueError, match="not an LVIS file .*COCOMaskMAP"):
        LVISMaskMAP(coco_mini / "annotations" / "instances_val2017.json").category_ids  # noqa: B018


def test_pickles_without_the_parsed_file(data: dict) -> None:
    metric = LVISMaskMAP(LVIS_VAL_100)
    img = data["images"][0]
    metric.update([gt_predictions(data, img["id"])], _full_res_batch(img))
    copy = pickle.loads(pickle.dumps(metric))
    assert copy._coco is None and copy.max_detections == 300
    assert float(copy.compute()["segm_AP"]) == pytest.approx(float(metric.compute()["segm_AP"]))
