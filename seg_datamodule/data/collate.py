"""Worker-side collation: stack images and rasterise every instance's mask on the stride grid.

The collate runs inside DataLoader workers, so masks are rasterised concurrently and ahead of the
training step. Inside a worker the large outputs (images, masks, crowd masks) are views of one
shared-memory segment, so handing the batch to the main process sends file descriptors, not
bytes; segments are reused once the main process has dropped their batch
(:mod:`~seg_datamodule.data.shm`), so neither side maps, zero-fills or unmaps a segment per
batch. The rasteriser writes only the inside cells, into a zeroed mask stack.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import get_worker_info

from seg_datamodule.ops.checks import check_bool, check_int, check_optional_bool
from seg_datamodule.ops.occlusion import rasterize_visible
from seg_datamodule.ops.raster import grid_size, rasterize_flat
from seg_datamodule.data.shm import Lease, SharedBufferPool, pooling_available
from seg_datamodule.structures import DetectionBatch, Polygons, Sample, SampleBatch

__all__ = ["DEFAULT_BUFFER_SLOTS", "DetectionCollate", "batch_bytes", "boxes_from_polygons", "collate_detection"]

#: Shared-memory segments each worker reuses unless told otherwise (see :class:`DetectionCollate`).
DEFAULT_BUFFER_SLOTS = 4


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


def _allocate(
    layout: list[tuple[tuple[int, ...], torch.dtype]], shared: bool, pool: SharedBufferPool | None
) -> tuple[list[torch.Tensor], Lease | None, bool]:
    """Uninitialised tensors of the given shapes, all views of one storage when ``shared``.

    Returns:
        the tensors, the pool's lease (or None) and whether the memory is fresh (zero-filled:
        a new shared segment is zeroed by the kernel; private memory comes from ``np.zeros``).
    """
    if not shared:
        return [torch.from_numpy(np.zeros(shape, torch.empty((), dtype=dtype).numpy().dtype))
                for shape, dtype in layout], None, True
    offsets, total = [], 0
    for shape, dtype in layout:
        offsets.append(total)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        total += -(-nbytes // 64) * 64  # 64-byte aligned views
    if pool is None:
        storage, lease, fresh = torch.UntypedStorage._new_shared(max(total, 1)), None, True
    else:
        storage, lease, fresh = pool.acquire(max(total, 1))
    tensors = [torch.empty((0,), dtype=dtype).set_(storage, offset // torch.empty((), dtype=dtype).element_size(), shape)
               for (shape, dtype), offset in zip(layout, offsets)]
    return tensors, lease, fresh


def _occluders_of(sample: Sample) -> Polygons:
    """The sample's occluders, or as many instances without rings when nothing is pasted on it."""
    if sample.occluders is not None:
        return sample.occluders
    return Polygons(np.zeros((0, 2), np.float64), np.zeros(1, np.int64), np.zeros(sample.num_instances + 1, np.int64))


def _origins_of(samples: Sequence[Sample], out: torch.Tensor | None) -> torch.Tensor | None:
    """Per target, its :data:`~seg_datamodule.structures.sample.ORIGINS` code, written into ``out``
    (None when no sample was mixed)."""
    if out is None:
        return None
    out.numpy()[:] = np.concatenate([np.zeros(0, np.uint8)] + [
        np.zeros(s.num_instances, np.uint8) if s.origins is None else s.origins for s in samples])
    return out


