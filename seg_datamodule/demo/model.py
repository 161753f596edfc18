"""YolactLite: a small YOLACT-style instance-segmentation model for the demo and the tests.

YOLACT (Bolya et al., 2019, https://arxiv.org/abs/1904.02689) predicts ``k`` prototype masks per
image and ``k`` coefficients per instance; an instance's mask is the linear combination of the
prototypes, cropped to its box. This demo model keeps that mask path intact and drops the dense
detection head: coefficients and class logits are pooled at the *ground-truth* boxes with
``roi_align``, so the model learns masks and classes from a :class:`DetectionBatch` in a minute
or two on a CPU, which is what the demo needs (exercising the data path, not detecting).

Data path inside the model::

    images (B,3,H,W) uint8 -> normalise -> backbone -> p8 (B,4w,H/8,W/8) --roi_align at boxes--> head
                                                 \\-> ProtoNet -> protos (B,k,Hp,Wp), Hp = ceil(H/4)
    mask_logits[n] = coefficients[n] @ protos[image of n]                          (N, Hp, Wp)

The network is :class:`~seg_datamodule.demo.network.YolactNet`, which this LightningModule
subclasses (so the layers' names are the ``state_dict`` keys); the loss pieces are pure functions
over tensors in :mod:`~seg_datamodule.demo.losses`, and the metrics and the predict boxes come from
:mod:`~seg_datamodule.demo.scoring`: the LightningModule only wires them.

Validation also reports COCO mask and box AP (``val/segm_AP``, ``val/bbox_AP``, ...) with
:class:`~seg_datamodule.evaluation.COCOMaskMAP` against the validation annotation file. The
"detections" are the ground-truth boxes this model is given, each with its predicted class, class
probability and box-cropped mask, so ``val/bbox_AP`` measures classification alone and
``val/segm_AP`` classification and masks: an upper bound for a YOLACT with a perfect box head,
not a number to compare with a published detector.

Test (``trainer.test``) scores the DataModule's ``test_ann`` split the same way (LVIS AP for an
LVIS file), logged as ``test/segm_AP``, ``test/bbox_AP``, ... when that file has annotations (an image-info file such
as COCO test-dev has none: then only the losses are logged, over no targets).

Predict (``trainer.predict``) has no ground truth to pool at. This model has no box head and was
never taught to tell objects from background, so it cannot propose boxes; what it can do
faithfully is classify and segment a region it is given. :meth:`YolactLite.predict_step` therefore
pools at the batch's boxes where an image has some (a test or validation loader), and otherwise
at one whole-image box (the letterboxed image without its pad): one detection per image, its most
probable class with that probability as the score, and the mask of that class's object over the
whole image. Swap in a model with a detection head for real detections; the
:class:`~seg_datamodule.evaluation.writer.COCOResultsWriter` takes any model's output.

Not included: the "rasterise in training_step" variant the step-split benchmark compares
against; it belongs in the benchmark, which can rasterise polygons itself and hand this model an
ordinary batch.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from lightning.pytorch.utilities import rank_zero_info

from seg_datamodule.console import print_summary
from seg_datamodule.data.loaders.repeat_factors import scheduled_steps
from seg_datamodule.demo.losses import box_predictions, mask_iou, mask_loss
from seg_datamodule.demo.network import YolactNet, YolactOutput
from seg_datamodule.demo.scoring import TEST_STATS, VAL_STATS, check_datamodule_agrees, picked_stats, prediction_boxes
from seg_datamodule.evaluation import COCOMaskMAP, CocoDetections, LVISMaskMAP
from seg_datamodule.evaluation.choose import metric_for_file, stage_file
from seg_datamodule.evaluation.results import batch_detections
from seg_datamodule.ops.checks import check_bool, check_int, check_number
from seg_datamodule.structures import DetectionBatch

__all__ = ["YolactLite", "YolactOutput"]


class YolactLite(YolactNet, L.LightningModule):
    """A small YOLACT-style model trained from a :class:`DetectionBatch`.

    Args:
        num_classes (int): C, the number of contiguous class indices in the labels.
        num_prototypes (int): k, prototype maps per image.
        width (int): channels of the first stage; later stages use 2x, 4x and 8x.
        mask_stride (int): stride of the prototype grid; must equal the batches' ``mask_stride``.
        lr (float): AdamW learning rate.
        weight_decay (float): AdamW weight decay.
        cls_weight (float): weight of the class loss against the mask loss.
        cosine_schedule (bool): decay the learning rate to 0 over the run along a cosine (when
            the run's length is known); otherwise it stays constant.
        coco_eval (bool): log COCO mask and box AP in validation (``val/segm_AP``,
            ``val/bbox_AP``, ...; see the module docstring for what they measure here), when an
            annotation file is known.
        val_ann (str | None): the COCO JSON to evaluate against (an LVIS file is scored with
            :class:`~seg_datamodule.evaluation.LVISMaskMAP`, which also logs ``APr`` / ``APc`` /
            ``APf``); ``None`` (the usual choice)
            takes the DataModule's ``val_ann`` at ``setup`` (a
            :class:`~seg_datamodule.data.datamodule.COCOSegDataModule` has one); with neither
            (plain DataLoaders), no AP is logged. It is not saved as a hyperparameter: the
            DataModule already logs ``val_ann``, and Lightning refuses a key that the model and the
            DataModule log with different values.

    Raises:
        TypeError: an argument of the wrong type (``"4"`` for an int, a bool for a number).
        ValueError: an argument is out of range, or (at ``setup``) the annotation file has a
            number of categories other than ``num_classes``, ``val_ann`` names another file than
            the DataModule's ``val_ann``, or the DataModule's ``mask_stride`` differs.
    """

    def __init__(
        self,
        num_classes: int,
        num_prototypes: int = 16,
        width: int = 16,
        mask_stride: int = 4,
        lr: float = 3e-3,
        weight_decay: float = 1e-4,
        cls_weight: float = 1.0,
        cosine_schedule: bool = True,
        coco_eval: bool = True,
        val_ann: str | None = None,
    ) -> None:
        # The package's one argument checker: TypeError for a wrong type, ValueError for a bad value.
        for name, value in (("num_classes", num_classes), ("num_prototypes", num_prototypes), ("width", width)):
            check_int(name, value, 1)
        if check_int("mask_stride", mask_stride, 2) not in (2, 4, 8):
            raise ValueError(f"mask_stride must be 2, 4 or 8, got {mask_stride!r}")
        if check_number("lr", lr, 0.0) == 0.0:
            raise ValueError(f"lr must be > 0, got {lr!r}")
        check_number("weight_decay", weight_decay, 0.0)
        check_number("cls_weight", cls_weight, 0.0)
        check_bool("cosine_schedule", cosine_schedule)
        check_bool("coco_eval", coco_eval)
        # YolactNet runs Lightning's own set-up (next in the MRO), then builds the layers.
        super().__init__(num_classes, num_prototypes, width, mask_stride)
        # val_ann is left out of the hyperparameters: the DataModule logs its own, and Lightning
        # refuses a key logged by both with different values (the model's default is None).
        self.save_hyperparameters(ignore=["val_ann"])
        self.val_ann = val_ann
        #: Made at ``setup`` once the annotation file is known (see ``val_ann``).
        self.coco_metric: COCOMaskMAP | None = None
        #: Made at ``setup("test")`` from the DataModule's ``test_ann`` when it has annotations.
        self.test_metric: COCOMaskMAP | None = None
        #: COCO category id of each label, for ``predict_step`` (the DataModule's, at the start of predict).
        self.category_ids: list[int] | None = None

    # ------------------------------------------------------------------------------ the steps

    def compute_losses(self, batch: DetectionBatch) -> tuple[dict[str, Tensor], YolactOutput]:
        """The losses of a batch and the forward pass they came from.

        Args:
            batch: a collated batch; its ``mask_stride`` must equal the model's.

        Returns:
            ``{"loss", "mask_loss", "cls_loss"}`` scalar tensors (``loss`` is what is
            back-propagated; a batch without instances gives a zero connected to every
            parameter) and the :class:`YolactOutput`. The class loss (the demo's per-box loss)
            takes every target; the mask loss only those with a mask (``batch.has_mask``).

        Raises:
            ValueError: the batch's ``mask_stride`` differs from the model's.
        """
        if batch.mask_stride != self.mask_stride:
            raise ValueError(
                f"the batch's masks are at mask_stride={batch.mask_stride} but the model predicts "
                f"prototypes at mask_stride={self.mask_stride}; set the same stride on both"
            )
        out = self(batch.images, batch.boxes, batch.boxes_per_image)
        # Box-only targets (box_only: keep) have an all-False mask row, not a mask: no mask loss.
        with_mask = slice(None) if batch.has_mask is None else batch.has_mask
        m_loss = mask_loss(out.mask_logits[with_mask], batch.masks[with_mask], batch.boxes[with_mask],
                           batch.mask_stride)
        if batch.labels.numel():
            c_loss = F.cross_entropy(out.class_logits, batch.labels)
        else:
            c_loss = out.class_logits.sum() * 0.0
        # protos.sum() * 0 keeps every parameter in the graph on a batch without instances.
        total = m_loss + self.hparams.cls_weight * c_loss + out.protos.sum() * 0.0
        return {"loss": total, "mask_loss": m_loss, "cls_loss": c_loss}, out

    def training_step(self, batch: DetectionBatch, batch_idx: int) -> Tensor:
        """Mask + class loss; logs ``train/loss``, ``train/mask_loss``, ``train/cls_loss``."""
        losses, _ = self.compute_losses(batch)
        for name, value in losses.items():
            self.log(f"train/{name}", value, prog_bar=True, batch_size=len(batch))
        return losses["loss"]

    def setup(self, stage: str) -> None:
        """Make the metric of the stage's annotation file (the DataModule's ``evaluation_file(stage)``).

        Lightning calls this after the DataModule's ``setup``, so its files are resolved (the demo
        dataset's, when no split was named). COCO AP, or federated LVIS AP for an LVIS file, in
        validation and test alike; no metric for an image-info file.
        """
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        check_datamodule_agrees(self.val_ann, self.mask_stride, datamodule)
        if not self.hparams.coco_eval:
            return
        if stage in ("fit", "validate") and self.coco_metric is None:
            ann_file = self.val_ann if self.val_ann is not None else stage_file(datamodule, "validate")
            self.coco_metric = None if ann_file is None else metric_for_file(ann_file, self.num_classes)
        elif stage == "test" and self.test_metric is None:
            ann_file = stage_file(datamodule, "test")
            self.test_metric = None if ann_file is None else metric_for_file(ann_file, self.num_classes)
            if ann_file is not None and self.test_metric is None:
                rank_zero_info(f"{ann_file} has no annotations (an image-info file): test/ logs the losses, no AP")

    def on_predict_start(self) -> None:
        """Take the DataModule's category ids (for a folder to predict, restored from the checkpoint by now)."""
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None and hasattr(type(datamodule), "category_ids"):
            self.category_ids = [int(c) for c in datamodule.category_ids]

    def validation_step(self, batch: DetectionBatch, batch_idx: int) -> None:
        """Logs ``val/loss``, ``val/mask_loss``, ``val/cls_loss``, ``val/mask_iou``, ``val/cls_acc``.

        ``val/mask_iou`` and ``val/cls_acc`` are averaged over instances (a batch without
        instances logs neither); the losses over images. With a COCO metric (see ``val_ann``),
        the batch's predictions at its boxes also go into it (:func:`box_predictions`).
        """
        losses, out = self.compute_losses(batch)
        for name, value in losses.items():
            self.log(f"val/{name}", value, prog_bar=name == "mask_loss", batch_size=len(batch))
        num_instances = int(batch.labels.numel())
        with_mask = slice(None) if batch.has_mask is None else batch.has_mask
        if int(batch.masks[with_mask].shape[0]):
            iou = mask_iou(out.mask_logits[with_mask], batch.masks[with_mask], batch.boxes[with_mask],
                           batch.mask_stride).mean()
            self.log("val/mask_iou", iou, prog_bar=True, batch_size=int(batch.masks[with_mask].shape[0]))
        if num_instances:
            accuracy = (out.class_logits.argmax(dim=1) == batch.labels).float().mean()
            self.log("val/cls_acc", accuracy, batch_size=num_instances)
        if self.coco_metric is not None:
            preds = box_predictions(batch.boxes, out.class_logits, out.mask_logits, batch.boxes_per_image,
                                    batch.mask_stride)
            self.coco_metric.update(preds, batch)

    def on_validation_epoch_end(self) -> None:
        """Logs COCO ``val/{segm,bbox}_{AP,AP50,AP75,AP_small,AP_medium,AP_large}`` (all ranks'
        images, each once; evaluated on rank 0) and prints the two APs."""
        metric = self.coco_metric
        if metric is None or metric.update_count == 0:  # every rank validates, or none does
            return
        results = metric.compute()
        metric.reset()
        for name, value in picked_stats(results, "val", VAL_STATS).items():
            # The same value on every rank; sync_dist keeps Lightning's epoch-level DDP check quiet.
            self.log(name, value, prog_bar=name == "val/segm_AP", sync_dist=True)
        if not self.trainer.sanity_checking:
            print_summary(
                self.trainer,
                f"epoch {self.current_epoch}: {'LVIS' if isinstance(metric, LVISMaskMAP) else 'COCO'} val segm AP "
                f"{results['segm_AP']:.4f}, "
                f"bbox AP {results['bbox_AP']:.4f} (at the ground-truth boxes)"
            )

    def test_step(self, batch: DetectionBatch, batch_idx: int) -> None:
        """As :meth:`validation_step`, logged as ``test/...``; COCO AP in :meth:`on_test_epoch_end`."""
        losses, out = self.compute_losses(batch)
        for name, value in losses.items():
            self.log(f"test/{name}", value, batch_size=len(batch))
        if self.test_metric is not None:
            preds = box_predictions(batch.boxes, out.class_logits, out.mask_logits, batch.boxes_per_image,
                                    batch.mask_stride)
            self.test_metric.update(preds, batch)

    def on_test_epoch_end(self) -> None:
        """Logs COCO ``test/{segm,bbox}_{AP,AP50,AP75,AP_small,AP_medium,AP_large}`` (all ranks' images once)."""
        metric = self.test_metric
        if metric is None or metric.update_count == 0:
            return
        results = metric.compute()
        metric.reset()
        for name, value in picked_stats(results, "test", TEST_STATS).items():
            self.log(name, value, sync_dist=True)
        kind = "LVIS" if isinstance(metric, LVISMaskMAP) else "COCO"
        print_summary(self.trainer, f"{kind} test segm AP {results['segm_AP']:.4f}, bbox AP {results['bbox_AP']:.4f} "
                                    "(at the ground-truth boxes)")

    def predict_boxes(self, batch: DetectionBatch) -> tuple[Tensor, Tensor]:
        """The boxes :meth:`predict_step` pools at: each image's own boxes, or its whole-image box.

        Args:
            batch: a predict (no targets) or test / validation batch.

        Returns:
            boxes (Tensor[N, 4] float32) xyxy canvas pixels, boxes_per_image (Tensor[B] int64).
        """
        return prediction_boxes(batch)

    def predict_step(self, batch: DetectionBatch, batch_idx: int, dataloader_idx: int = 0) -> CocoDetections:
        """Detections in original-image pixels and COCO category ids, image by image.

        At :meth:`predict_boxes` (see the module docstring for what these detections are): each
        box's most probable class, its probability as the score, and the box-cropped mask mapped
        back through the batch's letterbox (:func:`~seg_datamodule.evaluation.results.batch_detections`).

        Returns:
            :class:`~seg_datamodule.evaluation.CocoDetections` (xywh boxes, RLE masks) on the CPU.

        Raises:
            RuntimeError: no category ids (predicting without a DataModule that has ``category_ids``).
        """
        if self.category_ids is None:
            raise RuntimeError("predict_step needs category_ids: predict with a COCOSegDataModule, or set "
                               "model.category_ids to the COCO id of each label")
        boxes, per_image = self.predict_boxes(batch)
        if len(batch) == 0:  # every image of the batch was bad (counted in batch.counts)
            return batch_detections([], batch, self.category_ids)
        out = self(batch.images, boxes, per_image)
        preds = box_predictions(boxes, out.class_logits, out.mask_logits, per_image, batch.mask_stride)
        return batch_detections(preds, batch, self.category_ids)

    def configure_optimizers(self) -> Any:
        """AdamW (no decay on norms and biases), with a per-step cosine decay when enabled."""
        decay, no_decay = [], []
        for param in self.parameters():
            (decay if param.ndim > 1 else no_decay).append(param)
        optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": self.hparams.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=self.hparams.lr,
        )
        total = scheduled_steps(self._trainer)  # each epoch's own length under repeat-factor sampling
        if not self.hparams.cosine_schedule or not math.isfinite(total) or total < 1:
            return optimizer
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=int(total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
