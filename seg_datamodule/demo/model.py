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

The loss pieces are pure functions over tensors in :mod:`~seg_datamodule.demo.losses`; the
LightningModule only wires them.

Validation also reports COCO mask and box AP (``val/segm_AP``, ``val/bbox_AP``, ...) with
:class:`~seg_datamodule.evaluation.COCOMaskMAP` against the validation annotation file. The
"detections" are the ground-truth boxes this model is given, each with its predicted class, class
probability and box-cropped mask, so ``val/bbox_AP`` measures classification alone and
``val/segm_AP`` classification and masks: an upper bound for a YOLACT with a perfect box head,
not a number to compare with a published detector.

Test (``trainer.test``) scores the DataModule's ``test_ann`` split the same way, logged as
``test/segm_AP``, ``test/bbox_AP``, ... when that file has annotations (an image-info file such
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
import os
from pathlib import Path
from typing import Any, NamedTuple

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from lightning.pytorch.utilities import rank_zero_info
from torchvision.ops import roi_align

from seg_datamodule.demo.losses import assemble_masks, box_predictions, mask_iou, mask_loss
from seg_datamodule.evaluation import COCOMaskMAP, CocoDetections, LVISMaskMAP
from seg_datamodule.evaluation.lvis_eval import LVISFileError
from seg_datamodule.evaluation.results import batch_detections
from seg_datamodule.structures import DetectionBatch

__all__ = ["YolactLite", "YolactOutput"]

# ImageNet statistics in uint8 units; any fixed statistics would do for a model trained from scratch.
_MEAN = (123.675, 116.28, 103.53)
_STD = (58.395, 57.12, 57.375)
_FEATURE_STRIDE = 8  # the stride the coefficients are pooled from
_POOL = 7  # roi_align output side


# ------------------------------------------------------------------------------ pure functions


class YolactOutput(NamedTuple):
    """What :meth:`YolactLite.forward` returns.

    Attributes:
        protos (Tensor[B, k, Hp, Wp] float): prototype maps on the mask grid.
        coefficients (Tensor[N, k] float): per-instance coefficients in ``[-1, 1]``.
        class_logits (Tensor[N, C] float): per-instance class logits.
        mask_logits (Tensor[N, Hp, Wp] float): per-instance mask logits (not cropped).
    """

    protos: Tensor
    coefficients: Tensor
    class_logits: Tensor
    mask_logits: Tensor


def _check_datamodule_agrees(val_ann: str | None, mask_stride: int, datamodule: Any) -> None:
    """Refuse a model whose ``val_ann`` or ``mask_stride`` contradicts the DataModule's.

    Args:
        val_ann: the model's own ``val_ann`` (``None``: take the DataModule's).
        mask_stride: the model's prototype stride.
        datamodule: the Trainer's DataModule, or ``None`` (plain DataLoaders: nothing to check).

    Raises:
        ValueError: naming both files, or both strides.
    """
    dm_ann = getattr(datamodule, "val_ann", None)
    if val_ann is not None and dm_ann is not None and not _same_file(val_ann, dm_ann):
        raise ValueError(
            f"YolactLite(val_ann={str(val_ann)!r}) differs from the DataModule's val_ann={str(dm_ann)!r}; "
            "the model scores the DataModule's validation images, so leave the model's val_ann unset "
            "(it takes the DataModule's) or give both the same file"
        )
    dm_stride = getattr(datamodule, "mask_stride", None)
    if isinstance(dm_stride, int) and dm_stride != mask_stride:
        raise ValueError(
            f"YolactLite(mask_stride={mask_stride}) differs from the DataModule's mask_stride={dm_stride}; "
            "the prototype grid must be the masks' grid"
        )


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file (resolved; by inode when both exist)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def _conv(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class YolactLite(L.LightningModule):
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
        super().__init__()
        for name, value in (("num_classes", num_classes), ("num_prototypes", num_prototypes), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if mask_stride not in (2, 4, 8):
            raise ValueError(f"mask_stride must be 2, 4 or 8, got {mask_stride!r}")
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr!r}")
        if weight_decay < 0 or cls_weight < 0:
            raise ValueError(f"weight_decay and cls_weight must be >= 0, got {weight_decay!r}, {cls_weight!r}")
        # val_ann is left out of the hyperparameters: the DataModule logs its own, and Lightning
        # refuses a key logged by both with different values (the model's default is None).
        self.save_hyperparameters(ignore=["val_ann"])
        self.val_ann = val_ann
        self.num_classes = num_classes
        self.num_prototypes = num_prototypes
        self.mask_stride = mask_stride
        #: Made at ``setup`` once the annotation file is known (see ``val_ann``).
        self.coco_metric: COCOMaskMAP | None = None
        #: Made at ``setup("test")`` from the DataModule's ``test_ann`` when it has annotations.
        self.test_metric: COCOMaskMAP | None = None
        #: COCO category id of each label, for ``predict_step`` (the DataModule's, at ``setup``).
        self.category_ids: list[int] | None = None
        self.register_buffer("pixel_mean", torch.tensor(_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(_STD).view(1, 3, 1, 1), persistent=False)

        w = width
        # Backbone: strided 3x3 blocks, /2 /4 /8 /16; the /16 stage adds context to /8.
        self.stem = _conv(3, w, 2)
        self.stage4 = nn.Sequential(_conv(w, 2 * w, 2), _conv(2 * w, 2 * w))
        self.stage8 = nn.Sequential(_conv(2 * w, 4 * w, 2), _conv(4 * w, 4 * w))
        self.stage16 = nn.Sequential(_conv(4 * w, 8 * w, 2), _conv(8 * w, 8 * w))
        self.top_down = nn.Conv2d(8 * w, 4 * w, 1)
        self.p8 = _conv(4 * w, 4 * w)
        # ProtoNet: /8 -> upsample to the mask grid, plus a /4 skip for sharp edges.
        self.proto_in = _conv(4 * w, 2 * w)
        self.proto_skip = nn.Conv2d(2 * w, 2 * w, 1)
        self.proto_out = nn.Sequential(_conv(2 * w, 2 * w), nn.Conv2d(2 * w, num_prototypes, 1), nn.ReLU())
        # Per-instance head on roi-aligned /8 features: no batch norm, so one instance works.
        self.roi_conv = nn.Sequential(nn.Conv2d(4 * w, 2 * w, 3, padding=1), nn.ReLU(inplace=True))
        self.roi_fc = nn.Sequential(nn.Flatten(), nn.Linear(2 * w * _POOL * _POOL, 8 * w), nn.ReLU(inplace=True))
        self.coefficient_head = nn.Linear(8 * w, num_prototypes)
        self.class_head = nn.Linear(8 * w, num_classes)

    # -------------------------------------------------------------------------------- forward

    def features(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """Backbone and ProtoNet.

        Args:
            images (Tensor[B, 3, H, W] uint8): RGB images.

        Returns:
            p8 (Tensor[B, 4w, ceil(H/8), ceil(W/8)] float) and
            protos (Tensor[B, k, ceil(H/s), ceil(W/s)] float), s = ``mask_stride``.
        """
        height, width = images.shape[-2:]
        x = (images.float() - self.pixel_mean) / self.pixel_std
        c4 = self.stage4(self.stem(x))
        c8 = self.stage8(c4)
        c16 = self.stage16(c8)
        p8 = self.p8(c8 + F.interpolate(self.top_down(c16), size=c8.shape[-2:], mode="nearest"))
        grid = (-(-height // self.mask_stride), -(-width // self.mask_stride))
        proto = F.interpolate(self.proto_in(p8), size=grid, mode="bilinear", align_corners=False)
        skip = self.proto_skip(c4)
        if skip.shape[-2:] != grid:
            skip = F.interpolate(skip, size=grid, mode="bilinear", align_corners=False)
        protos = self.proto_out(proto + skip)
        return p8, protos

    def forward(self, images: Tensor, boxes: Tensor, boxes_per_image: Tensor) -> YolactOutput:
        """Prototypes, and coefficients, class logits and mask logits at the given boxes.

        Args:
            images (Tensor[B, 3, H, W] uint8): RGB images.
            boxes (Tensor[N, 4] float32): xyxy boxes in canvas pixels, image after image.
            boxes_per_image (Tensor[B] int64): boxes per image; sums to N.

        Returns:
            :class:`YolactOutput`.
        """
        p8, protos = self.features(images)
        image_index = torch.repeat_interleave(
            torch.arange(images.shape[0], device=boxes.device), boxes_per_image.to(boxes.device)
        )
        # float32 whatever the autocast dtype: bf16 would move a box by up to 2 px at 640.
        rois = torch.cat([image_index[:, None].float(), boxes.float()], dim=1)
        pooled = roi_align(
            p8.float(), rois, output_size=_POOL, spatial_scale=1.0 / _FEATURE_STRIDE, sampling_ratio=2, aligned=True
        ).to(p8.dtype)
        hidden = self.roi_fc(self.roi_conv(pooled))
        coefficients = torch.tanh(self.coefficient_head(hidden))
        class_logits = self.class_head(hidden)
        mask_logits = assemble_masks(protos, coefficients, boxes_per_image)
        return YolactOutput(protos, coefficients, class_logits, mask_logits)

    # ------------------------------------------------------------------------------ the steps

    def compute_losses(self, batch: DetectionBatch) -> tuple[dict[str, Tensor], YolactOutput]:
        """The losses of a batch and the forward pass they came from.

        Args:
            batch: a collated batch; its ``mask_stride`` must equal the model's.

        Returns:
            ``{"loss", "mask_loss", "cls_loss"}`` scalar tensors (``loss`` is what is
            back-propagated; a batch without instances gives a zero connected to every
            parameter) and the :class:`YolactOutput`.

        Raises:
            ValueError: the batch's ``mask_stride`` differs from the model's.
        """
        if batch.mask_stride != self.mask_stride:
            raise ValueError(
                f"the batch's masks are at mask_stride={batch.mask_stride} but the model predicts "
                f"prototypes at mask_stride={self.mask_stride}; set the same stride on both"
            )
        out = self(batch.images, batch.boxes, batch.boxes_per_image)
        m_loss = mask_loss(out.mask_logits, batch.masks, batch.boxes, batch.mask_stride)
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
        """Make the COCO metric once the validation annotation file is known.

        Lightning calls this after the DataModule's ``setup``, so its ``val_ann`` is resolved
        (the demo dataset's, when no files were given).
        """
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        _check_datamodule_agrees(self.val_ann, self.mask_stride, datamodule)
        if stage in ("test", "predict"):
            self._setup_held_out(stage)
            return
        if not self.hparams.coco_eval or self.coco_metric is not None or stage not in ("fit", "validate"):
            return
        ann_file = self.val_ann if self.val_ann is not None else getattr(datamodule, "val_ann", None)
        if ann_file is None:
            return
        metric = COCOMaskMAP(ann_file)
        try:
            num_categories = len(metric.category_ids)
        except LVISFileError:  # an LVIS file: federated LVIS AP instead
            metric = LVISMaskMAP(ann_file)
            num_categories = len(metric.category_ids)
        if num_categories != self.num_classes:
            raise ValueError(
                f"{ann_file} has {num_categories} categories but the model has num_classes="
                f"{self.num_classes}; COCO AP needs label k to be the file's k-th category"
            )
        self.coco_metric = metric

    def _setup_held_out(self, stage: str) -> None:
        """Test: a COCO metric on the DataModule's ``test_ann`` (if annotated); both: category ids."""
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None and getattr(datamodule, "category_ids", None) is not None:
            self.category_ids = [int(c) for c in datamodule.category_ids]
        ann_file = getattr(datamodule, "test_ann", None)
        if stage != "test" or not self.hparams.coco_eval or ann_file is None or self.test_metric is not None:
            return
        metric = COCOMaskMAP(ann_file)
        if not metric.coco.dataset.get("annotations"):
            rank_zero_info(f"{ann_file} has no annotations (an image-info file): test/ logs the losses, no COCO AP")
            return
        if len(metric.category_ids) != self.num_classes:
            raise ValueError(
                f"{ann_file} has {len(metric.category_ids)} categories but the model has num_classes="
                f"{self.num_classes}; COCO AP needs label k to be the file's k-th category"
            )
        self.test_metric = metric

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
        if num_instances:
            iou = mask_iou(out.mask_logits, batch.masks, batch.boxes, batch.mask_stride).mean()
            accuracy = (out.class_logits.argmax(dim=1) == batch.labels).float().mean()
            self.log("val/mask_iou", iou, prog_bar=True, batch_size=num_instances)
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
        names = ("AP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large", "APs", "APm", "APl", "APr", "APc", "APf")
        logged = {f"val/{k}": v for k, v in results.items() if k.split("_", 1)[1] in names}
        for name, value in logged.items():
            # The same value on every rank; sync_dist keeps Lightning's epoch-level DDP check quiet.
            self.log(name, value, prog_bar=name == "val/segm_AP", sync_dist=True)
        if not self.trainer.sanity_checking:
            rank_zero_info(
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
        names = ("AP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large")
        for name, value in results.items():
            if name.split("_", 1)[1] in names:
                self.log(f"test/{name}", value, sync_dist=True)
        rank_zero_info(f"COCO test segm AP {results['segm_AP']:.4f}, bbox AP {results['bbox_AP']:.4f} "
                       "(at the ground-truth boxes)")

    def predict_boxes(self, batch: DetectionBatch) -> tuple[Tensor, Tensor]:
        """The boxes :meth:`predict_step` pools at: each image's own boxes, or its whole-image box.

        Args:
            batch: a predict (no targets) or test / validation batch.

        Returns:
            boxes (Tensor[N, 4] float32) xyxy canvas pixels, boxes_per_image (Tensor[B] int64).
        """
        given = batch.boxes.float().split(batch.boxes_per_image.tolist())
        height, width = batch.images.shape[-2:]
        boxes = []
        for b, own in enumerate(given):
            if len(own):
                boxes.append(own)
                continue
            # The image without its letterbox pad: pad .. pad + size * scale, inside the canvas.
            pad, size, scale = batch.pads[b].float(), batch.orig_sizes[b].flip(0).float(), batch.scales[b].float()
            box = torch.cat([pad, pad + size * scale]).clamp(min=0.0)
            box = torch.minimum(box, box.new_tensor([width, height, width, height], dtype=torch.float32))
            boxes.append(box[None])
        per_image = torch.tensor([len(b) for b in boxes], dtype=torch.int64, device=batch.boxes.device)
        return (torch.cat(boxes) if boxes else batch.boxes.new_zeros((0, 4))), per_image

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
        total = self.trainer.estimated_stepping_batches if self._trainer is not None else math.inf
        if not self.hparams.cosine_schedule or not math.isfinite(total) or total < 1:
            return optimizer
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=int(total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
