"""Federated LVIS AP of :class:`CocoDetections` against an LVIS annotation file (LVISEval's algorithm).

A port of the official ``lvis`` package's ``LVISEval`` (github.com/lvis-dataset/lvis-api,
``lvis/eval.py``): the PyPI release (0.5.3) calls ``np.float`` in ``accumulate``, which numpy >= 1.24
no longer has, and pulls in ``opencv-python`` beside our headless build, so the package is not a
dependency; the tests hold this module against it (patched) to 1e-6. What makes LVIS AP federated:

* a detection of a category neither annotated in its image nor in the image's
  ``neg_category_ids`` is dropped (nobody checked whether it is there);
* an unmatched detection of a category in the image's ``not_exhaustive_category_ids`` is ignored;
* at most 300 detections per image (the highest scores), over all categories;
* AP is averaged over categories, and also per frequency group (``r``, ``c``, ``f``: APr, APc, APf).

As ``LVISEval`` with ``iou_type="segm"`` given results without a ``bbox`` (Detectron2 does so),
a detection's area is its mask area for segm and its box area for bbox. Matching, the 101-point
interpolated precision and the summaries follow the official code step by step; one difference:
a ground-truth annotation with id 0 counts as matchable here (the official code stores ids as match
flags, so such an annotation would never match; LVIS ids start at 1). Evaluation covers the images
that were predicted on.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np
from pycocotools import mask as mask_utils

from seg_datamodule.errors import UserInputError
from seg_datamodule.evaluation.coco_eval import checked_request
from seg_datamodule.evaluation.predictions import CocoDetections
from seg_datamodule.evaluation.safe_rle import evaluable_segmentation

__all__ = ["LVIS_STAT_NAMES", "LVISFileError", "LVISGroundTruth", "evaluate_lvis", "is_lvis_dataset", "load_lvis"]

#: What ``LVISEval.summarize`` reports, in its order (``AR*`` at 300 detections: ``AR@300`` ...).
LVIS_STAT_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "APr", "APc", "APf", "AR", "ARs", "ARm", "ARl")
MAX_DETS = 300
_IOU_THRS = np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1, endpoint=True)
_REC_THRS = np.linspace(0.0, 1.00, int(np.round((1.00 - 0.0) / 0.01)) + 1, endpoint=True)
_AREA_RNGS = ((0**2, 1e5**2), (0**2, 32**2), (32**2, 96**2), (96**2, 1e5**2))  # all, small, medium, large
_FREQUENCIES = ("r", "c", "f")


class LVISFileError(UserInputError, ValueError):
    """An LVIS annotation file given where a COCO one is needed (``COCOMaskMAP`` raises it)."""


def is_lvis_dataset(dataset: Mapping[str, Any]) -> bool:
    """Whether a parsed annotation file is LVIS's: its categories carry a ``frequency``, or its
    images ``neg_category_ids``."""
    cats = dataset.get("categories") or []
    imgs = dataset.get("images") or []
    return any(isinstance(c, dict) and "frequency" in c for c in cats[:1]) or any(
        isinstance(i, dict) and "neg_category_ids" in i for i in imgs[:1]
    )


@dataclass
class LVISGroundTruth:
    """An LVIS annotation file as the evaluation reads it.

    Attributes:
        ann_file (str): the file.
        sizes (dict[int, tuple[int, int]]): image id -> (H, W).
        category_ids (list[int]): sorted category ids.
        frequency (dict[int, str]): category id -> ``"r"``, ``"c"`` or ``"f"``.
        neg (dict[int, frozenset[int]]): image id -> ``neg_category_ids``.
        not_exhaustive (dict[int, frozenset[int]]): image id -> ``not_exhaustive_category_ids``.
        anns (dict[tuple[int, int], list[dict]]): (image id, category id) -> its annotations.
    """

    ann_file: str
    sizes: dict[int, tuple[int, int]]
    category_ids: list[int]
    frequency: dict[int, str]
    neg: dict[int, frozenset[int]]
    not_exhaustive: dict[int, frozenset[int]]
    anns: dict[tuple[int, int], list[dict[str, Any]]] = field(repr=False)


def load_lvis(ann_file: str | os.PathLike[str]) -> LVISGroundTruth:
    """Read an LVIS annotation file (v0.5 or v1) for :func:`evaluate_lvis`.

    Raises:
        FileNotFoundError: ``ann_file`` does not exist.
        ValueError: not an LVIS file (a category without an ``r`` / ``c`` / ``f`` frequency), or an
            image or annotation entry without the fields the evaluation needs; the message names
            the file and the id.
    """
    ann_file = os.fspath(ann_file)
    if not os.path.isfile(ann_file):
        raise FileNotFoundError(f"ann_file {ann_file!r} does not exist")
    with open(ann_file, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("images", "annotations", "categories")):
        raise ValueError(f"{ann_file}: not an LVIS annotation file (images, annotations and categories lists needed)")
    frequency: dict[int, str] = {}
    for cat in data["categories"]:
        if not isinstance(cat, dict) or cat.get("frequency") not in _FREQUENCIES:
            raise ValueError(
                f"{ann_file}: category {cat.get('id') if isinstance(cat, dict) else cat!r} has no frequency "
                f"'r', 'c' or 'f': not an LVIS file (COCOMaskMAP evaluates COCO files)"
            )
        frequency[int(cat["id"])] = cat["frequency"]
    sizes, neg, not_exhaustive = {}, {}, {}
    for img in data["images"]:
        try:
            iid = int(img["id"])
            sizes[iid] = (int(img["height"]), int(img["width"]))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{ann_file}: image entry {str(img)[:200]} needs an id, a height and a width") from None
        neg[iid] = frozenset(int(c) for c in img.get("neg_category_ids") or ())
        not_exhaustive[iid] = frozenset(int(c) for c in img.get("not_exhaustive_category_ids") or ())
    anns: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for ann in data["annotations"]:
        try:
            key = (int(ann["image_id"]), int(ann["category_id"]))
            entry = {"id": int(ann["id"]), "area": float(ann["area"]), "bbox": [float(v) for v in ann["bbox"]],
                     "segmentation": ann["segmentation"], "ignore": int(ann.get("ignore", 0))}
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{ann_file}: annotation {ann.get('id') if isinstance(ann, dict) else ann!r} needs image_id, "
                "category_id, area, bbox and segmentation"
            ) from None
        if key[0] not in sizes or key[1] not in frequency:
            raise ValueError(f"{ann_file}: annotation {entry['id']} names an unknown image or category")
        entry["segmentation"] = evaluable_segmentation(
            entry["segmentation"], *sizes[key[0]], f"{ann_file}: annotation id {entry['id']} of image id {key[0]}")
        anns.setdefault(key, []).append(entry)
    return LVISGroundTruth(ann_file, sizes, sorted(frequency), frequency, neg, not_exhaustive, anns)


def _gt_rle(gt: LVISGroundTruth, image_id: int, ann: dict[str, Any]) -> Any:
    """An annotation's mask as RLE (``LVIS.ann_to_rle``), cached on the annotation."""
    if "_rle" not in ann:
        h, w = gt.sizes[image_id]
        segm = ann["segmentation"]
        if isinstance(segm, list):
            ann["_rle"] = mask_utils.merge(mask_utils.frPyObjects(segm, h, w))
        elif isinstance(segm["counts"], list):
            ann["_rle"] = mask_utils.frPyObjects(segm, h, w)
        else:
            ann["_rle"] = segm
    return ann["_rle"]


