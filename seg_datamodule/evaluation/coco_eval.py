"""Run ``pycocotools``' ``COCOeval`` on :class:`CocoDetections` against the original annotation JSON.

Ground truth is the annotation file itself, read by ``pycocotools.coco.COCO``: crowd regions,
areas (hence small / medium / large) and category ids are exactly those COCO evaluates with.
Detections are handed over as ``loadRes`` would build them, with one difference taken from
Detectron2 (``evaluation/coco_evaluation.py``): the segm results carry no ``bbox``, so a
detection's area is its mask area for segm and its box area for bbox (``loadRes`` would use the
box area for both when a result has both). Evaluation covers exactly the images that were
predicted on (``params.imgIds``), so validating on a subset scores that subset.

Backends: ``"pycocotools"`` (the reference) or ``"faster_coco_eval"`` (its ``COCOeval_faster``,
the same algorithm with ``evaluateImg`` and ``accumulate`` in C++, an optional install: 2-7x
faster on coco-mini, the same numbers to 1e-6); ``"auto"`` takes the second when installed.
"""

from __future__ import annotations

import contextlib
import io
import os
from typing import Any, Container, Iterable, Literal, Mapping

import numpy as np
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from seg_datamodule.evaluation.predictions import CocoDetections
from seg_datamodule.evaluation.safe_rle import make_ground_truth_evaluable

__all__ = [
    "BACKENDS",
    "IOU_TYPES",
    "STAT_NAMES",
    "backend_classes",
    "resolve_backend",
    "deduplicate",
    "checked_request",
    "evaluate_detections",
    "image_sizes",
    "load_coco",
    "stats_table",
]

#: What ``COCOeval.summarize`` reports, in the order of ``COCOeval.stats``.
STAT_NAMES = (
    "AP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large",
    "AR1", "AR10", "AR100", "AR_small", "AR_medium", "AR_large",
)
IOU_TYPES = ("segm", "bbox")
BACKENDS = ("auto", "pycocotools", "faster_coco_eval")
Backend = Literal["auto", "pycocotools", "faster_coco_eval"]


