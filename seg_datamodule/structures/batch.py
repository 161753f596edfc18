"""The collated batch a model trains on: images, boxes, labels and stride-grid masks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from seg_datamodule.structures.pending import PendingPixels

__all__ = ["DetectionBatch"]


@dataclass
class DetectionBatch:
    """A collated batch, ready for a YOLACT-style loss.

    Attributes:
        images (Tensor[B, 3, H, W] uint8): RGB images (channels-last memory format by default;
            see :class:`~seg_datamodule.data.batching.collate.DetectionCollate`).
        boxes (Tensor[sum_N, 4] float32): xyxy boxes in canvas pixels, image after image.
        labels (Tensor[sum_N] int64): contiguous class indices.
        masks (Tensor[sum_N, Hp, Wp] bool): instance masks on the stride grid, in the order of
            ``boxes``; ``Hp = ceil(H / mask_stride)``, ``Wp = ceil(W / mask_stride)``.
        boxes_per_image (Tensor[B] int64): ``masks.split(boxes_per_image.tolist())`` gives each
            image's masks.
        image_ids (Tensor[B] int64): COCO image ids.
        annotation_ids (Tensor[sum_N] int64): COCO annotation ids of the targets.
        ignore_masks (Tensor[B, Hp, Wp] bool): crowd regions on the stride grid (all False when
            an image has none).
        scales (Tensor[B] float32): original pixels -> canvas pixels.
        pads (Tensor[B, 2] float32): letterbox padding (left, top) in canvas pixels.
        orig_sizes (Tensor[B, 2] int64): original image (H, W).
        mask_stride (int): the stride of the mask grid.
        counts (dict[str, int] | None): where this batch's annotations went (``kept`` and the
            reasons others were dropped) and the decodes it took, when the dataset reports them
            (``SegDataset`` does); what the DataModule's accounting sums over trained batches.
        neg_labels (Tensor[sum_K] int64 | None): per image, the sorted labels verified absent
            (LVIS ``neg_category_ids``; a mosaic keeps those all its tiles' images verified),
            image after image; ``None`` when the index has no such lists (a streamed one).
        neg_labels_per_image (Tensor[B] int64 | None): ``neg_labels.split(...)`` per image.
        not_exhaustive_labels (Tensor[sum_M] int64 | None): per image, the sorted labels whose
            instances may not all be annotated (LVIS ``not_exhaustive_category_ids``; any tile's
            for a mosaic). A federated loss scores the categories of ``labels`` and
            ``neg_labels`` and ignores the others; for a COCO file both lists are empty.
        not_exhaustive_labels_per_image (Tensor[B] int64 | None): counts per image.
        origins (Tensor[sum_N] uint8 | None): per target, an index of
            :data:`~seg_datamodule.structures.sample.ORIGINS` (own, pasted by copy-paste, mixed
            in by MixUp); ``None`` when no sample of the batch was mixed.
        has_mask (Tensor[sum_N] bool | None): per target, False for a box-only one
            (``box_only: keep``: its mask row is all False; take its box loss, not its mask
            loss); ``None`` when every target of the batch has a mask (always with
            ``box_only: drop``).
        hsv_gains (Tensor[B, 3] float64 | None): HSV jitter gains still to apply to ``images``
            (``hsv_on_device``): ``COCOSegDataModule.on_after_batch_transfer`` applies them with
            :func:`~seg_datamodule.transforms.pixel.hsv.hsv_jitter_batch_` on the device and sets this
            to ``None``; ``None`` when there is nothing left to apply.
        pending_pixels (PendingPixels | None): ``pixels_on_device``: ``images`` is ``(B, 3, 0, 0)``
            until ``COCOSegDataModule.on_after_batch_transfer`` decodes, warps and flips these on
            the device (before the HSV jitter) and sets this to ``None``.
    """

    images: torch.Tensor
    boxes: torch.Tensor
    labels: torch.Tensor
    masks: torch.Tensor
    boxes_per_image: torch.Tensor
    image_ids: torch.Tensor
    annotation_ids: torch.Tensor
    ignore_masks: torch.Tensor
    scales: torch.Tensor
    pads: torch.Tensor
    orig_sizes: torch.Tensor
    mask_stride: int = field(default=4)
    counts: dict[str, int] | None = None
    neg_labels: torch.Tensor | None = None
    neg_labels_per_image: torch.Tensor | None = None
    not_exhaustive_labels: torch.Tensor | None = None
    not_exhaustive_labels_per_image: torch.Tensor | None = None
    origins: torch.Tensor | None = None
    hsv_gains: torch.Tensor | None = None
    has_mask: torch.Tensor | None = None
    pending_pixels: PendingPixels | None = None

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def _map(self, fn: Any) -> "DetectionBatch":
        changes = {
            f.name: fn(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "DetectionBatch":
        """Move every tensor to ``device`` (what Lightning's ``transfer_batch_to_device`` calls)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self, device: Any = None) -> "DetectionBatch":
        """Page-lock every tensor (what ``DataLoader(pin_memory=True)`` calls)."""
        return self._map(lambda t: t.pin_memory() if device is None else t.pin_memory(device))

    def split_masks(self) -> tuple[torch.Tensor, ...]:
        """Each image's masks, ``(N_b, Hp, Wp)`` bool per image."""
        return self.masks.split(self.boxes_per_image.tolist())