def _match(ious: np.ndarray, gt_ig: np.ndarray, num_dt: int) -> tuple[np.ndarray, np.ndarray]:
    """``LVISEval.evaluate_img``'s greedy matching: (matched (T, D) bool, ignored (T, D) bool)."""
    matched = np.zeros((len(_IOU_THRS), num_dt), bool)
    ignored = np.zeros((len(_IOU_THRS), num_dt), bool)
    gt_taken = np.zeros((len(_IOU_THRS), len(gt_ig)), bool)
    if ious.size == 0:
        return matched, ignored
    for t, thr in enumerate(_IOU_THRS):
        for d in range(num_dt):
            best, m = min(thr, 1 - 1e-10), -1
            for g in range(len(gt_ig)):
                if gt_taken[t, g]:
                    continue
                if m > -1 and gt_ig[m] == 0 and gt_ig[g] == 1:  # matched a real gt; only ignored ones left
                    break
                if ious[d, g] < best:
                    continue
                best, m = ious[d, g], g
            if m == -1:
                continue
            ignored[t, d] = bool(gt_ig[m])
            matched[t, d] = True
            gt_taken[t, m] = True
    return matched, ignored


def _precision_at_recalls(tp: np.ndarray, fp: np.ndarray, num_gt: int) -> tuple[np.ndarray, float]:
    """101-point precision (max to the right) and the final recall of one cumulative TP / FP curve."""
    num_tp = len(tp)
    rc = tp / num_gt
    recall = float(rc[-1]) if num_tp else 0.0
    pr = tp / (fp + tp + np.spacing(1))
    pr = np.maximum.accumulate(pr[::-1])[::-1] if num_tp else pr
    inds = np.searchsorted(rc, _REC_THRS, side="left")
    out = np.zeros(len(_REC_THRS))
    valid = inds < num_tp
    out[valid] = pr[inds[valid]]
    return out, recall


