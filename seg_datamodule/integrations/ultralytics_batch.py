"""The batch conversion for Ultralytics' loss: a :class:`~seg_datamodule.structures.DetectionBatch` as
the dict ``ultralytics.utils.loss.v8SegmentationLoss`` reads with ``overlap_mask=False``
(per-instance masks at ``mask_ratio = mask_stride``), and the class maps it builds beside them.
Pure torch: it needs no Ultralytics (``YOLOSegModule`` in :mod:`~seg_datamodule.integrations.ultralytics`
uses it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from seg_datamodule.structures import DetectionBatch

__all__ = ["semantic_masks", "to_ultralytics_batch"]


def semantic_masks(masks: Tensor, labels: Tensor, boxes_per_image: Tensor) -> Tensor:
    """Per-image class maps as Ultralytics' ``Format`` builds ``sem_masks`` with ``overlap_mask=False``.

    Where instances overlap, the smallest one (fewest mask cells) wins; uncovered cells are 0
    (the loss reads them as "not present", not as class 0).

    Args:
        masks (Tensor[N, Hp, Wp] bool): instance masks, image after image.
        labels (Tensor[N] int64): their classes.
        boxes_per_image (Tensor[B] int64): instances per image.

    Returns:
        Tensor[B, Hp, Wp] float32: the class index of each cell.
    """
    batch = int(boxes_per_image.shape[0])
    out = torch.zeros((batch, *masks.shape[-2:]), dtype=torch.float32, device=masks.device)
    for b, (m, c) in enumerate(zip(masks.split(boxes_per_image.tolist()), labels.split(boxes_per_image.tolist()))):
        if not m.shape[0]:
            continue
        weights = m.flatten(1).sum(1)
        key = torch.where(m, weights[:, None, None], weights.max() + 1)
        out[b] = c[key.min(0).indices].float() * m.any(0)
    return out


def to_ultralytics_batch(batch: DetectionBatch, semantic: bool = False) -> dict[str, Tensor]:
    """The dict ``v8SegmentationLoss`` (``overlap_mask=False``) reads, on the batch's device.

    Args:
        batch: a collated batch (its canvas ``H x W`` is what the boxes are normalised by, so for
            an Ultralytics model both must be multiples of the model's largest stride).
        semantic: also build ``sem_masks`` (:func:`semantic_masks`), which only models with a
            semantic branch read (YOLO26-seg); off by default, it costs a pass over the masks.

    Returns:
        ``img (Tensor[B, 3, H, W] float32)`` RGB in ``[0, 1]``; ``cls (Tensor[N, 1] float32)``;
        ``bboxes (Tensor[N, 4] float32)`` xywh normalised by ``W, H``; ``masks (Tensor[N, Hp, Wp]
        float32)`` 0 / 1 on the ``mask_stride`` grid; ``batch_idx (Tensor[N] float32)`` the image
        of each instance; and ``sem_masks (Tensor[B, Hp, Wp] float32)`` when ``semantic``.
    """
    height, width = batch.images.shape[-2:]
    device = batch.boxes.device
    boxes = batch.boxes.float()
    scale = torch.tensor([width, height, width, height], dtype=torch.float32, device=device)
    xywh = torch.cat([(boxes[:, :2] + boxes[:, 2:]) / 2, boxes[:, 2:] - boxes[:, :2]], dim=1) / scale
    image_index = torch.repeat_interleave(
        torch.arange(len(batch), device=device), batch.boxes_per_image.to(device)
    )
    out = {
        "img": batch.images.float().div_(255.0),  # keeps the batch's (channels-last) memory format
        "cls": batch.labels.float()[:, None],
        "bboxes": xywh,
        "masks": batch.masks.float(),
        "batch_idx": image_index.float(),
    }
    if semantic:
        out["sem_masks"] = semantic_masks(batch.masks, batch.labels, batch.boxes_per_image)
    return out
