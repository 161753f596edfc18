"""``LVISMaskMAP``: ``COCOMaskMAP``'s contract (canvas predictions, letterbox, RLE, DDP) scored as LVIS.

Everything up to the evaluation is :class:`~seg_datamodule.evaluation.coco_metric.COCOMaskMAP`'s:
``update(preds, batch)`` maps each image's predictions back through the batch's letterbox and
keeps them as RLE-encoded detections in tensor states; ``compute`` gathers them over ranks,
de-duplicates repeated images and evaluates once on rank 0. The evaluation is federated LVIS AP
(:mod:`~seg_datamodule.evaluation.lvis_eval`): detections of categories nobody checked in an
image are ignored, at most 300 per image, AP also per frequency group (APr / APc / APf).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from seg_datamodule.evaluation.coco_eval import IOU_TYPES, deduplicate
from seg_datamodule.evaluation.coco_metric import COCOMaskMAP
from seg_datamodule.evaluation.lvis_eval import LVIS_STAT_NAMES, MAX_DETS, LVISGroundTruth, evaluate_lvis, load_lvis
from seg_datamodule.ops.checks import check_int

__all__ = ["LVISMaskMAP"]


class LVISMaskMAP(COCOMaskMAP):
    """Federated LVIS segm and bbox AP of canvas predictions, evaluated on the original images.

    Used exactly as :class:`~seg_datamodule.evaluation.coco_metric.COCOMaskMAP` (same ``update``
    arguments, same letterbox mapping and mask threshold), on an LVIS v0.5 or v1 annotation file::

        metric = LVISMaskMAP(ann_file=datamodule.val_ann)
        metric.update(preds, batch)
        results = metric.compute(); metric.reset()   # {"segm_AP": ..., "segm_APr": ..., ...}

    Give each image up to ``max_detections`` detections over all categories (LVIS's protocol
    scores the 300 best): a detector tuned for COCO's 100 per image loses recall here.

    Args:
        ann_file (str | PathLike): the LVIS annotation JSON of the validation set.
        iou_types (Sequence[str]): any of ``"segm"`` and ``"bbox"``.
        category_ids (Sequence[int] | None): LVIS category id of each label; ``None`` takes the
            file's ids, sorted (what the DataModule's labels are).
        mask_threshold (float): as for ``COCOMaskMAP``.
        max_detections (int): detections kept per image, the best by score (LVIS: 300).
        **kwargs: ``torchmetrics.Metric`` options.

    Raises:
        FileNotFoundError: ``ann_file`` does not exist.
        TypeError, ValueError: a bad argument; on first use, a file that is not LVIS's.
    """

    _stat_names = LVIS_STAT_NAMES

    def __init__(
        self,
        ann_file: str | os.PathLike[str],
        iou_types: Sequence[str] = IOU_TYPES,
        category_ids: Sequence[int] | None = None,
        mask_threshold: float = 0.5,
        max_detections: int = MAX_DETS,
        **kwargs: Any,
    ) -> None:
        super().__init__(ann_file, iou_types=iou_types, category_ids=category_ids,
                         mask_threshold=mask_threshold, backend="pycocotools", **kwargs)
        self.max_detections = check_int("max_detections", max_detections, 1)
        self.backend = "lvis"  # the federated evaluation of lvis_eval, not COCOeval

    @property
    def coco(self) -> LVISGroundTruth:  # type: ignore[override]
        """The LVIS ground truth (loaded on first use); what ``update`` reads sizes and ids from.

        Raises:
            ValueError: not an LVIS file, or ``category_ids`` names a category it does not have.
        """
        if self._coco is None:
            gt = load_lvis(self.ann_file)
            if self._category_ids is not None:
                unknown = sorted(set(self._category_ids) - set(gt.category_ids))
                if unknown:
                    raise ValueError(f"category_ids {unknown} are not categories of {self.ann_file}")
            else:
                self._category_ids = list(gt.category_ids)
            self._coco, self._sizes = gt, dict(gt.sizes)
        return self._coco

    def _evaluate(self) -> dict[str, float]:
        return evaluate_lvis(self.coco, deduplicate(self.detections()), self.iou_types, self.max_detections)

    def compute(self) -> dict[str, Any]:
        """LVIS stats of everything updated (on all ranks), each image once.

        Returns:
            ``{f"{iou_type}_{name}": Tensor[] float32}`` for ``name`` in ``AP, AP50, AP75, APs,
            APm, APl, APr, APc, APf, AR, ARs, ARm, ARl`` (AR at ``max_detections``); ``-1``
            where there is nothing to score.
        """
        return super().compute()