def _evaluate_type(gt: LVISGroundTruth, dets: CocoDetections, iou_type: str, image_ids: list[int],
                   max_dets: int) -> dict[str, float]:
    # 1. Detections per image: the best max_dets by score (stable), then the federated filter.
    det_image = np.repeat(dets.image_ids.cpu().numpy(), dets.dets_per_image.cpu().numpy())
    scores = dets.scores.cpu().double().numpy()
    categories = dets.category_ids.cpu().numpy()
    boxes = dets.boxes.cpu().double().numpy().reshape(-1, 4)
    rles = dets.rles(gt.sizes) if iou_type == "segm" else None
    areas = (np.array([float(a) for k in range(0, len(rles), 255) for a in mask_utils.area(rles[k : k + 255])])
             if rles is not None and rles else boxes[:, 2] * boxes[:, 3])
    dts: dict[tuple[int, int], list[int]] = {}
    for image_id in image_ids:
        mine = np.flatnonzero(det_image == image_id)
        if len(mine) > max_dets:
            mine = mine[np.argsort(-scores[mine], kind="stable")[:max_dets]]
        for d in mine.tolist():
            key = (image_id, int(categories[d]))
            if key[1] in gt.neg[image_id] or key in gt.anns:
                dts.setdefault(key, []).append(d)
    # 2. Per (image, category), per area range: match and record.
    cat_index = {c: k for k, c in enumerate(gt.category_ids)}
    image_order = {i: n for n, i in enumerate(image_ids)}
    keys = {k for k in gt.anns if k[0] in image_order} | set(dts)
    per_cat: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray, np.ndarray, int]]] = {}
    for image_id, cat in sorted(keys, key=lambda k: (cat_index[k[1]], image_order[k[0]])):
        g_anns = gt.anns.get((image_id, cat), [])
        d_idx = dts.get((image_id, cat), [])
        d_idx = [d_idx[j] for j in np.argsort(-scores[d_idx], kind="mergesort")] if d_idx else []
        if g_anns and d_idx:
            if iou_type == "segm":
                g_regions = [_gt_rle(gt, image_id, a) for a in g_anns]
                d_regions = [rles[d] for d in d_idx]
            else:
                g_regions = [a["bbox"] for a in g_anns]
                d_regions = [boxes[d].tolist() for d in d_idx]
            ious = np.asarray(mask_utils.iou(d_regions, g_regions, [0] * len(g_anns)), np.float64)
        else:
            ious = np.zeros((len(d_idx), len(g_anns)))
        g_area = np.array([a["area"] for a in g_anns])
        g_flag = np.array([a["ignore"] for a in g_anns], bool)
        d_area = areas[d_idx] if d_idx else np.zeros(0)
        unchecked = cat in gt.not_exhaustive[image_id]
        for a, (lo, hi) in enumerate(_AREA_RNGS):
            gt_ig = (g_flag | (g_area < lo) | (g_area > hi)).astype(np.int64)
            order = np.argsort(gt_ig, kind="mergesort")
            matched, ignored = _match(ious[:, order] if ious.size else ious, gt_ig[order], len(d_idx))
            d_out = (d_area < lo) | (d_area > hi) | unchecked
            ignored |= ~matched & d_out[None, :]
            per_cat.setdefault((cat_index[cat], a), []).append(
                (scores[d_idx] if d_idx else np.zeros(0), matched, ignored, int((gt_ig == 0).sum())))
    # 3. Accumulate per category and area range (LVISEval.accumulate).
    num_t, num_r, num_k, num_a = len(_IOU_THRS), len(_REC_THRS), len(gt.category_ids), len(_AREA_RNGS)
    precision = -np.ones((num_t, num_r, num_k, num_a))
    recall = -np.ones((num_t, num_k, num_a))
    for (k, a), entries in per_cat.items():
        num_gt = sum(e[3] for e in entries)
        if num_gt == 0:
            continue
        dt_scores = np.concatenate([e[0] for e in entries])
        order = np.argsort(-dt_scores, kind="mergesort")
        dt_m = np.concatenate([e[1] for e in entries], axis=1)[:, order]
        dt_ig = np.concatenate([e[2] for e in entries], axis=1)[:, order]
        tp_sum = np.cumsum(dt_m & ~dt_ig, axis=1).astype(float)
        fp_sum = np.cumsum(~dt_m & ~dt_ig, axis=1).astype(float)
        for t in range(num_t):
            precision[t, :, k, a], recall[t, k, a] = _precision_at_recalls(tp_sum[t], fp_sum[t], num_gt)
    # 4. Summaries (LVISEval.summarize).
    groups = [[k for k, c in enumerate(gt.category_ids) if gt.frequency[c] == f] for f in _FREQUENCIES]

    def mean(s: np.ndarray) -> float:
        return float(np.mean(s[s > -1])) if (s > -1).any() else -1.0

    t50, t75 = np.where(_IOU_THRS == 0.5)[0], np.where(_IOU_THRS == 0.75)[0]
    values = [
        mean(precision[..., 0]), mean(precision[t50][..., 0]), mean(precision[t75][..., 0]),
        mean(precision[..., 1]), mean(precision[..., 2]), mean(precision[..., 3]),
        *(mean(precision[:, :, g, 0]) for g in groups),
        mean(recall[..., 0]), mean(recall[..., 1]), mean(recall[..., 2]), mean(recall[..., 3]),
    ]
    return {f"{iou_type}_{name}": v for name, v in zip(LVIS_STAT_NAMES, values)}


def evaluate_lvis(gt: LVISGroundTruth, dets: CocoDetections, iou_types: Iterable[str] = ("segm", "bbox"),
                  max_dets: int = MAX_DETS) -> dict[str, float]:
    """Federated LVIS AP / AR of the detections, over the images they cover.

    Args:
        gt: the ground truth (:func:`load_lvis`).
        dets: detections with unique image ids (``deduplicate``), masks included for ``"segm"``.
        iou_types: any of ``"segm"`` and ``"bbox"``.
        max_dets: detections kept per image, the best by score (LVIS: 300).

    Returns:
        ``{f"{iou_type}_{name}": value}`` for every name in :data:`LVIS_STAT_NAMES`; ``-1.0``
        where there is nothing to score (no ground truth in a group or area range, no images).

    Raises:
        ValueError: an unknown iou type, or an image id not in the file.
    """
    iou_types, image_ids = checked_request(iou_types, dets, gt.sizes, str(gt.ann_file))
    out: dict[str, float] = {}
    for iou_type in iou_types:
        if not image_ids:
            out.update({f"{iou_type}_{name}": -1.0 for name in LVIS_STAT_NAMES})
        else:
            out.update(_evaluate_type(gt, dets, iou_type, image_ids, max_dets))
    return out
