"""torchvision Mask R-CNN on this project's batches: ``to_torchvision`` and ``MaskRCNNModule``.

``to_torchvision`` turns a :class:`~seg_datamodule.structures.DetectionBatch` into the
``(images, targets)`` lists torchvision's detection models take: float images in ``[0, 1]``,
labels shifted by one (0 is torchvision's background), xyxy boxes in canvas pixels and masks at
the full canvas resolution. Those masks are exact when the DataModule runs with
``mask_stride: 1``; at a coarser stride each grid cell is repeated over the ``stride x stride``
pixels it covers (a nearest upsample, cropped to the canvas), so a mask edge is only as fine as
the grid.

``MaskRCNNModule`` wraps ``torchvision.models.detection.MaskRCNN`` on a ResNet-FPN backbone of
any name ``resnet_fpn_backbone`` knows, from torchvision's pretrained weights (an ImageNet
backbone or a COCO model, see :mod:`~seg_datamodule.integrations._mask_rcnn`), a local
state_dict, or random weights; it logs its five losses and scores its real detections with
:class:`~seg_datamodule.evaluation.COCOMaskMAP`.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from seg_datamodule.evaluation import COCOMaskMAP
from seg_datamodule.integrations._box_only import refuse_box_only
from seg_datamodule.integrations._coco import log_coco_results, make_coco_metric
from seg_datamodule.integrations._mask_rcnn import (
    build_mask_rcnn, build_pretrained_mask_rcnn, load_pretrained, read_pretrained, resolve_weights,
)
from seg_datamodule.integrations._optim import check_optim_args, configure_from_hparams
from seg_datamodule.integrations._stages import NON_FINITE_CHOICES, EvaluationStages, check_loss
from seg_datamodule.integrations._weights import Transfer
from seg_datamodule.ops.checks import check_choice
from seg_datamodule.structures import DetectionBatch

__all__ = ["MaskRCNNModule", "full_resolution_masks", "to_torchvision"]

#: ``MaskRCNN`` arguments the module or the pretrained architecture sets itself.
_ARCHITECTURE_KEYS = ("num_classes", "mask_head", "box_head", "rpn_head", "rpn_anchor_generator", "box_predictor",
                      "mask_predictor")


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


class MaskRCNNModule(EvaluationStages, L.LightningModule):
    """torchvision Mask R-CNN trained on :class:`DetectionBatch` es, scored by COCO mAP.

    Args:
        num_classes (int): C, without the background (linked from ``data.num_classes`` by the CLI).
        backbone (str): a ResNet name for ``resnet_fpn_backbone``.
        weights (str | None): torchvision's COCO weights to start from, by enum name:
            ``"MaskRCNN_ResNet50_FPN_V2_Weights.DEFAULT"`` (47.4 box AP) or
            ``"MaskRCNN_ResNet50_FPN_Weights.DEFAULT"`` (37.9), on torchvision's architecture for
            them (``backbone: resnet50``). Downloaded by ``torch.hub`` into
            ``$TORCH_HOME/hub/checkpoints`` once and read with ``weights_only=True``. COCO's
            91-class predictors keep their initialisation for another ``num_classes``
            (``self.pretrained`` says what was loaded; it is logged).
        weights_backbone (str | None): torchvision's ImageNet weights of the backbone instead, e.g.
            ``"ResNet50_Weights.IMAGENET1K_V1"`` (torchvision's COCO recipe), on torchvision's
            architecture (frozen batch norm in the backbone).
        weights_file (str | None): a local state_dict of the whole model, read with
            ``torch.load(weights_only=True)`` instead of any download: torchvision's file for
            ``weights``, or this module's ``model.state_dict()`` from an earlier run; ``weights``
            / ``weights_backbone`` then only choose the architecture. With neither, the model
            starts from random weights (every layer trains, batch norm everywhere).
        trainable_backbone_layers (int | None): backbone stages that train, 0-5, with
            torchvision's weights (default 3, as torchvision's).
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
        on_nonfinite_loss (str): a NaN or infinite training loss ``"stop"`` s the run (default;
            with ``InterruptCheckpoint`` a checkpoint is saved) or is ``"skip"`` ped, named once
            with the step and the terms (:func:`~seg_datamodule.integrations._stages.check_loss`).

    Logs ``train/loss`` and ``train/{loss_classifier,loss_box_reg,loss_mask,loss_objectness,
    loss_rpn_box_reg}`` and the COCO ``val/{segm,bbox}_{AP,...}`` (``test/`` in ``trainer.test``);
    ``trainer.predict`` returns COCO detections (:class:`EvaluationStages`). torchvision computes
    losses in training mode only, so validation logs no loss.

    Raises:
        ValueError: a bad argument (an unknown backbone or weights name included), or a weights
            file that does not fit the model (``WeightsFileError``, which a failed download
            raises too, naming where to put the file).
    """

    detections_name = "Mask R-CNN detections"

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
        weights: str | None = None,
        weights_backbone: str | None = None,
        weights_file: str | None = None,
        trainable_backbone_layers: int | None = None,
        on_nonfinite_loss: Literal["stop", "skip"] = "stop",
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
        check_choice("on_nonfinite_loss", on_nonfinite_loss, NON_FINITE_CHOICES)
        from torchvision.models import resnet

        if backbone not in resnet.__all__ or not backbone.startswith(("resnet", "resnext", "wide_resnet")):
            raise ValueError(f"backbone must be a torchvision ResNet name such as 'resnet50', got {backbone!r}")
        choice = resolve_weights(backbone, weights, weights_backbone, weights_file, trainable_backbone_layers)
        extra = dict(mask_rcnn_kwargs or {})
        if set(extra) & set(_ARCHITECTURE_KEYS):
            raise ValueError(f"mask_rcnn_kwargs must not set {', '.join(_ARCHITECTURE_KEYS)} (the architecture does)")
        self.save_hyperparameters()
        self.num_classes = num_classes
        pretrained = read_pretrained(choice)  # before building: a failed download fails fast
        # Unset sizes are the canvas side, set at setup from the DataModule (see _fit_sizes_to_canvas).
        sizes = (640 if min_size is None else min_size, 1333 if max_size is None else max_size)
        extra.update(box_score_thresh=box_score_thresh, box_detections_per_img=box_detections_per_img)
        if choice.architecture == "scratch":
            self.model = build_mask_rcnn(num_classes, backbone, sizes[0], sizes[1], **extra)
        else:
            self.model = build_pretrained_mask_rcnn(num_classes, backbone, choice, min_size=sizes[0],
                                                    max_size=sizes[1], **extra)
        self.pretrained: Transfer | None = None
        if pretrained is not None:
            self.pretrained = load_pretrained(self.model, choice, *pretrained)
        self.coco_metric: COCOMaskMAP | None = None
        self.test_metric: COCOMaskMAP | None = None

    def compute_losses(self, batch: DetectionBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """Mask R-CNN's losses in training mode: their sum and each of the five."""
        images, targets = to_torchvision(batch)
        losses = self.model(images, targets)
        return sum(losses.values()), losses

    def training_step(self, batch: DetectionBatch, batch_idx: int) -> Tensor:
        """The summed losses; logs ``train/loss`` and each term."""
        loss, losses = self.compute_losses(batch)
        if not check_loss(self, loss, losses, "train"):
            return None  # type: ignore[return-value]  # on_nonfinite_loss: skip
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch))
        for name, value in losses.items():
            self.log(f"train/{name}", value, batch_size=len(batch))
        return loss

    def setup(self, stage: str) -> None:
        """Take unset sizes from the DataModule's ``image_size``; make the COCO metric (its
        ``val_ann`` is resolved by now); refuse ``box_only: keep`` (:func:`refuse_box_only`)."""
        refuse_box_only(self, "Mask R-CNN (MaskRCNNModule)")
        self._fit_sizes_to_canvas()
        if self.hparams.coco_eval and self.coco_metric is None and stage in ("fit", "validate"):
            self.coco_metric = make_coco_metric(self, self.hparams.coco_ann_file, self.num_classes)
        self.setup_stage(stage)

    def _fit_sizes_to_canvas(self) -> None:
        """``min_size`` / ``max_size`` left unset become the canvas side, so nothing is resized."""
        image_size = getattr(getattr(self._trainer, "datamodule", None), "image_size", None)
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
        log_coco_results(self, self.coco_metric, self.detections_name)

    def configure_optimizers(self) -> Any:
        """SGD or AdamW (no decay on norms and biases), linear warmup, per-step cosine."""
        return configure_from_hparams(self)
