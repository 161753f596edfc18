"""The pure tensor pieces of the demo model's mask path: crop, assemble, loss, IoU, detections.

YOLACT's mask for instance ``n`` is ``coefficients[n] @ protos[image of n]`` cropped to its box;
these functions take and return plain tensors, and :class:`~seg_datamodule.demo.model.YolactLite`
only wires them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["assemble_masks", "box_predictions", "crop_to_boxes", "mask_iou", "mask_loss"]


def crop_to_boxes(boxes: Tensor, grid_size: tuple[int, int], stride: int) -> Tensor:
    """Which cells of the stride grid lie inside each box.

    A cell ``(i, j)`` stands for the canvas point at its centre, ``((j + 0.5) * stride,
    (i + 0.5) * stride)``, the point the rasteriser samples for the targets; it is inside when
    that point lies in the closed box. So every cell a target mask marks is inside its own box,
    and a box narrower than a cell may hold no cell at all.

    Args:
        boxes (Tensor[N, 4] float): xyxy boxes in canvas pixels.
        grid_size (tuple[int, int]): ``(Hp, Wp)`` of the grid.
        stride (int): canvas pixels per cell.

    Returns:
        Tensor[N, Hp, Wp] bool.
    """
    hp, wp = grid_size
    xs = (torch.arange(wp, device=boxes.device, dtype=boxes.dtype) + 0.5) * stride
    ys = (torch.arange(hp, device=boxes.device, dtype=boxes.dtype) + 0.5) * stride
    x1, y1, x2, y2 = (boxes[:, i, None] for i in range(4))
    inside_x = (xs >= x1) & (xs <= x2)  # (N, Wp)
    inside_y = (ys >= y1) & (ys <= y2)  # (N, Hp)
    return inside_y[:, :, None] & inside_x[:, None, :]


def assemble_masks(protos: Tensor, coefficients: Tensor, boxes_per_image: Tensor) -> Tensor:
    """Mask logits as each instance's coefficients times its image's prototypes.

    Args:
        protos (Tensor[B, k, Hp, Wp] float): prototype maps.
        coefficients (Tensor[N, k] float): per-instance coefficients, image after image.
        boxes_per_image (Tensor[B] int64): instances per image; sums to N.

    Returns:
        Tensor[N, Hp, Wp] float: mask logits, in the order of ``coefficients``.
    """
    batch, k, height, width = protos.shape
    # One matmul per image: indexing protos per instance would copy (N, k, Hp, Wp) and keep it
    # for backward.
    per_image = coefficients.split(boxes_per_image.tolist())
    flat = protos.reshape(batch, k, height * width)
    logits = [c @ p for c, p in zip(per_image, flat)]
    return torch.cat(logits).reshape(-1, height, width)


def mask_loss(mask_logits: Tensor, targets: Tensor, boxes: Tensor, stride: int) -> Tensor:
    """YOLACT's mask loss: binary cross-entropy inside each ground-truth box.

    Only cells inside the instance's box count (:func:`crop_to_boxes`); each instance's sum is
    divided by its box area in cells, then instances are averaged (YOLACT, Sec. 3.3 and its
    ``lincomb_mask_loss``), so a large object does not outweigh a small one.

    Args:
        mask_logits (Tensor[N, Hp, Wp] float): predicted logits.
        targets (Tensor[N, Hp, Wp] bool): ground-truth masks on the same grid.
        boxes (Tensor[N, 4] float): xyxy ground-truth boxes in canvas pixels.
        stride (int): canvas pixels per grid cell.

    Returns:
        Tensor[] float: the loss; with N = 0 a zero still connected to ``mask_logits``'s graph,
        so ``backward`` works on a batch without instances.

    Raises:
        ValueError: ``mask_logits`` and ``targets`` differ in shape.
    """
    if mask_logits.shape != targets.shape:
        raise ValueError(
            f"mask_logits {tuple(mask_logits.shape)} and targets {tuple(targets.shape)} must have the same shape"
        )
    if mask_logits.shape[0] == 0:
        return mask_logits.sum() * 0.0
    crop = crop_to_boxes(boxes, mask_logits.shape[-2:], stride).to(mask_logits.dtype)
    per_cell = F.binary_cross_entropy_with_logits(mask_logits, targets.to(mask_logits.dtype), reduction="none")
    area = crop.sum(dim=(1, 2)).clamp(min=1.0)
    return ((per_cell * crop).sum(dim=(1, 2)) / area).mean()


def mask_iou(mask_logits: Tensor, targets: Tensor, boxes: Tensor, stride: int, threshold: float = 0.5) -> Tensor:
    """IoU of each thresholded predicted mask, cropped to its box, with its target.

    Args:
        mask_logits (Tensor[N, Hp, Wp] float): predicted logits.
        targets (Tensor[N, Hp, Wp] bool): ground-truth masks.
        boxes (Tensor[N, 4] float): xyxy boxes in canvas pixels (the crop, as at inference).
        stride (int): canvas pixels per grid cell.
        threshold (float): probability above which a cell is foreground.

    Returns:
        Tensor[N] float: IoU per instance; 1 where both masks are empty.
    """
    logit_threshold = math.log(threshold / (1.0 - threshold))
    predicted = (mask_logits > logit_threshold) & crop_to_boxes(boxes, mask_logits.shape[-2:], stride)
    intersection = (predicted & targets).sum(dim=(1, 2)).to(torch.float32)
    union = (predicted | targets).sum(dim=(1, 2)).to(torch.float32)
    return torch.where(union > 0, intersection / union.clamp(min=1.0), torch.ones_like(union))


def box_predictions(
    boxes: Tensor, class_logits: Tensor, mask_logits: Tensor, boxes_per_image: Tensor, stride: int
) -> list[dict[str, Tensor]]:
    """Per-image predictions for :class:`~seg_datamodule.evaluation.COCOMaskMAP` at given boxes.

    Each box gets its most probable class, that probability as the score, and its mask logits
    cropped to the box (cells outside it set to -1e4, as YOLACT crops at inference).

    Args:
        boxes (Tensor[N, 4] float): xyxy canvas boxes the model pooled at.
        class_logits (Tensor[N, C] float): class logits.
        mask_logits (Tensor[N, Hp, Wp] float): mask logits on the stride grid.
        boxes_per_image (Tensor[B] int64): boxes per image; sums to N.
        stride (int): canvas pixels per grid cell.

    Returns:
        B dicts of ``boxes (N_b, 4)``, ``scores (N_b,)``, ``labels (N_b,)`` and
        ``mask_logits (N_b, Hp, Wp)``, all float32 / int64.
    """
    probabilities = class_logits.float().softmax(dim=1)
    scores, labels = probabilities.max(dim=1) if len(probabilities) else (
        probabilities.new_zeros(0), torch.zeros(0, dtype=torch.int64, device=class_logits.device))
    inside = crop_to_boxes(boxes.float(), mask_logits.shape[-2:], stride)
    cropped = mask_logits.float().masked_fill(~inside, -1e4)
    counts = boxes_per_image.tolist()
    return [
        {"boxes": b, "scores": s, "labels": l, "mask_logits": m}
        for b, s, l, m in zip(boxes.float().split(counts), scores.split(counts), labels.split(counts),
                              cropped.split(counts))
    ]


# ------------------------------------------------------------------------------------ network