def resolve_backend(backend: str) -> str:
    """``backend`` itself, or for ``"auto"`` ``"faster_coco_eval"`` when installed, else
    ``"pycocotools"``.

    Raises:
        ValueError: not one of :data:`BACKENDS`.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    if backend != "auto":
        return backend
    try:
        import faster_coco_eval  # noqa: F401
    except ImportError:
        return "pycocotools"
    return "faster_coco_eval"


def backend_classes(backend: str) -> tuple[type, type]:
    """``(COCO, COCOeval)`` classes of a backend.

    Raises:
        ValueError: an unknown backend.
        ModuleNotFoundError: ``faster_coco_eval`` asked for but not installed.
    """
    backend = resolve_backend(backend)
    if backend == "pycocotools":
        return COCO, COCOeval
    if backend == "faster_coco_eval":
        try:
            from faster_coco_eval import COCO as FastCOCO
            from faster_coco_eval import COCOeval_faster
        except ImportError:
            raise ModuleNotFoundError(
                "backend='faster_coco_eval' needs the faster-coco-eval package: "
                "pip install 'seg-datamodule[fast-eval]' (or faster-coco-eval)"
            ) from None
    return FastCOCO, COCOeval_faster


def load_coco(ann_file: str | os.PathLike[str], backend: Backend = "auto") -> COCO:
    """The annotation file as the backend's ``COCO`` (its progress prints silenced), its masks on
    images of 2^24 pixels or more made safe for pycocotools' encoder
    (:func:`~seg_datamodule.evaluation.safe_rle.make_ground_truth_evaluable`).

    Raises:
        FileNotFoundError: ``ann_file`` does not exist.
        ModuleNotFoundError: ``faster_coco_eval`` asked for but not installed.
        MaskTooLargeError: a mask on such an image that pycocotools cannot hold.
    """
    coco_class, _ = backend_classes(backend)
    if not os.path.isfile(ann_file):
        raise FileNotFoundError(f"ann_file {str(ann_file)!r} does not exist")
    with contextlib.redirect_stdout(io.StringIO()):
        coco = coco_class(os.fspath(ann_file))
    make_ground_truth_evaluable(coco.dataset.get("images", []), coco.dataset.get("annotations", []), str(ann_file))
    return coco


def image_sizes(coco: COCO) -> dict[int, tuple[int, int]]:
    """``{image_id: (height, width)}`` of every image in the file."""
    return {int(i): (int(img["height"]), int(img["width"])) for i, img in coco.imgs.items()}


def deduplicate(dets: CocoDetections) -> CocoDetections:
    """Keep each image id's first occurrence only (a ``DistributedSampler`` repeats images to even
    out the ranks; counting a repeat would count its ground truth twice).
    """
    ids = dets.image_ids.cpu().numpy()
    _, first = np.unique(ids, return_index=True)
    if first.size == ids.size:
        return dets
    keep_image = np.zeros(ids.size, bool)
    keep_image[first] = True
    counts = dets.dets_per_image.cpu().numpy()
    keep_det = np.repeat(keep_image, counts)
    lengths = dets.rle_lengths.cpu().numpy()
    keep_byte = np.repeat(keep_det, lengths)
    return CocoDetections(
        image_ids=dets.image_ids[keep_image],
        dets_per_image=dets.dets_per_image[keep_image],
        category_ids=dets.category_ids[keep_det],
        scores=dets.scores[keep_det],
        boxes=dets.boxes[keep_det],
        rle_lengths=dets.rle_lengths[keep_det],
        rle_bytes=dets.rle_bytes[keep_byte],
    )


def _results(coco: COCO, dets: CocoDetections, iou_type: str) -> list[dict[str, Any]]:
    """Result annotations as ``loadRes`` makes them (ids from 1, iscrowd 0, area per iou type)."""
    det_image = np.repeat(dets.image_ids.cpu().numpy(), dets.dets_per_image.cpu().numpy()).tolist()
    categories = dets.category_ids.cpu().tolist()
    scores = dets.scores.cpu().double().tolist()
    if iou_type == "bbox":
        boxes = dets.boxes.cpu().double().numpy()
        areas = (boxes[:, 2] * boxes[:, 3]).tolist()
        return [
            {"id": k + 1, "image_id": i, "category_id": c, "score": s, "bbox": b, "area": a, "iscrowd": 0}
            for k, (i, c, s, b, a) in enumerate(zip(det_image, categories, scores, boxes.tolist(), areas))
        ]
    rles = dets.rles(image_sizes(coco))
    if not rles:
        return []
    areas = _mask_areas(rles)
    boxes = mask_utils.toBbox(rles).tolist()
    return [
        {"id": k + 1, "image_id": i, "category_id": c, "score": s, "segmentation": r, "area": a, "bbox": b,
         "iscrowd": 0}
        for k, (i, c, s, r, a, b) in enumerate(zip(det_image, categories, scores, rles, areas, boxes))
    ]


def _mask_areas(rles: list[dict[str, Any]]) -> list[float]:
    # Chunks of 255: pycocotools 2.0.11's ``area`` raises OverflowError ("out of bounds for
    # uint8") on a list of 256 or more RLEs under numpy 2.
    return [float(a) for k in range(0, len(rles), 255) for a in mask_utils.area(rles[k : k + 255])]


def _results_coco(coco: COCO, annotations: list[dict[str, Any]]) -> COCO:
    """A ``COCO`` over the results (``loadRes`` without its copies, prints, or failure on none)."""
    with contextlib.redirect_stdout(io.StringIO()):
        res = type(coco)()
    res.dataset = {
        "images": coco.dataset["images"],
        "categories": coco.dataset["categories"],
        "annotations": annotations,
    }
    with contextlib.redirect_stdout(io.StringIO()):
        res.createIndex()
    return res


def checked_request(iou_types: Iterable[str], dets: CocoDetections, known: Container[int],
                    source: str) -> tuple[tuple[str, ...], list[int]]:
    """The iou types asked for and the sorted image ids of ``dets``, both checked.

    Args:
        iou_types: ``"segm"`` and / or ``"bbox"``.
        dets: the detections to score.
        known: the image ids the ground truth has.
        source: how the ground truth is named in the error (a file name).

    Raises:
        ValueError: an unknown iou type, or an image id not in ``known``.
    """
    iou_types = tuple(iou_types)
    for iou_type in iou_types:
        if iou_type not in IOU_TYPES:
            raise ValueError(f"iou_types must be among {list(IOU_TYPES)}, got {iou_type!r}")
    image_ids = sorted({int(i) for i in dets.image_ids.cpu().tolist()})
    unknown = [i for i in image_ids if i not in known]
    if unknown:
        raise ValueError(f"image ids {unknown[:5]} are not in {source}")
    return iou_types, image_ids


def evaluate_detections(
    coco: COCO, dets: CocoDetections, iou_types: Iterable[str] = IOU_TYPES, backend: Backend = "auto",
    curves: dict[str, np.ndarray] | None = None,
) -> dict[str, float]:
    """COCO AP / AR of the detections, over the images they cover.

    Args:
        coco: the ground truth (:func:`load_coco` with the same ``backend``).
        dets: detections with unique image ids (see :func:`deduplicate`), with masks when
            ``"segm"`` is evaluated.
        iou_types: any of ``"segm"`` and ``"bbox"``.
        backend: ``"auto"``, ``"pycocotools"`` or ``"faster_coco_eval"``.
        curves: when given, filled with each iou type's precision table as COCOeval accumulates it:
            ``ndarray[T, R, K, A, M]`` (IoU thresholds .5:.05:.95, 101 recall points, the file's
            categories sorted by id, areas all / small / medium / large, max detections 1 / 10 / 100;
            -1 where a class has no ground truth), what the run pictures' PR curves are drawn from.

    Returns:
        ``{f"{iou_type}_{name}": value}`` for every name in :data:`STAT_NAMES`; ``-1.0`` where
        COCO has nothing to score (no ground truth in an area range, or no images at all).

    Raises:
        ValueError: an unknown iou type or backend, or an image id not in ``coco``.
        ModuleNotFoundError: ``faster_coco_eval`` asked for but not installed.
    """
    _, evaluator_class = backend_classes(backend)
    iou_types, image_ids = checked_request(iou_types, dets, coco.imgs, "the annotation file")
    out: dict[str, float] = {}
    for iou_type in iou_types:
        if not image_ids:
            out.update({f"{iou_type}_{name}": -1.0 for name in STAT_NAMES})
            continue
        with contextlib.redirect_stdout(io.StringIO()):
            evaluator = evaluator_class(coco, _results_coco(coco, _results(coco, dets, iou_type)), iouType=iou_type)
        evaluator.params.imgIds = image_ids
        with contextlib.redirect_stdout(io.StringIO()):
            evaluator.evaluate()
            evaluator.accumulate()
            evaluator.summarize()
        out.update({f"{iou_type}_{name}": float(v) for name, v in zip(STAT_NAMES, evaluator.stats)})
        if curves is not None:
            curves[iou_type] = np.asarray(evaluator.eval["precision"], np.float64)
    return out


def stats_table(results: Mapping[str, float]) -> str:
    """The results as a small text table, one row per iou type (for logs and benchmarks)."""
    rows = []
    for iou_type in IOU_TYPES:
        if f"{iou_type}_AP" in results:
            values = " ".join(f"{name}={results[f'{iou_type}_{name}']:.4f}" for name in STAT_NAMES[:6])
            rows.append(f"{iou_type}: {values}")
    return "\n".join(rows)
