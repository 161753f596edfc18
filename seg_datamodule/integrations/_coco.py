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

__all__ = ["AP_NAMES", "log_coco_results", "make_coco_metric", "shown_epoch"]

#: The COCO numbers logged per IoU type, as ``val/{segm,bbox}_<name>``.
AP_NAMES = ("AP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large")


def make_coco_metric(module: L.LightningModule, ann_file: str | None, num_classes: int,
                     stage: str = "validate") -> COCOMaskMAP | None:
    """The validation (or test) metric of a module, or ``None`` when no annotated file is known.

    Args:
        module: the LightningModule (its trainer's DataModule is asked for the stage's file).
        ann_file: an explicit annotation file; ``None`` takes the DataModule's.
        num_classes: the model's class count; must equal the file's number of categories.
        stage: ``"validate"`` or ``"test"``: which of the DataModule's files.

    Returns:
        :class:`COCOMaskMAP` (:class:`~seg_datamodule.evaluation.LVISMaskMAP` for an LVIS file)
        or ``None`` (plain DataLoaders without a file, or a file without annotations: no AP).

    Raises:
        ValueError: the file has a number of categories other than ``num_classes``.
    """
    if ann_file is None:
        trainer = module._trainer  # noqa: SLF001 (``module.trainer`` raises when detached)
        ann_file = stage_file(getattr(trainer, "datamodule", None) if trainer is not None else None, stage)
    return None if ann_file is None else metric_for_file(ann_file, num_classes)


def shown_epoch(module: L.LightningModule) -> int:
    """The epoch a printed result belongs to: the current one while fitting, else the checkpoint's.

    ``trainer.validate(ckpt_path=...)`` restores the weights, not the fit loop, so
    ``current_epoch`` reads 0 there; the epoch the checkpoint was saved in is kept by
    ``on_load_checkpoint`` (``module.checkpoint_epoch``).
    """
    trainer = module._trainer  # noqa: SLF001
    fitting = trainer is not None and str(getattr(trainer.state.fn, "value", trainer.state.fn)) == "fit"
    saved = getattr(module, "checkpoint_epoch", None)
    return int(module.current_epoch) if fitting or saved is None else int(saved)


def log_coco_results(module: L.LightningModule, metric: COCOMaskMAP | None, what: str,
                     prefix: str = "val") -> dict[str, Any] | None:
    """Compute, reset and log ``{prefix}/{segm,bbox}_{AP,...}``; print both APs after a real validation or test.

    Args:
        module: the LightningModule that logs.
        metric: its metric (nothing happens when ``None`` or never updated).
        what: a few words for the printed line (what the detections are).
        prefix: ``"val"`` or ``"test"``.

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
            module.log(f"{prefix}/{name}", value, prog_bar=name == "segm_AP", sync_dist=True)
    if not module.trainer.sanity_checking:
        kind = "LVIS" if type(metric).__name__.startswith("LVIS") else "COCO"
        print_summary(
            module.trainer,
            f"epoch {shown_epoch(module)}: {kind} {prefix} segm AP {float(results['segm_AP']):.4f}, "
            f"bbox AP {float(results['bbox_AP']):.4f} ({what})"
        )
    return results
