"""Which file scores a stage, and which metric scores a file: federated LVIS AP, COCO AP, or none.

One choice for every model and stage (validation and test alike): the file is the DataModule's
(``COCOSegDataModule.evaluation_file(stage)``, :func:`stage_file`), an LVIS file is never handed
to ``COCOMaskMAP``, and a file without annotations (COCO test-dev's image info) is not scored.
"""

from __future__ import annotations

import os
from typing import Any

from seg_datamodule.evaluation.coco_metric import COCOMaskMAP
from seg_datamodule.evaluation.lvis_eval import LVISFileError
from seg_datamodule.evaluation.lvis_metric import LVISMaskMAP

__all__ = ["metric_for_file", "stage_file"]


def stage_file(datamodule: Any, stage: str) -> str | None:
    """The JSON that scores ``stage`` for ``datamodule``: its ``evaluation_file(stage)``.

    A DataModule without that method (any other) is read as having ``val_ann`` for fit and
    validate and ``test_ann`` for test; ``None`` without a DataModule.
    """
    if datamodule is None:
        return None
    choose = getattr(datamodule, "evaluation_file", None)
    if callable(choose):
        return choose(stage)
    name = {"fit": "val_ann", "validate": "val_ann", "test": "test_ann"}.get(stage)
    return None if name is None else getattr(datamodule, name, None)


def metric_for_file(ann_file: str | os.PathLike[str], num_classes: int) -> COCOMaskMAP | None:
    """The metric of ``ann_file``: :class:`LVISMaskMAP` for an LVIS file, :class:`COCOMaskMAP` otherwise.

    Args:
        ann_file: the COCO or LVIS JSON that scores the stage (the DataModule's
            ``evaluation_file(stage)``).
        num_classes: the model's class count; must be the file's number of categories.

    Returns:
        The metric, or ``None`` when the file has no annotations (an image-info file).

    Raises:
        FileNotFoundError: ``ann_file`` does not exist.
        ValueError: the file has a number of categories other than ``num_classes``.
    """
    metric: COCOMaskMAP = COCOMaskMAP(ann_file)
    try:
        annotated = bool(metric.coco.dataset.get("annotations"))
    except LVISFileError:  # federated LVIS AP instead
        metric = LVISMaskMAP(ann_file)
        annotated = bool(metric.coco.anns)
    if not annotated:
        return None
    if len(metric.category_ids) != num_classes:
        raise ValueError(
            f"{ann_file} has {len(metric.category_ids)} categories but the model has num_classes="
            f"{num_classes}; COCO AP needs label k to be the file's k-th category"
        )
    return metric
