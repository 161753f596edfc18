"""COCO mAP plumbing shared by the integration modules: make the metric at ``setup``, log it.

Both :class:`~seg_datamodule.integrations.ultralytics.YOLOSegModule` and
:class:`~seg_datamodule.integrations.torchvision.MaskRCNNModule` score real detections with
:class:`~seg_datamodule.evaluation.COCOMaskMAP` (federated LVIS AP for an LVIS file, through
:func:`~seg_datamodule.evaluation.choose.metric_for_file`). The annotation file comes from the
DataModule (``evaluation_file("validate")``) or the module's ``coco_ann_file`` argument; it is
never saved as a hyperparameter named ``val_ann``, so it cannot clash with the DataModule's own.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from seg_datamodule.console import print_summary
from seg_datamodule.evaluation import COCOMaskMAP
from seg_datamodule.evaluation.choose import metric_for_file, stage_file

__all__ = ["AP_NAMES", "log_coco_results", "make_coco_metric"]

#: The COCO numbers logged per IoU type, as ``val/{segm,bbox}_<name>``.
AP_NAMES = ("AP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large")


def make_coco_metric(module: L.LightningModule, ann_file: str | None, num_classes: int) -> COCOMaskMAP | None:
    """The validation metric of a module, or ``None`` when no annotated file is known.

    Args:
        module: the LightningModule (its trainer's DataModule is asked for its validation file).
        ann_file: an explicit annotation file; ``None`` takes the DataModule's.
        num_classes: the model's class count; must equal the file's number of categories.

    Returns:
        :class:`COCOMaskMAP` (:class:`~seg_datamodule.evaluation.LVISMaskMAP` for an LVIS file)
        or ``None`` (plain DataLoaders without a file, or a file without annotations: no AP).

    Raises:
        ValueError: the file has a number of categories other than ``num_classes``.
    """
    if ann_file is None:
        trainer = module._trainer  # noqa: SLF001 (``module.trainer`` raises when detached)
        ann_file = stage_file(getattr(trainer, "datamodule", None) if trainer is not None else None, "validate")
    return None if ann_file is None else metric_for_file(ann_file, num_classes)


def log_coco_results(module: L.LightningModule, metric: COCOMaskMAP | None, what: str) -> dict[str, Any] | None:
    """Compute, reset and log ``val/{segm,bbox}_{AP,...}``; print both APs after a real validation.

    Args:
        module: the LightningModule that logs.
        metric: its metric (nothing happens when ``None`` or never updated).
        what: a few words for the printed line (what the detections are).

    Returns:
        The computed results, or ``None`` when nothing was evaluated.
    """
    if metric is None or metric.update_count == 0:  # every rank validates, or none does
        return None
    results = metric.compute()
    metric.reset()
    for name, value in results.items():
        if name.split("_", 1)[1] in AP_NAMES:
            # The same value on every rank; sync_dist keeps Lightning's epoch-level DDP check quiet.
            module.log(f"val/{name}", value, prog_bar=name == "segm_AP", sync_dist=True)
    if not module.trainer.sanity_checking:
        print_summary(
            module.trainer,
            f"epoch {module.current_epoch}: COCO val segm AP {float(results['segm_AP']):.4f}, "
            f"bbox AP {float(results['bbox_AP']):.4f} ({what})"
        )
    return results
