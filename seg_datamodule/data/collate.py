"""Worker-side collation: stack images and rasterise every instance's mask on the stride grid.

The collate runs inside DataLoader workers, so masks are rasterised concurrently and ahead of the
training step. Inside a worker every output tensor is allocated directly in shared memory (as
torch's ``default_collate`` does when stacking), so handing the batch to the main process sends
file descriptors, not bytes. A fresh shared-memory segment is zero-filled by the kernel, so the
mask stack needs no clearing pass: the rasteriser writes only the inside cells.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import get_worker_info

from seg_datamodule.ops.checks import check_bool, check_int, check_optional_bool
from seg_datamodule.ops.raster import grid_size, rasterize_flat
from seg_datamodule.structures import DetectionBatch, Polygons, Sample

__all__ = ["DetectionCollate", "collate_detection", "boxes_from_polygons"]


def boxes_from_polygons(polygons: Polygons, canvas_size: tuple[int, int]) -> np.ndarray:
    """xyxy boxes of each instance's polygons, clipped to the canvas.

    Uses the exact polygon-rectangle clip, so a polygon that leaves the canvas along a slanted
    edge gets the box of what is visible, not of its clamped vertices.

    Args:
        polygons (Polygons): N instances in canvas pixels.
        canvas_size (tuple[int, int]): ``(H, W)``.

    Returns:
        ndarray[N, 4] float32 xyxy; an instance with nothing on the canvas gets a zero-size box.
    """
    height, width = canvas_size
    return polygons.clip((0.0, 0.0, float(width), float(height))).boxes().astype(np.float32)


def _empty(shape: tuple[int, ...], dtype: torch.dtype, shared: bool) -> torch.Tensor:
    """An uninitialised tensor; in shared memory when ``shared`` (fresh segments are zeroed)."""
    if not shared:
        return torch.empty(shape, dtype=dtype)
    numel = math.prod(shape)
    storage = torch.UntypedStorage._new_shared(numel * torch.empty((), dtype=dtype).element_size())
    return torch.empty((0,), dtype=dtype).set_(storage, 0, shape)


def _zeros_bool(shape: tuple[int, ...], shared: bool) -> torch.Tensor:
    """A zero-filled bool tensor without a clearing pass over memory.

    A new shared segment (shm + ftruncate) is zero-filled by the kernel; privately, ``np.zeros``
    maps fresh zero pages lazily (``torch.zeros`` would write every byte).
    """
    if shared:
        return _empty(shape, torch.bool, shared)
    return torch.from_numpy(np.zeros(shape, dtype=np.bool_))


class DetectionCollate:
    """Picklable collate: ``DataLoader(collate_fn=DetectionCollate(mask_stride=4))``.

    Args:
        mask_stride (int): stride of the mask grid (4 for YOLACT's ProtoNet).
        shared_memory (bool | None): allocate outputs in shared memory; ``None`` (default) does
            so exactly when running inside a DataLoader worker.
        channels_last (bool): ``images`` has shape ``(B, 3, H, W)`` in channels-last memory
            format (strides ``(3HW, 1, 3W, 3)``), so each HWC image is one plain copy; a
            transposing copy costs about 4x more in the worker, and convolutions take
            channels-last input directly. ``False`` gives a contiguous NCHW tensor.
    """

    def __init__(self, mask_stride: int = 4, shared_memory: bool | None = None, channels_last: bool = True) -> None:
        self.mask_stride = check_int("mask_stride", mask_stride, 1)
        self.shared_memory = check_optional_bool("shared_memory", shared_memory)
        self.channels_last = check_bool("channels_last", channels_last)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(mask_stride={self.mask_stride}, shared_memory={self.shared_memory}, "
                f"channels_last={self.channels_last})")

    def __call__(self, samples: Sequence[Sample]) -> DetectionBatch:
        """Collate per-image samples into one batch.

        Args:
            samples: B samples whose images all have the same ``(H, W)``.

        Returns:
            DetectionBatch with ``masks`` bool ``(sum_N, ceil(H / s), ceil(W / s))``.

        Raises:
            ValueError: no samples, images of different sizes, or a malformed sample (naming
                its image id).
        """
        if len(samples) == 0:
            raise ValueError("collate needs at least one sample, got an empty batch")
        stride = self.mask_stride
        shared = get_worker_info() is not None if self.shared_memory is None else self.shared_memory
        height, width = samples[0].canvas_size
        for sample in samples:
            sample.validate()
            if sample.canvas_size != (height, width):
                raise ValueError(
                    f"image id {sample.image_id}: canvas {sample.canvas_size} differs from the "
                    f"batch's {(height, width)}; every image of a batch must have the same size"
                )
        hp, wp = grid_size((height, width), stride)
        batch_size = len(samples)
        counts = np.array([s.num_instances for s in samples], dtype=np.int64)
        total = int(counts.sum())

        # 1. Images: HWC uint8 -> (B, 3, H, W), written straight into the output.
        if self.channels_last:
            hwc = _empty((batch_size, height, width, 3), torch.uint8, shared)
            hwc_np = hwc.numpy()
            for b, sample in enumerate(samples):
                hwc_np[b] = sample.image
            images = hwc.permute(0, 3, 1, 2)
        else:
            images = _empty((batch_size, 3, height, width), torch.uint8, shared)
            images_np = images.numpy()
            for b, sample in enumerate(samples):
                images_np[b] = sample.image.transpose(2, 0, 1)

        # 2. Masks: all instances of the batch in one vectorised rasterisation.
        polygons = Polygons.concat(s.polygons for s in samples)
        masks = _zeros_bool((total, hp, wp), shared)
        rasterize_flat(*polygons.arrays, (height, width), stride, out=masks.numpy())

        # 3. Boxes: given by the augmentation, or derived from the polygons on the canvas.
        boxes = np.zeros((total, 4), np.float32)
        for b, (sample, start) in enumerate(zip(samples, np.cumsum(counts) - counts)):
            if sample.num_instances == 0:
                continue
            if sample.boxes is not None:
                boxes[start : start + counts[b]] = sample.boxes
            else:
                boxes[start : start + counts[b]] = boxes_from_polygons(sample.polygons, (height, width))

        # 4. Crowd regions sampled at the same cell centres as the masks.
        ignore = _zeros_bool((batch_size, hp, wp), shared)
        ignore_np = ignore.numpy()
        half = stride // 2  # pixel holding the centre (j + 0.5) * stride
        for b, sample in enumerate(samples):
            if sample.crowd_mask is not None:
                sampled = sample.crowd_mask[half::stride, half::stride]
                ignore_np[b, : sampled.shape[0], : sampled.shape[1]] = sampled

        return DetectionBatch(
            images=images,
            boxes=torch.from_numpy(boxes),
            labels=torch.from_numpy(np.concatenate([s.labels for s in samples]).astype(np.int64)),
            masks=masks,
            boxes_per_image=torch.from_numpy(counts),
            image_ids=torch.tensor([int(s.image_id) for s in samples], dtype=torch.int64),
            annotation_ids=torch.from_numpy(
                np.concatenate([s.annotation_ids for s in samples]).astype(np.int64)
            ),
            ignore_masks=ignore,
            scales=torch.tensor([float(s.scale) for s in samples], dtype=torch.float32),
            pads=torch.tensor([tuple(map(float, s.pad)) for s in samples], dtype=torch.float32).reshape(-1, 2),
            orig_sizes=torch.tensor(
                [s.orig_size if s.orig_size is not None else (height, width) for s in samples],
                dtype=torch.int64,
            ).reshape(-1, 2),
            mask_stride=stride,
        )


def collate_detection(samples: Sequence[Sample], mask_stride: int = 4, channels_last: bool = True) -> DetectionBatch:
    """Collate per-image samples into a :class:`DetectionBatch` (see :class:`DetectionCollate`).

    Args:
        samples: B samples with images of one size ``(H, W)``.
        mask_stride (int): stride of the mask grid.
        channels_last (bool): memory format of ``images`` (its shape is ``(B, 3, H, W)`` either way).

    Returns:
        DetectionBatch; ``masks`` bool ``(sum_N, ceil(H / mask_stride), ceil(W / mask_stride))``.
    """
    return DetectionCollate(mask_stride=mask_stride, channels_last=channels_last)(samples)
