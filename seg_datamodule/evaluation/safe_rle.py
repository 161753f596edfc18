"""Masks pycocotools can hold: checked before an evaluator hands them to it, on large images only.

pycocotools' RLE string encoder can write past its buffer on an image of 2^24 pixels or more, and
its strings cannot hold a run of 2^29 pixels (:mod:`seg_datamodule.ops.rle` says when and why); a
heap overflow there aborts the process. ``COCOeval`` encodes every ground-truth polygon and
uncompressed RLE itself (``annToRLE``), and the predictions are encoded here
(:func:`~seg_datamodule.evaluation.predictions.encode_windows`). So on such images:

* ground-truth uncompressed RLE is encoded by :func:`~seg_datamodule.ops.rle.rle_string` instead
  (pycocotools then only decodes it), and a run it cannot hold is refused;
* a ground-truth polygon whose encoding could overflow
  (:func:`~seg_datamodule.ops.rle.polygon_rle_problem`) is refused, naming the file, the image and
  the annotation: segm evaluation of that image is not possible with pycocotools (bbox is).

Images under 2^24 pixels (every COCO image) are not looked at.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from seg_datamodule.errors import UserInputError
from seg_datamodule.ops.rle import (
    RLE_SAFE_PIXELS,
    polygon_rle_problem,
    rle_counts_from_string,
    rle_run_problem,
    rle_string,
)

__all__ = ["MaskTooLargeError", "evaluable_segmentation", "make_ground_truth_evaluable"]


class MaskTooLargeError(UserInputError, ValueError):
    """A mask (ground truth or prediction) that pycocotools cannot hold as RLE, so segm evaluation cannot score it."""


def evaluable_segmentation(segm: Any, height: int, width: int, where: str) -> Any:
    """``segm`` as the evaluator may hand it to pycocotools: itself, or its uncompressed RLE encoded here.

    Args:
        segm: an annotation's ``segmentation`` (polygons, or RLE with list or string counts).
        height: its image's height.
        width: its image's width.
        where: names the annotation in an error (file, image id, annotation id).

    Returns:
        ``segm`` unchanged, or for uncompressed RLE on an image of 2^24 pixels or more
        ``{"size": ..., "counts": str}`` with the same runs.

    Raises:
        MaskTooLargeError: its RLE would hold a run of 2^29 pixels or more, or pycocotools'
            encoding of the polygon could overflow.
    """
    if height * width < RLE_SAFE_PIXELS:
        return segm
    fix = (f"pycocotools cannot evaluate its mask on the {height}x{width} (HxW) image; evaluate bbox only "
           "(iou_types=('bbox',)) or leave the image out")
    if isinstance(segm, list):
        rings = _rings(segm)
        problem = None if rings is None else polygon_rle_problem(rings, height, width)
        if problem is not None:
            raise MaskTooLargeError(f"{where}: its polygon: {problem}; {fix}")
        return segm
    counts = segm.get("counts") if isinstance(segm, dict) else None
    if isinstance(counts, (str, bytes)):
        try:
            runs = rle_counts_from_string(counts)
        except ValueError as err:
            raise MaskTooLargeError(f"{where}: its compressed RLE is not valid ({err}); {fix}") from None
    elif isinstance(counts, list):
        runs = counts
    else:  # not a mask pycocotools reads at all: its own error says so
        return segm
    problem = rle_run_problem(runs)
    if problem is not None:
        raise MaskTooLargeError(f"{where}: its RLE holds {problem}; {fix}")
    if isinstance(counts, list):
        return {"size": segm.get("size"), "counts": rle_string(runs).decode("ascii")}
    return segm


def make_ground_truth_evaluable(images: Iterable[dict[str, Any]], annotations: Iterable[dict[str, Any]],
                                source: str) -> None:
    """:func:`evaluable_segmentation` on every annotation of an image of 2^24 pixels or more, in place.

    Args:
        images: the file's image entries (``id``, ``height``, ``width``).
        annotations: its annotations; their ``segmentation`` is replaced where encoded here.
        source: the file, for errors.

    Raises:
        MaskTooLargeError: see :func:`evaluable_segmentation`.
    """
    large = {img["id"]: (int(img["height"]), int(img["width"])) for img in images
             if int(img["height"]) * int(img["width"]) >= RLE_SAFE_PIXELS}
    if not large:
        return
    for ann in annotations:
        size = large.get(ann.get("image_id"))
        if size is not None and "segmentation" in ann:
            where = f"{source}: annotation id {ann.get('id')!r} of image id {ann['image_id']!r}"
            ann["segmentation"] = evaluable_segmentation(ann["segmentation"], *size, where)


def _rings(segm: list[Any]) -> list[np.ndarray] | None:
    """Polygon rings as (K, 2) arrays, or None when they are not (pycocotools then reports it)."""
    try:
        rings = [np.asarray(r, np.float64).reshape(-1, 2) for r in segm]
    except (TypeError, ValueError):
        return None
    return rings if rings and all(len(r) for r in rings) else None
