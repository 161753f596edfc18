"""COCO evaluation of canvas predictions on the original images: inverse letterbox, RLE, ``COCOeval``.

:mod:`~seg_datamodule.evaluation.letterbox` (pure inverse-letterbox kernels) ->
:mod:`~seg_datamodule.evaluation.predictions` (a batch's predictions -> COCO detections) ->
:mod:`~seg_datamodule.evaluation.coco_eval` (``COCOeval`` against the annotation JSON), wrapped by
:class:`~seg_datamodule.evaluation.coco_metric.COCOMaskMAP`, a ``torchmetrics.Metric``; and the same
detections as a COCO results file (:mod:`~seg_datamodule.evaluation.results`), written in predict by
:class:`~seg_datamodule.evaluation.writer.COCOResultsWriter`. Masks on images of 2^24 pixels or more
are kept within what pycocotools can hold (:mod:`~seg_datamodule.evaluation.safe_rle`). For LVIS files
:mod:`~seg_datamodule.evaluation.lvis_eval` (federated LVIS AP), wrapped by
:class:`~seg_datamodule.evaluation.lvis_metric.LVISMaskMAP`; :func:`~seg_datamodule.evaluation.choose.metric_for_file`
picks the one that scores a file.
"""

from seg_datamodule.evaluation.coco_eval import STAT_NAMES, deduplicate, evaluate_detections, load_coco
from seg_datamodule.evaluation.coco_metric import COCOMaskMAP, NothingScoredError
from seg_datamodule.evaluation.lvis_eval import LVIS_STAT_NAMES, evaluate_lvis, load_lvis
from seg_datamodule.evaluation.lvis_metric import LVISMaskMAP
from seg_datamodule.evaluation.letterbox import boxes_to_canvas, boxes_to_original, masks_to_original
from seg_datamodule.evaluation.predictions import BatchLetterbox, CocoDetections, canvas_predictions_to_coco
from seg_datamodule.evaluation.results import batch_detections, detections_to_results
from seg_datamodule.evaluation.safe_rle import MaskTooLargeError
from seg_datamodule.evaluation.writer import COCOResultsWriter
from seg_datamodule.evaluation.choose import metric_for_file

__all__ = [
    "BatchLetterbox",
    "COCOMaskMAP",
    "COCOResultsWriter",
    "CocoDetections",
    "LVISMaskMAP",
    "LVIS_STAT_NAMES",
    "MaskTooLargeError",
    "NothingScoredError",
    "STAT_NAMES",
    "batch_detections",
    "boxes_to_canvas",
    "boxes_to_original",
    "canvas_predictions_to_coco",
    "deduplicate",
    "detections_to_results",
    "evaluate_detections",
    "evaluate_lvis",
    "load_coco",
    "load_lvis",
    "masks_to_original",
    "metric_for_file",
]
