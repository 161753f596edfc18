"""COCO mAP plumbing shared by the integration modules: make the metric at ``setup``, log it.

Both :class:`~seg_datamodule.integrations.ultralytics.YOLOSegModule` and
:class:`~seg_datamodule.integrations.torchvision.MaskRCNNModule` score real detections with
:class:`~seg_datamodule.evaluation.COCOMaskMAP`. The annotation file comes from the DataModule
(``trainer.datamodule.val_ann``) or the module's ``coco_ann_file`` argument; it is never saved as
a hyperparameter named ``val_ann``, so it cannot clash with the DataModule's own ``val_ann``.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from seg_datamodule.console import print_summary
from seg_datamodule.evaluation import COCOMaskMAP

__all__ = ["AP_NAMES", "log_coco_results", "make_coco_metric"]

#: The COCO numbers logged per IoU type, as ``val/{segm,bbox}_<name>``.
AP_NAMES = ("AP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large")


def make_coco_metric(module: L.LightningModule, ann_file: str | None, num_classes: int) -> COCOMaskMAP | None:
    """The COCO metric of a module, or ``None`` when no annotation file is known.

    Args:
        module: the LightningModule (its trainer's DataModule is asked for ``val_ann``).
        ann_file: an explicit annotation file; ``None`` takes ``trainer.datamodule.val_ann``.
        num_classes: the model's class count; must equal the file's number of categories.

    Returns:
        :class:`COCOMaskMAP` or ``None`` (plain DataLoaders without a file: no AP is logged).

    Raises:
        ValueError: the file has a number of categories other than ``num_classes``.
    """
    if ann_file is None:
        trainer = module._trainer  # noqa: SLF001 (``module.trainer`` raises when detached)
        datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
        ann_file = getattr(datamodule, "val_ann", None)
    if ann_file is None:
        return None
    metric = COCOMaskMAP(ann_file)
    if len(metric.category_ids) != num_classes:
        raise ValueError(
            f"{ann_file} has {len(metric.category_ids)} categories but the model has num_classes="
            f"{num_classes}; COCO AP needs label k to be the file's k-th category"
        )
    return metric


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
