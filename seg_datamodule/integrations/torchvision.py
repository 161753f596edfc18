"""torchvision Mask R-CNN on this project's batches: ``to_torchvision`` and ``MaskRCNNModule``.

``to_torchvision`` turns a :class:`~seg_datamodule.structures.DetectionBatch` into the
``(images, targets)`` lists torchvision's detection models take: float images in ``[0, 1]``,
labels shifted by one (0 is torchvision's background), xyxy boxes in canvas pixels and masks at
the full canvas resolution. Those masks are exact when the DataModule runs with
``mask_stride: 1``; at a coarser stride each grid cell is repeated over the ``stride x stride``
pixels it covers (a nearest upsample, cropped to the canvas), so a mask edge is only as fine as
the grid.

``MaskRCNNModule`` wraps ``torchvision.models.detection.MaskRCNN`` on a ResNet-FPN backbone of
any name ``resnet_fpn_backbone`` knows, with random weights (nothing is downloaded), logs its five
losses and scores its real detections with :class:`~seg_datamodule.evaluation.COCOMaskMAP`.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn

from seg_datamodule.evaluation import COCOMaskMAP
from seg_datamodule.integrations._coco import log_coco_results, make_coco_metric
from seg_datamodule.integrations._optim import check_optim_args, configure_from_hparams
from seg_datamodule.structures import DetectionBatch

__all__ = ["MaskRCNNModule", "full_resolution_masks", "to_torchvision"]


def full_resolution_masks(masks: Tensor, canvas_size: tuple[int, int], stride: int) -> Tensor:
    """Stride-grid masks on the full canvas: each cell repeated over the pixels it covers.

    Args:
        masks (Tensor[N, Hp, Wp] bool): masks on the stride grid, ``Hp = ceil(H / stride)``.
        canvas_size (tuple[int, int]): (H, W).
        stride (int): the grid's stride (1 returns the masks unchanged).

    Returns:
        Tensor[N, H, W] bool.

    Raises:
        ValueError: the masks are not on the stride grid of the canvas.
    """
    height, width = canvas_size
    grid = (-(-height // stride), -(-width // stride))
    if masks.ndim != 3 or tuple(masks.shape[1:]) != grid:
        raise ValueError(f"masks must be (N, {grid[0]}, {grid[1]}) for a {height}x{width} canvas at stride {stride}, "
                         f"got {tuple(masks.shape)}")
    if stride == 1:
        return masks
    full = masks.repeat_interleave(stride, dim=1).repeat_interleave(stride, dim=2)
    return full[:, :height, :width]


def to_torchvision(batch: DetectionBatch) -> tuple[list[Tensor], list[dict[str, Tensor]]]:
    """The inputs of a torchvision detection model in training mode, on the batch's device.

    Args:
        batch: a collated batch.

    Returns:
        images: B tensors ``(3, H, W) float32`` RGB in ``[0, 1]``.
        targets: B dicts with ``boxes (Tensor[N_b, 4] float32)`` xyxy canvas pixels, ``labels
        (Tensor[N_b] int64)`` the batch's labels + 1, and ``masks (Tensor[N_b, H, W] uint8)`` on the
        full canvas (see :func:`full_resolution_masks`); an image without instances has ``N_b = 0``.
    """
    canvas = tuple(int(s) for s in batch.images.shape[-2:])
    images = [image.float().div_(255.0).contiguous() for image in batch.images]
    counts = batch.boxes_per_image.tolist()
    masks = full_resolution_masks(batch.masks, canvas, batch.mask_stride)
    targets = [
        {"boxes": boxes.float(), "labels": labels + 1, "masks": m.to(torch.uint8)}
        for boxes, labels, m in zip(batch.boxes.split(counts), batch.labels.split(counts), masks.split(counts))
    ]
    return images, targets


def build_mask_rcnn(
    num_classes: int, backbone: str, min_size: int, max_size: int, **kwargs: Any
) -> nn.Module:
    """A torchvision ``MaskRCNN`` with ``num_classes + 1`` outputs on a random-weight ResNet-FPN.

    Without pretrained weights every backbone stage trains and uses ``BatchNorm2d`` (frozen
    batch norm suits only pretrained statistics), as ``maskrcnn_resnet50_fpn(weights=None)`` does,
    and the mask head normalises each of its four convolutions with ``BatchNorm2d`` as
    ``maskrcnn_resnet50_fpn_v2`` does: without it a random backbone starts the mask logits near
    +-10 (mask loss ~6.5) and SGD diverges within a few steps.

    Args:
        num_classes: C, the classes without the background.
        backbone: a ``torchvision.models.detection.backbone_utils.resnet_fpn_backbone`` name
            (``"resnet18"``, ``"resnet50"``, ``"resnext50_32x4d"``, ...).
        min_size, max_size: torchvision's internal resize (``GeneralizedRCNNTransform``).
        **kwargs: further ``MaskRCNN`` arguments (``box_detections_per_img``, ...).
    """
    from torchvision.models.detection import MaskRCNN
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
    from torchvision.models.detection.mask_rcnn import MaskRCNNHeads

    body = resnet_fpn_backbone(backbone_name=backbone, weights=None, norm_layer=nn.BatchNorm2d, trainable_layers=5)
    mask_head = MaskRCNNHeads(body.out_channels, [256, 256, 256, 256], 1, norm_layer=nn.BatchNorm2d)
    return MaskRCNN(body, num_classes=num_classes + 1, min_size=min_size, max_size=max_size, mask_head=mask_head,
                    **kwargs)


class MaskRCNNModule(L.LightningModule):
    """torchvision Mask R-CNN trained on :class:`DetectionBatch` es, scored by COCO mAP.

    Args:
        num_classes (int): C, without the background (linked from ``data.num_classes`` by the CLI).
        backbone (str): a ResNet name for ``resnet_fpn_backbone``; random weights.
        min_size, max_size (int | None): torchvision's internal resize. ``None`` (default): the
            DataModule's ``image_size``, read at ``setup``, so the canvas is never resized (640 and
            1333 without a DataModule). A value that differs from ``image_size`` is warned about:
            torchvision would resize every canvas (``--data.image_size 320`` training at 640).
        box_score_thresh (float): detections below this score are dropped (torchvision's 0.05).
        box_detections_per_img (int): detections kept per image.
        optimizer (str): ``"SGD"`` (torchvision's reference recipe) or ``"AdamW"``.
        lr, momentum, weight_decay (float), warmup_steps (int), cosine_schedule (bool): see
            :func:`~seg_datamodule.integrations._optim.configure_optimizer`.
        coco_eval (bool): score validation detections with COCO mAP.
        coco_ann_file (str | None): the COCO JSON to score against; ``None`` takes the
            DataModule's ``val_ann`` at ``setup``.
        mask_rcnn_kwargs (dict | None): further ``torchvision.models.detection.MaskRCNN``
            arguments, e.g. ``rpn_post_nms_top_n_train`` or ``box_batch_size_per_image`` (fewer
            proposals make a CPU step several times cheaper).

    Logs ``train/loss`` and ``train/{loss_classifier,loss_box_reg,loss_mask,loss_objectness,
    loss_rpn_box_reg}`` and the COCO ``val/{segm,bbox}_{AP,...}``. torchvision computes losses in
    training mode only, so validation logs no loss.

    Raises:
        ValueError: a bad argument (an unknown backbone name included).
    """

    def __init__(
        self,
        num_classes: int,
        backbone: str = "resnet50",
        min_size: int | None = None,
        max_size: int | None = None,
        box_score_thresh: float = 0.05,
        box_detections_per_img: int = 100,
        optimizer: Literal["AdamW", "SGD"] = "SGD",
        lr: float = 0.02,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
        warmup_steps: int = 500,
        cosine_schedule: bool = True,
        coco_eval: bool = True,
        coco_ann_file: str | None = None,
        mask_rcnn_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("num_classes", num_classes), ("min_size", min_size), ("max_size", max_size),
                            ("box_detections_per_img", box_detections_per_img)):
            if value is None and name in ("min_size", "max_size"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not (isinstance(box_score_thresh, (int, float)) and 0 <= box_score_thresh <= 1):
            raise ValueError(f"box_score_thresh must be in [0, 1], got {box_score_thresh!r}")
        check_optim_args(optimizer, lr, momentum, weight_decay, warmup_steps)
        from torchvision.models import resnet

        if backbone not in resnet.__all__ or not backbone.startswith(("resnet", "resnext", "wide_resnet")):
            raise ValueError(f"backbone must be a torchvision ResNet name such as 'resnet50', got {backbone!r}")
        self.save_hyperparameters()
        self.num_classes = num_classes
        extra = dict(mask_rcnn_kwargs or {})
        if "num_classes" in extra or "mask_head" in extra:
            raise ValueError("mask_rcnn_kwargs must not set num_classes or mask_head (the module sets both)")
        self.model = build_mask_rcnn(num_classes, backbone, 640 if min_size is None else min_size,
                                     1333 if max_size is None else max_size, box_score_thresh=box_score_thresh,
                                     box_detections_per_img=box_detections_per_img, **extra)
        self.coco_metric: COCOMaskMAP | None = None

    def compute_losses(self, batch: DetectionBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """Mask R-CNN's losses in training mode: their sum and each of the five."""
        images, targets = to_torchvision(batch)
        losses = self.model(images, targets)
        return sum(losses.values()), losses

    def training_step(self, batch: DetectionBatch, batch_idx: int) -> Tensor:
        """The summed losses; logs ``train/loss`` and each term."""
        loss, losses = self.compute_losses(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch))
        for name, value in losses.items():
            self.log(f"train/{name}", value, batch_size=len(batch))
        return loss

    def setup(self, stage: str) -> None:
        """Take unset sizes from the DataModule's ``image_size``; make the COCO metric (its
        ``val_ann`` is resolved by now)."""
        self._fit_sizes_to_canvas()
        if self.hparams.coco_eval and self.coco_metric is None and stage in ("fit", "validate"):
            self.coco_metric = make_coco_metric(self, self.hparams.coco_ann_file, self.num_classes)

    def _fit_sizes_to_canvas(self) -> None:
        """``min_size`` / ``max_size`` left unset become the canvas side, so nothing is resized."""
        image_size = getattr(getattr(self.trainer, "datamodule", None), "image_size", None)
        if not isinstance(image_size, int):
            return
        transform = self.model.transform
        if self.hparams.min_size is None:
            transform.min_size = (image_size,)
        if self.hparams.max_size is None:
            transform.max_size = image_size
        if transform.min_size != (image_size,) or transform.max_size < image_size:
            rank_zero_warn(
                f"MaskRCNNModule: min_size {transform.min_size[0]} / max_size {transform.max_size} do not match "
                f"data.image_size {image_size}: torchvision resizes every {image_size} px canvas; leave them unset "
                "to follow image_size"
            )

    def predict_batch(self, batch: DetectionBatch) -> list[dict[str, Tensor]]:
        """Detections per image on the canvas (eval mode).

        Returns:
            One dict per image: ``boxes (Tensor[n, 4])`` xyxy canvas pixels, ``scores (Tensor[n])``,
            ``labels (Tensor[n] int64)`` contiguous ``0..C-1`` and ``masks (Tensor[n, H, W] float)``
            probabilities on the canvas.
        """
        images, _ = to_torchvision(batch)
        outputs = self.model(images)
        return [
            {"boxes": o["boxes"], "scores": o["scores"], "labels": o["labels"] - 1, "masks": o["masks"][:, 0]}
            for o in outputs
        ]

    def validation_step(self, batch: DetectionBatch, batch_idx: int) -> None:
        """The detections go into the COCO metric."""
        if self.coco_metric is not None:
            self.coco_metric.update(self.predict_batch(batch), batch)

    def on_validation_epoch_end(self) -> None:
        """Logs COCO ``val/{segm,bbox}_{AP,...}`` of the detections and prints both APs."""
        log_coco_results(self, self.coco_metric, "Mask R-CNN detections")

    def configure_optimizers(self) -> Any:
        """SGD or AdamW (no decay on norms and biases), linear warmup, per-step cosine."""
        return configure_from_hparams(self)
