"""Worker-side collation: stack images and rasterise every instance's mask on the stride grid.

The collate runs inside DataLoader workers, so masks are rasterised concurrently and ahead of the
training step. Inside a worker the large outputs (images, masks, crowd masks) are views of one
shared-memory segment, so handing the batch to the main process sends file descriptors, not
bytes; segments are reused once the main process has dropped their batch
(:mod:`~seg_datamodule.data.batching.shm`), so neither side maps, zero-fills or unmaps a segment per
batch. The rasteriser writes only the inside cells, into a zeroed mask stack.
"""

from __future__ import annotations

import math
from typing import Literal, Sequence

import cv2
import numpy as np
import torch
from torch.utils.data import get_worker_info

from seg_datamodule.ops.checks import check_bool, check_choice, check_int, check_optional_bool
from seg_datamodule.ops.occlusion import rasterize_visible
from seg_datamodule.ops.pixel_fill import rasterize_flat_pixel_fill
from seg_datamodule.ops.raster import grid_size, rasterize_flat
from seg_datamodule.data.batching.shm import Lease, SharedBufferPool, pooling_available
from seg_datamodule.structures import COLUMNS, DetectionBatch, Instances, PendingPixels, Polygons, Sample, SampleBatch

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


def _batch_instances(samples: Sequence[Sample], canvas_size: tuple[int, int]) -> Instances:
    """Every target of the batch, image after image; a sample without boxes gets its polygons'
    boxes clipped to the canvas."""
    return Instances.concat([s.instances if s.boxes is not None else
                             s.instances.with_columns(boxes=boxes_from_polygons(s.polygons, canvas_size))
                             for s in samples])


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


