"""COCO results entries: detections in original pixels as the JSON list every COCO tool reads.

A COCO results file is a list of ``{"image_id", "category_id", "bbox": [x, y, w, h], "score",
"segmentation": {"size": [H, W], "counts": str}}`` (``pycocotools.COCO.loadRes``, the COCO
evaluation server). The detections come from
:func:`~seg_datamodule.evaluation.predictions.canvas_predictions_to_coco`, the mapping
:class:`~seg_datamodule.evaluation.coco_metric.COCOMaskMAP` scores: boxes through the exact
inverse letterbox, masks resampled at the original pixel centres and RLE-encoded, labels turned
into category ids. So a results file scored by ``COCOeval`` gives ``COCOMaskMAP``'s numbers.

One convention to know when scoring segm from such a file: ``loadRes`` takes a result's
``area`` from its ``bbox`` when it has one, which moves detections between the small / medium /
large ranges; Detectron2 (``evaluation/coco_evaluation.py``) and ``COCOMaskMAP`` drop the
``bbox`` for segm so the area is the mask's. AP, AP50 and AP75 are the same either way.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from torch import Tensor

from seg_datamodule.evaluation.predictions import BatchLetterbox, CocoDetections, canvas_predictions_to_coco

__all__ = ["batch_detections", "detections_to_results"]


def batch_detections(
    preds: Sequence[Mapping[str, Tensor]], batch: Any, category_ids: Sequence[int], mask_threshold: float = 0.5,
    with_masks: bool = True,
) -> CocoDetections:
    """A batch's canvas predictions as detections on the original images (no annotation file needed).

    Args:
        preds: one dict per image of ``batch``, as :meth:`~seg_datamodule.evaluation.coco_metric.COCOMaskMAP.update` takes them
            (``boxes`` xyxy canvas pixels, ``scores``, contiguous ``labels``, and ``masks`` or
            ``mask_logits`` on the canvas or its stride grid).
        batch (DetectionBatch): the batch they were made on (its ``image_ids``, ``scales``,
            ``pads``, ``orig_sizes``, ``mask_stride`` and canvas size are read).
        category_ids (Sequence[int]): COCO category id of each label.
        mask_threshold (float): probability above which a resampled pixel is foreground.
        with_masks (bool): encode masks (False: boxes only).

    Returns:
        :class:`CocoDetections` on the CPU.

    Raises:
        TypeError, KeyError, ValueError: as :func:`canvas_predictions_to_coco`, naming the image id.
    """
    sizes = {int(i): (int(h), int(w)) for i, (h, w) in zip(batch.image_ids.tolist(), batch.orig_sizes.tolist())}
    return canvas_predictions_to_coco(
        preds, BatchLetterbox.from_batch(batch), category_ids, sizes, with_masks=with_masks,
        mask_threshold=mask_threshold, source="the batch",
    )


def detections_to_results(
    dets: CocoDetections,
    sizes: Mapping[int, tuple[int, int]],
    score_threshold: float = 0.0,
    max_per_image: int | None = 100,
) -> list[dict[str, Any]]:
    """COCO results entries of detections, the best ``max_per_image`` of each image above a score.

    Args:
        dets (CocoDetections): detections grouped by image occurrence.
        sizes (Mapping[int, tuple[int, int]]): ``(H, W)`` of each image id (the RLE ``size``).
        score_threshold (float): keep detections with ``score >= score_threshold``.
        max_per_image (int | None): keep at most this many per image, highest scores first (ties
            in their original order); None keeps all. COCO's own evaluation keeps 100.

    Returns:
        list of dicts with ``image_id``, ``category_id``, ``bbox`` (xywh, original pixels),
        ``score`` and, for detections with a mask, ``segmentation`` (compressed RLE, ``counts``
        an ASCII string), image by image.
    """
    counts = dets.dets_per_image.cpu().numpy()
    starts = np.cumsum(counts) - counts
    scores = dets.scores.cpu().numpy()
    categories = dets.category_ids.cpu().tolist()
    boxes = dets.boxes.cpu().double().tolist()
    lengths = dets.rle_lengths.cpu().numpy()
    rles = dets.rles(sizes) if len(scores) else []
    out: list[dict[str, Any]] = []
    for image_id, start, n in zip(dets.image_ids.cpu().tolist(), starts.tolist(), counts.tolist()):
        local = np.flatnonzero(scores[start : start + n] >= score_threshold)
        order = local[np.argsort(-scores[start + local], kind="stable")]
        if max_per_image is not None:
            order = order[:max_per_image]
        for k in (start + order).tolist():
            entry: dict[str, Any] = {"image_id": int(image_id), "category_id": int(categories[k]),
                                     "bbox": boxes[k], "score": float(scores[k])}
            if lengths[k]:
                entry["segmentation"] = {"size": rles[k]["size"], "counts": rles[k]["counts"].decode("ascii")}
            out.append(entry)
    return out
