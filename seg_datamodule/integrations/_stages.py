"""Test, predict and loss health shared by the integration modules (YOLO11-seg, Mask R-CNN).

:class:`EvaluationStages` gives a LightningModule that has ``predict_batch(batch)`` (one dict of
canvas detections per image: ``boxes``, ``scores``, contiguous ``labels``, ``masks``) what the
demo model has: ``trainer.test`` scores the detections with COCO AP on the DataModule's test file
(``test/{segm,bbox}_{AP,...}``; federated LVIS AP for an LVIS file, none for an image-info file),
``trainer.predict`` returns :class:`~seg_datamodule.evaluation.CocoDetections` in original pixels
and COCO category ids (what :class:`~seg_datamodule.COCOResultsWriter` writes), and a validation
after ``trainer.validate(ckpt_path=...)`` prints the checkpoint's epoch, not 0.

:func:`check_loss` names a non-finite loss once, with the step and the loss terms that are not
finite: in training it stops the run (``on_nonfinite_loss: stop``, the default: an
:class:`~seg_datamodule.InterruptCheckpoint` in the config saves the weights that produced it,
as for Ctrl-C) or skips the batch (``skip``: no backward, no optimiser step; counted and named
once); in validation it is said once per validation run.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any, Mapping

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor

from seg_datamodule.errors import UserInputError
from seg_datamodule.evaluation import COCOMaskMAP
from seg_datamodule.evaluation.predictions import CocoDetections
from seg_datamodule.evaluation.results import batch_detections
from seg_datamodule.integrations._coco import log_coco_results, make_coco_metric

__all__ = ["EvaluationStages", "NON_FINITE_CHOICES", "NonFiniteLossError", "OnceFilter", "check_loss"]

#: What ``on_nonfinite_loss`` can say, the default first.
NON_FINITE_CHOICES = ("stop", "skip")


class NonFiniteLossError(UserInputError, RuntimeError):
    """A training loss that is NaN or infinite (``on_nonfinite_loss: stop``)."""


def check_loss(module: L.LightningModule, loss: Tensor, terms: Mapping[str, Tensor], stage: str) -> bool:
    """Whether ``loss`` is finite; if not, say so once (with the step and the terms) or stop.

    Args:
        module: the LightningModule (its ``hparams.on_nonfinite_loss``, trainer, step).
        loss: the loss to back-propagate (training) or log (validation).
        terms: its named terms (``box_loss``, ``loss_mask``, ...).
        stage: ``"train"`` or ``"val"``.

    Returns:
        True when the loss is finite (train: back-propagate it; False: skip the batch).

    Raises:
        NonFiniteLossError: in training with ``on_nonfinite_loss: stop`` (the default).
    """
    value = float(loss.detach().float().sum())
    if math.isfinite(value):
        return True
    bad = ", ".join(f"{name} {float(t.detach().float().sum()):g}" for name, t in terms.items()
                    if not math.isfinite(float(t.detach().float().sum()))) or "none of its terms alone"
    trainer = module.trainer
    where = f"step {trainer.global_step} (epoch {trainer.current_epoch})"
    if stage == "train":
        if module.hparams.get("on_nonfinite_loss", "stop") == "stop":
            raise NonFiniteLossError(
                f"{type(module).__name__}: the training loss is {value:g} at {where}; not finite: {bad}. Usually "
                "a learning rate too high for the batch, or fp16 overflow: lower lr, raise warmup_steps, or train "
                "in 32-true; on_nonfinite_loss: skip (--model.on_nonfinite_loss skip) skips such batches")
        skipped = getattr(module, "_nonfinite_skipped", 0) + 1
        module._nonfinite_skipped = skipped  # noqa: SLF001
        if skipped == 1:
            # Lightning's own line for a training_step that returns None would repeat what this one says.
            warnings.filterwarnings("ignore", message="`training_step` returned `None`", category=UserWarning)
            rank_zero_warn(f"{type(module).__name__}: a non-finite training loss at {where} ({bad}): the batch is "
                           "skipped (on_nonfinite_loss: skip); later ones are counted, not printed")
        return False
    run = (trainer.global_step, trainer.current_epoch, str(trainer.state.fn))
    if getattr(module, "_nonfinite_val_run", None) != run:
        module._nonfinite_val_run = run  # noqa: SLF001
        rank_zero_warn(f"{type(module).__name__}: a non-finite {stage} loss ({value:g}) in the validation at {where}; "
                       f"not finite: {bad}")
    return False


class OnceFilter(logging.Filter):
    """Lets a peer's per-batch console line through once, with ``hint`` appended; drops its repeats.

    Ultralytics' NMS logs "NMS time limit ... exceeded" for every batch it gives up on (35 times
    in one CPU validation); :meth:`install` puts one such filter on its logger, once per process.

    Args:
        prefix: the start of the message to say once.
        hint: words appended to the one line (what to change).
    """

    def __init__(self, prefix: str, hint: str) -> None:
        super().__init__()
        self.prefix, self.hint, self.seen = prefix, hint, 0

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(self.prefix):
            return True
        self.seen += 1
        record.msg, record.args = f"{message} ({self.hint}; said once, not per batch)", ()
        return self.seen == 1

    @classmethod
    def install(cls, logger: logging.Logger, prefix: str, hint: str) -> "OnceFilter":
        """The filter of ``prefix`` on ``logger``, added unless one is there already."""
        for existing in logger.filters:
            if isinstance(existing, cls) and existing.prefix == prefix:
                return existing
        once = cls(prefix, hint)
        logger.addFilter(once)
        return once


class EvaluationStages:
    """``test`` and ``predict`` for a LightningModule with ``predict_batch`` (see the module docstring).

    The module sets ``detections_name`` (a few words for the printed AP line) and
    ``self.test_metric = None`` in its ``__init__`` (a metric is a submodule: a class attribute
    would hide it), has ``num_classes`` and ``hparams.coco_eval``, and calls :meth:`setup_stage`
    from its ``setup``.
    """

    detections_name = "detections"
    test_metric: COCOMaskMAP | None
    #: COCO category id of each label, from the DataModule at ``on_predict_start``.
    category_ids: list[int] | None = None
    #: The epoch of the checkpoint restored (None: none), for what a validation prints.
    checkpoint_epoch: int | None = None

    def setup_stage(self, stage: str) -> None:
        """Make the test metric of the DataModule's test file (``coco_eval``)."""
        if stage == "test" and self.hparams.coco_eval and self.test_metric is None:  # type: ignore[attr-defined]
            self.test_metric = make_coco_metric(self, None, self.num_classes, "test")  # type: ignore[arg-type,attr-defined]
            if self.test_metric is None:
                rank_zero_info(f"{type(self).__name__}: the test split has no annotations (an image-info file): no AP; "
                               "predict writes its results for a server to score")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        """The detections go into the test metric."""
        if self.test_metric is not None and len(batch):
            self.test_metric.update(self.predict_batch(batch), batch)  # type: ignore[attr-defined]

    def on_test_epoch_end(self) -> None:
        """Logs COCO ``test/{segm,bbox}_{AP,...}`` of the detections and prints both APs."""
        log_coco_results(self, self.test_metric, self.detections_name, "test")  # type: ignore[arg-type]

    def on_predict_start(self) -> None:
        """Take the DataModule's category ids (for a folder to predict, restored from the checkpoint by now)."""
        trainer = self._trainer  # type: ignore[attr-defined]
        datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
        if datamodule is not None and hasattr(type(datamodule), "category_ids"):
            self.category_ids = [int(c) for c in datamodule.category_ids]

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> CocoDetections:
        """The batch's detections in original-image pixels and COCO category ids (masks as RLE).

        Raises:
            RuntimeError: no category ids (predicting without a DataModule that has ``category_ids``).
        """
        if self.category_ids is None:
            raise RuntimeError(f"{type(self).__name__}.predict_step needs category_ids: predict with a "
                               "COCOSegDataModule, or set model.category_ids to the COCO id of each label")
        preds = self.predict_batch(batch) if len(batch) else []  # type: ignore[attr-defined]
        return batch_detections(preds, batch, self.category_ids)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the checkpoint's epoch, for what a validation or test from it prints."""
        epoch = checkpoint.get("epoch")
        self.checkpoint_epoch = int(epoch) if isinstance(epoch, int) else None