def _split_into(image: np.ndarray, planes: np.ndarray) -> None:
    """Write an ``(H, W, 3)`` image into ``(3, H, W)`` planes: ``cv2.split`` straight into them
    costs under half of numpy's transposing copy."""
    written = cv2.split(image, [planes[0], planes[1], planes[2]])
    for c, plane in enumerate(written):
        if not np.shares_memory(plane, planes[c]):  # OpenCV reallocated (an odd layout): copy
            planes[c] = plane


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
        mask_fill (str): ``"centre"`` (default): a cell is inside when its centre is, exactly
            (:mod:`~seg_datamodule.ops.raster`); ``"ultralytics"``: Ultralytics' targets, filled
            at pixel resolution and resized (:mod:`~seg_datamodule.ops.pixel_fill`; about half a
            pixel larger all round).
    """

    def __init__(
        self,
        mask_stride: int = 4,
        shared_memory: bool | None = None,
        channels_last: bool = True,
        buffer_slots: int = DEFAULT_BUFFER_SLOTS,
        mask_fill: Literal["centre", "ultralytics"] = "centre",
    ) -> None:
        self.mask_stride = check_int("mask_stride", mask_stride, 1)
        self.shared_memory = check_optional_bool("shared_memory", shared_memory)
        self.channels_last = check_bool("channels_last", channels_last)
        self.buffer_slots = check_int("buffer_slots", buffer_slots, 0)
        self.mask_fill = check_choice("mask_fill", mask_fill, ("centre", "ultralytics"))
        # Created here, in the main process, so every worker inherits the same flag table.
        self.pool = SharedBufferPool(buffer_slots) if buffer_slots and pooling_available() else None

    def batch_bytes(self, batch_size: int, canvas_size: tuple[int, int], instances: float) -> int:
        """:func:`batch_bytes` at this collate's ``mask_stride``."""
        return batch_bytes(batch_size, canvas_size, instances, self.mask_stride)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(mask_stride={self.mask_stride}, shared_memory={self.shared_memory}, "
                f"channels_last={self.channels_last}, buffer_slots={self.buffer_slots}, mask_fill={self.mask_fill!r})")

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
        pending = [s.pending is not None for s in samples]
        if any(pending) and not all(pending):
            odd = samples[pending.index(not pending[0])]
            raise ValueError(f"image id {odd.image_id}: pixels pending on the device for some samples of the "
                             "batch but not for all")

        # 1. One allocation for every output (a reused shared-memory slot in a worker), so the
        # batch crosses to the main process as one file descriptor, not one per tensor. The
        # targets' columns (origins only when a sample was mixed) are laid out from COLUMNS; the
        # HSV gains (float64: the hue tables truncate, so a float32 gain could move an entry) and
        # LVIS's per-image lists (values, then per-image counts) ride in the same segment.
        instances = _batch_instances(samples, (height, width))
        columns = [c for c in COLUMNS if c.tensor is not None and getattr(instances, c.name) is not None]
        # Pixels made on the device (pending): an empty stand-in until on_after_batch_transfer.
        rows, cols = (0, 0) if pending[0] else (height, width)
        image_shape = (batch_size, rows, cols, 3) if self.channels_last else (batch_size, 3, rows, cols)
        (images, masks, ignore, per_image, image_ids, scales, pads, orig_sizes, *rest), lease, fresh = (
            _allocate(
                [(image_shape, torch.uint8), ((total, hp, wp), torch.bool), ((batch_size, hp, wp), torch.bool),
                 ((batch_size,), torch.int64), ((batch_size,), torch.int64), ((batch_size,), torch.float32),
                 ((batch_size, 2), torch.float32), ((batch_size, 2), torch.int64),
                 *(((total, *c.trailing), c.tensor) for c in columns),
                 *[((batch_size, 3), torch.float64)] * with_gains[0],
                 *(((len(values),), torch.int64) for values, _ in federated),
                 *(((batch_size,), torch.int64) for _ in federated)],
                shared, self.pool,
            )
        )
        targets = {c.name: out for c, out in zip(columns, rest)}
        rest = rest[len(columns) :]
        gains, rest = rest[: with_gains[0]], rest[with_gains[0] :]
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
        for b, sample in enumerate(samples if not pending[0] else ()):
            if self.channels_last:
                images_np[b] = sample.image
            else:
                _split_into(sample.image, images_np[b])
        if self.channels_last:
            images = images.permute(0, 3, 1, 2)

        # 3. Masks: all instances of the batch in one vectorised rasterisation; instances under
        # pasted objects (copy-paste) keep exactly the cells their occluders leave visible.
        polygons = instances.polygons
        if instances.occluders is not None:
            rasterize_visible(polygons.arrays, instances.occluders.arrays, (height, width), stride, out=masks.numpy(),
                              fill=self.mask_fill)
        elif self.mask_fill == "ultralytics":
            rasterize_flat_pixel_fill(*polygons.arrays, (height, width), stride, out=masks.numpy())
        else:
            rasterize_flat(*polygons.arrays, (height, width), stride, out=masks.numpy())

        # 4. The targets' columns (boxes given by the augmentation or derived above, labels, ids, origins).
        for name, out in targets.items():
            out.numpy()[:] = getattr(instances, name)

        # 5. Crowd regions sampled at the same cell centres as the masks.
        ignore_np = ignore.numpy()
        half = stride // 2  # pixel holding the centre (j + 0.5) * stride
        for b, sample in enumerate(samples):
            if sample.crowd_mask is not None:
                sampled = sample.crowd_mask[half::stride, half::stride]
                ignore_np[b, : sampled.shape[0], : sampled.shape[1]] = sampled

        # 6. The letterbox of each image.
        per_image.numpy()[:] = counts
        image_ids.numpy()[:] = [int(s.image_id) for s in samples]
        scales.numpy()[:] = [float(s.scale) for s in samples]
        pads.numpy()[:] = [tuple(map(float, s.pad)) for s in samples]
        orig_sizes.numpy()[:] = [s.orig_size if s.orig_size is not None else (height, width) for s in samples]
        if gains:
            gains[0].numpy()[:] = [s.hsv_gains for s in samples]
        batch = DetectionBatch(
            images=images,
            masks=masks,
            boxes_per_image=per_image,
            image_ids=image_ids,
            ignore_masks=ignore,
            scales=scales,
            pads=pads,
            orig_sizes=orig_sizes,
            mask_stride=stride,
            counts=dict(samples.counts) if isinstance(samples, SampleBatch) else None,
            hsv_gains=gains[0] if gains else None,
            pending_pixels=PendingPixels.of([s.pending for s in samples], (height, width),  # type: ignore[misc]
                                            image_ids.numpy().copy(), self.channels_last) if pending[0] else None,
            **targets,
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