def batch_bytes(batch_size: int, canvas_size: tuple[int, int], instances: float, mask_stride: int) -> int:
    """Bytes of one collated batch's single allocation: images, masks, ignore masks and the small arrays.

    Args:
        batch_size: B.
        canvas_size: (H, W).
        instances: targets per image (an expected value is enough for a budget).
        mask_stride: the mask grid's stride.
    """
    height, width = canvas_size
    cells = -(-height // mask_stride) * -(-width // mask_stride)
    total = int(np.ceil(batch_size * instances))
    return batch_size * (height * width * 3 + cells + 64) + total * (cells + 40)


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
        buffer_slots (int): shared-memory segments each worker reuses (0: a fresh segment per
            batch, freed by whichever process drops the batch last). With slots, the main
            process keeps every segment mapped and hands it back when nothing references its
            batch any more: receiving and dropping a batch then costs the training thread no
            ``mmap`` / ``munmap`` (19 ms for a 64 x 640^2 batch with masks).
    """

    def __init__(
        self,
        mask_stride: int = 4,
        shared_memory: bool | None = None,
        channels_last: bool = True,
        buffer_slots: int = DEFAULT_BUFFER_SLOTS,
    ) -> None:
        self.mask_stride = check_int("mask_stride", mask_stride, 1)
        self.shared_memory = check_optional_bool("shared_memory", shared_memory)
        self.channels_last = check_bool("channels_last", channels_last)
        self.buffer_slots = check_int("buffer_slots", buffer_slots, 0)
        # Created here, in the main process, so every worker inherits the same flag table.
        self.pool = SharedBufferPool(buffer_slots) if buffer_slots and pooling_available() else None

    def batch_bytes(self, batch_size: int, canvas_size: tuple[int, int], instances: float) -> int:
        """:func:`batch_bytes` at this collate's ``mask_stride``."""
        return batch_bytes(batch_size, canvas_size, instances, self.mask_stride)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(mask_stride={self.mask_stride}, shared_memory={self.shared_memory}, "
                f"channels_last={self.channels_last}, buffer_slots={self.buffer_slots})")

    def __call__(self, samples: Sequence[Sample]) -> DetectionBatch:
        """Collate per-image samples into one batch.

        Args:
            samples: B samples whose images all have the same ``(H, W)``.

        Returns:
            DetectionBatch with ``masks`` bool ``(sum_N, ceil(H / s), ceil(W / s))``.

        Raises:
            ValueError: no samples, images of different sizes, a malformed sample, or
                ``hsv_gains`` on some samples but not on others (naming the image id).
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
        federated = _federated_lists(samples)
        with_gains = [s.hsv_gains is not None for s in samples]
        if any(with_gains) and not all(with_gains):
            odd = samples[with_gains.index(not with_gains[0])]
            raise ValueError(f"image id {odd.image_id}: hsv_gains on some samples of the batch but not on all")

        # 1. One allocation for every output (a reused shared-memory slot in a worker), so the
        # batch crosses to the main process as one file descriptor, not one per tensor.
        image_shape = (batch_size, height, width, 3) if self.channels_last else (batch_size, 3, height, width)
        # Gains (float64: the hue tables truncate, so a float32 gain could move an entry) and the
        # targets' origins (copy-paste / MixUp) travel in the same segment when the samples carry them.
        mixed = any(s.origins is not None for s in samples)
        extra_layout = [((batch_size, 3), torch.float64)] * with_gains[0] + [((total,), torch.uint8)] * mixed
        (images, masks, ignore, boxes, labels, ann_ids, per_image, image_ids, scales, pads, orig_sizes,
         *rest), lease, fresh = (
            _allocate(
                [(image_shape, torch.uint8), ((total, hp, wp), torch.bool), ((batch_size, hp, wp), torch.bool),
                 ((total, 4), torch.float32), ((total,), torch.int64), ((total,), torch.int64),
                 ((batch_size,), torch.int64), ((batch_size,), torch.int64), ((batch_size,), torch.float32),
                 ((batch_size, 2), torch.float32), ((batch_size, 2), torch.int64), *extra_layout,
                 *(((len(values),), torch.int64) for values, _ in federated),
                 *(((batch_size,), torch.int64) for _ in federated)],
                shared, self.pool,
            )
        )
        extra, rest = rest[: len(extra_layout)], rest[len(extra_layout) :]
        gains = extra[:1] if with_gains[0] else []
        origins = extra[-1] if mixed else None
        # LVIS's per-image lists ride in the same allocation (values, then per-image counts).
        lists, lists_per_image = list(rest[: len(federated)]), list(rest[len(federated) :])
        for (values, per), out, out_per in zip(federated, lists, lists_per_image):
            out.numpy()[:] = values
            out_per.numpy()[:] = per
        if not fresh:  # a reused slot: the rasteriser writes only inside cells
            # numpy's fill is a memset; torch's bool zero_() takes about twice as long here.
            masks.numpy().fill(False)
            ignore.numpy().fill(False)

        # 2. Images: HWC uint8 -> (B, 3, H, W), written straight into the output.
        images_np = images.numpy()
        for b, sample in enumerate(samples):
            images_np[b] = sample.image if self.channels_last else sample.image.transpose(2, 0, 1)
        if self.channels_last:
            images = images.permute(0, 3, 1, 2)

        # 3. Masks: all instances of the batch in one vectorised rasterisation; instances under
        # pasted objects (copy-paste) keep exactly the cells their occluders leave visible.
        polygons = Polygons.concat(s.polygons for s in samples)
        if any(s.occluders is not None for s in samples):
            occluders = Polygons.concat(_occluders_of(s) for s in samples)
            rasterize_visible(polygons.arrays, occluders.arrays, (height, width), stride, out=masks.numpy())
        else:
            rasterize_flat(*polygons.arrays, (height, width), stride, out=masks.numpy())

        # 4. Boxes: given by the augmentation, or derived from the polygons on the canvas.
        boxes_np = boxes.numpy()
        for b, (sample, start) in enumerate(zip(samples, np.cumsum(counts) - counts)):
            if sample.num_instances == 0:
                continue
            if sample.boxes is not None:
                boxes_np[start : start + counts[b]] = sample.boxes
            else:
                boxes_np[start : start + counts[b]] = boxes_from_polygons(sample.polygons, (height, width))

        # 5. Crowd regions sampled at the same cell centres as the masks.
        ignore_np = ignore.numpy()
        half = stride // 2  # pixel holding the centre (j + 0.5) * stride
        for b, sample in enumerate(samples):
            if sample.crowd_mask is not None:
                sampled = sample.crowd_mask[half::stride, half::stride]
                ignore_np[b, : sampled.shape[0], : sampled.shape[1]] = sampled

        # 6. Targets' ids and the letterbox of each image.
        labels.numpy()[:] = np.concatenate([s.labels for s in samples]) if total else 0
        ann_ids.numpy()[:] = np.concatenate([s.annotation_ids for s in samples]) if total else 0
        per_image.numpy()[:] = counts
        image_ids.numpy()[:] = [int(s.image_id) for s in samples]
        scales.numpy()[:] = [float(s.scale) for s in samples]
        pads.numpy()[:] = [tuple(map(float, s.pad)) for s in samples]
        orig_sizes.numpy()[:] = [s.orig_size if s.orig_size is not None else (height, width) for s in samples]
        if gains:
            gains[0].numpy()[:] = [s.hsv_gains for s in samples]
        batch = DetectionBatch(
            images=images,
            boxes=boxes,
            labels=labels,
            masks=masks,
            boxes_per_image=per_image,
            image_ids=image_ids,
            annotation_ids=ann_ids,
            ignore_masks=ignore,
            scales=scales,
            pads=pads,
            orig_sizes=orig_sizes,
            mask_stride=stride,
            counts=dict(samples.counts) if isinstance(samples, SampleBatch) else None,
            hsv_gains=gains[0] if gains else None,
            origins=_origins_of(samples, origins),
        )
        if federated:
            batch.neg_labels, batch.not_exhaustive_labels = lists
            batch.neg_labels_per_image, batch.not_exhaustive_labels_per_image = lists_per_image
        if lease is not None:
            # Unpickled in the main process, it hands the slot back once the batch is dropped.
            batch._lease = lease
        return batch


def _federated_lists(samples: Sequence[Sample]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[(neg values, per-image counts), (not-exhaustive values, counts)]``, or ``[]`` when no
    sample carries the lists (a sample without them, such as a stand-in for a bad image, has
    empty ones)."""
    if all(s.neg_labels is None and s.not_exhaustive_labels is None for s in samples):
        return []
    out = []
    for field in ("neg_labels", "not_exhaustive_labels"):
        per = [np.zeros(0, np.int64) if getattr(s, field) is None else np.asarray(getattr(s, field), np.int64)
               for s in samples]
        values = np.concatenate(per) if per else np.zeros(0, np.int64)
        out.append((values, np.array([len(p) for p in per], np.int64)))
    return out


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
