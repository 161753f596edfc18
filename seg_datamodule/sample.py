"""Per-image samples and the collated batch.

A :class:`Sample` is what a dataset's ``__getitem__`` returns after augmentation: one image on its
output canvas, with every instance as flat polygon arrays in canvas pixels. Flat numpy arrays
pickle in one buffer each, so handing samples between processes costs little, and the collate
rasterises them without touching Python objects per ring.

Polygon layout (the same everywhere in the package)::

    vertices          float64 (V, 2)   x, y in canvas pixels (COCO convention: pixel k covers [k, k+1))
    ring_offsets      int64   (R + 1,) ring r is vertices[ring_offsets[r]:ring_offsets[r + 1]]
    instance_offsets  int64   (N + 1,) instance n is rings instance_offsets[n]:instance_offsets[n + 1]

An instance's mask is the union of its rings; each ring is filled with the even-odd rule.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["Sample", "DetectionBatch", "empty_polygons", "polygons_from_instances"]


def empty_polygons() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat polygon arrays holding no instance.

    Returns:
        (vertices (float64[0, 2]), ring_offsets (int64[1]), instance_offsets (int64[1])).
    """
    return np.zeros((0, 2), np.float64), np.zeros(1, np.int64), np.zeros(1, np.int64)


def polygons_from_instances(
    instances: Sequence[Sequence[Any]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flatten nested instances into the package's flat polygon layout.

    Args:
        instances: one item per instance, each a sequence of rings; a ring is array-like
            ``(K, 2)`` of x, y or a flat COCO list ``[x0, y0, x1, y1, ...]``.

    Returns:
        vertices (float64[V, 2]), ring_offsets (int64[R + 1]), instance_offsets (int64[N + 1]).

    Raises:
        ValueError: a ring is not ``(K, 2)`` or a flat list of even length, has fewer than 3
            vertices, or holds NaN or infinite coordinates; the message names the instance index.
    """
    rings: list[np.ndarray] = []
    instance_offsets = np.zeros(len(instances) + 1, np.int64)
    for n, instance in enumerate(instances):
        if isinstance(instance, np.ndarray) and instance.ndim == 2 and instance.shape[1] == 2:
            # A lone (K, 2) array is one ring, not K rings of 2 numbers.
            instance = [instance]
        for ring in instance:
            arr = np.asarray(ring, dtype=np.float64)
            if arr.ndim == 1:
                if arr.size % 2:
                    raise ValueError(
                        f"instance {n}: flat ring has an odd number of coordinates ({arr.size})"
                    )
                arr = arr.reshape(-1, 2)
            if arr.ndim != 2 or arr.shape[1] != 2:
                raise ValueError(
                    f"instance {n}: a ring must be (K, 2) or a flat list, got shape {arr.shape}"
                )
            if arr.shape[0] < 3:
                raise ValueError(f"instance {n}: a ring needs at least 3 vertices, got {arr.shape[0]}")
            if not np.isfinite(arr).all():
                raise ValueError(f"instance {n}: ring has NaN or infinite coordinates")
            rings.append(arr)
        instance_offsets[n + 1] = len(rings)
    if not rings:
        vertices, ring_offsets, _ = empty_polygons()
        return vertices, ring_offsets, instance_offsets
    ring_offsets = np.zeros(len(rings) + 1, np.int64)
    np.cumsum([len(r) for r in rings], out=ring_offsets[1:])
    return np.concatenate(rings), ring_offsets, instance_offsets


@dataclass
class Sample:
    """One augmented image and its instances on the output canvas.

    Attributes:
        image (ndarray[H, W, 3] uint8): RGB pixels, C-contiguous (HWC, as OpenCV and
            albumentations produce them).
        image_id (int): COCO image id (for a mosaic, the id of the first tile).
        vertices (ndarray[V, 2] float64): polygon vertices in canvas pixels.
        ring_offsets (ndarray[R + 1] int64): ring boundaries into ``vertices``.
        instance_offsets (ndarray[N + 1] int64): instance boundaries into the rings.
        labels (ndarray[N] int64): contiguous class indices ``0..C-1``.
        annotation_ids (ndarray[N] int64): COCO annotation ids, so every target is traceable.
        boxes (ndarray[N, 4] float32 | None): xyxy boxes in canvas pixels; ``None`` lets the
            collate derive them from the polygons clipped to the canvas.
        crowd_mask (ndarray[H, W] bool | None): union of crowd (``iscrowd=1``) regions on the
            canvas, pixels a model should ignore; ``None`` when there are none or they were dropped.
        scale (float): original image pixels -> canvas pixels (letterbox); 1.0 for mosaics.
        pad (tuple[float, float]): letterbox padding (left, top) in canvas pixels.
        orig_size (tuple[int, int] | None): original image (H, W); ``None`` means the canvas size.
    """

    image: np.ndarray
    image_id: int
    vertices: np.ndarray
    ring_offsets: np.ndarray
    instance_offsets: np.ndarray
    labels: np.ndarray
    annotation_ids: np.ndarray
    boxes: np.ndarray | None = None
    crowd_mask: np.ndarray | None = None
    scale: float = 1.0
    pad: tuple[float, float] = (0.0, 0.0)
    orig_size: tuple[int, int] | None = None

    @property
    def num_instances(self) -> int:
        """N, the number of instances."""
        return len(self.instance_offsets) - 1

    @property
    def canvas_size(self) -> tuple[int, int]:
        """(H, W) of the image."""
        return int(self.image.shape[0]), int(self.image.shape[1])

    def validate(self) -> None:
        """Check shapes and offsets; raises ``ValueError`` naming the image id."""
        where = f"image id {self.image_id}"
        if self.image.dtype != np.uint8 or self.image.ndim != 3 or self.image.shape[2] != 3:
            raise ValueError(
                f"{where}: image must be uint8 (H, W, 3), got {self.image.dtype} {self.image.shape}"
            )
        n = self.num_instances
        if self.vertices.ndim != 2 or self.vertices.shape[1] != 2:
            raise ValueError(f"{where}: vertices must be (V, 2), got {self.vertices.shape}")
        if self.ring_offsets[0] != 0 or self.ring_offsets[-1] != len(self.vertices):
            raise ValueError(f"{where}: ring_offsets must run from 0 to V={len(self.vertices)}")
        if self.instance_offsets[0] != 0 or self.instance_offsets[-1] != len(self.ring_offsets) - 1:
            raise ValueError(f"{where}: instance_offsets must run from 0 to R")
        if len(self.labels) != n or len(self.annotation_ids) != n:
            raise ValueError(
                f"{where}: {n} instances but {len(self.labels)} labels and "
                f"{len(self.annotation_ids)} annotation ids"
            )
        if self.boxes is not None and self.boxes.shape != (n, 4):
            raise ValueError(f"{where}: boxes must be ({n}, 4), got {self.boxes.shape}")
        if self.crowd_mask is not None and self.crowd_mask.shape != self.image.shape[:2]:
            raise ValueError(
                f"{where}: crowd_mask {self.crowd_mask.shape} does not match image {self.image.shape[:2]}"
            )


@dataclass
class DetectionBatch:
    """A collated batch, ready for a YOLACT-style loss.

    Attributes:
        images (Tensor[B, 3, H, W] uint8): RGB images (channels-last memory format by default;
            see :class:`~seg_datamodule.collate.DetectionCollate`).
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
