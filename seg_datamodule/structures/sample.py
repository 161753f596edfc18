"""What a dataset returns per image: one augmented image and its instances on the output canvas.

A :class:`Sample` is what ``SegDataset.__getitem__`` returns after augmentation: the image on its
output canvas, with every instance as :class:`~seg_datamodule.structures.polygons.Polygons` in
canvas pixels. Flat numpy arrays pickle in one buffer each, so handing samples between processes
costs little, and the collate rasterises them without touching Python objects per ring.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterator, Sequence, overload

import numpy as np

from seg_datamodule.structures.instances import Instances
from seg_datamodule.structures.pending import PendingTiles
from seg_datamodule.structures.polygons import Polygons

__all__ = ["ORIGINS", "Sample", "SampleBatch"]

#: What ``Sample.origins`` / ``DetectionBatch.origins`` codes mean: 0 an instance of the sample's
#: own tiles, 1 a copy pasted by copy-paste, 2 an instance mixed in by MixUp.
ORIGINS: tuple[str, ...] = ("own", "pasted", "mixup")


@dataclass(frozen=True)
class Sample:
    """One augmented image and its instances on the output canvas (frozen: a stage that changes a
    sample returns a new one, ``dataclasses.replace``).

    Attributes:
        image (ndarray[H, W, 3] uint8): RGB pixels, C-contiguous (HWC, as OpenCV and
            albumentations produce them).
        image_id (int): COCO image id (for a mosaic, the id of the first tile).
        polygons (Polygons): the N instances in canvas pixels.
        labels (ndarray[N] int64): contiguous class indices ``0..C-1``.
        annotation_ids (ndarray[N] int64): COCO annotation ids, so every target is traceable.
        boxes (ndarray[N, 4] float32 | None): xyxy boxes in canvas pixels; ``None`` lets the
            collate derive them from the polygons clipped to the canvas.
        crowd_mask (ndarray[H, W] bool | None): union of crowd (``iscrowd=1``) regions on the
            canvas, pixels a model should ignore; ``None`` when there are none or they were dropped.
        scale (float): original image pixels -> canvas pixels (letterbox); 1.0 for mosaics.
        pad (tuple[float, float]): letterbox padding (left, top) in canvas pixels.
        orig_size (tuple[int, int] | None): original image (H, W); ``None`` means the canvas size.
        neg_labels (ndarray[K] int64 | None): sorted labels verified absent from the canvas
            (LVIS ``neg_category_ids``; for a mosaic, those every tile's image verified
            absent); ``None`` when the index has no such lists.
        not_exhaustive_labels (ndarray[M] int64 | None): sorted labels whose instances may not
            all be annotated (LVIS ``not_exhaustive_category_ids``, of any tile for a mosaic).
        occluders (Polygons | None): N instances aligned with ``polygons``: instance ``n`` holds
            the rings of every object pasted above instance ``n`` (none when nothing covers it),
            so its target is its own region minus their union (see
            :func:`~seg_datamodule.ops.occlusion.rasterize_visible`); ``None``: nothing pasted.
        origins (ndarray[N] uint8 | None): per instance, an index of :data:`ORIGINS`;
            ``None``: all the sample's own.
        has_mask (ndarray[N] bool | None): False for a box-only instance (``box_only: keep``),
            which has no ring and only its box; ``None``: every instance has a mask.
        hsv_gains (ndarray[3] float64 | None): HSV jitter gains still to apply to ``image``
            (``HSVJitter.draw``; with ``hsv_on_device`` the accelerator applies them); ``None``
            when there are none.
        pending (PendingTiles | None): ``pixels_on_device``: the pixels are still to be made on
            the device from these tiles; ``image`` is then a read-only stand-in of the canvas's
            size (one fill value, no memory). None: ``image`` holds the pixels.
    """

    image: np.ndarray
    image_id: int
    polygons: Polygons
    labels: np.ndarray
    annotation_ids: np.ndarray
    boxes: np.ndarray | None = None
    crowd_mask: np.ndarray | None = None
    scale: float = 1.0
    pad: tuple[float, float] = (0.0, 0.0)
    orig_size: tuple[int, int] | None = None
    neg_labels: np.ndarray | None = None
    not_exhaustive_labels: np.ndarray | None = None
    occluders: Polygons | None = None
    origins: np.ndarray | None = None
    hsv_gains: np.ndarray | None = None
    has_mask: np.ndarray | None = None
    pending: PendingTiles | None = None

    @property
    def num_instances(self) -> int:
        """N, the number of instances."""
        return len(self.polygons)

    @property
    def instances(self) -> Instances:
        """The polygons and per-instance columns as one :class:`Instances` (views, no copy)."""
        return Instances(self.polygons, self.labels, self.annotation_ids, self.boxes, self.occluders, self.origins,
                         self.has_mask)

    def with_instances(self, instances: Instances, **changes: object) -> "Sample":
        """This sample with ``instances`` (and any other fields in ``changes``) in place of its own."""
        return replace(self, **instances.fields(), **changes)  # type: ignore[arg-type]

    @property
    def canvas_size(self) -> tuple[int, int]:
        """(H, W) of the image."""
        return int(self.image.shape[0]), int(self.image.shape[1])

    def validate(self) -> None:
        """Check shapes and offsets; raises ``ValueError`` (``TypeError`` for a wrong type) naming the image id."""
        where = f"image id {self.image_id}"
        if self.image.dtype != np.uint8 or self.image.ndim != 3 or self.image.shape[2] != 3:
            raise ValueError(
                f"{where}: image must be uint8 (H, W, 3), got {self.image.dtype} {self.image.shape}"
            )
        if not isinstance(self.polygons, Polygons):
            raise TypeError(f"{where}: polygons must be a Polygons, got {type(self.polygons).__name__}")
        self.polygons.validate(where)
        n = self.num_instances
        if len(self.labels) != n or len(self.annotation_ids) != n:
            raise ValueError(
                f"{where}: {n} instances but {len(self.labels)} labels and "
                f"{len(self.annotation_ids)} annotation ids"
            )
        if self.boxes is not None and self.boxes.shape != (n, 4):
            raise ValueError(f"{where}: boxes must be ({n}, 4), got {self.boxes.shape}")
        if self.occluders is not None:
            if not isinstance(self.occluders, Polygons):
                raise TypeError(f"{where}: occluders must be a Polygons, got {type(self.occluders).__name__}")
            self.occluders.validate(f"{where} occluders")
            if len(self.occluders) != n:
                raise ValueError(f"{where}: {n} instances but occluders for {len(self.occluders)}")
        if self.origins is not None and (self.origins.shape != (n,) or self.origins.max(initial=0) >= len(ORIGINS)):
            raise ValueError(f"{where}: origins must be ({n},) codes below {len(ORIGINS)}, got {self.origins!r:.80}")
        if self.has_mask is not None and (np.shape(self.has_mask) != (n,) or np.asarray(self.has_mask).dtype != bool):
            raise ValueError(f"{where}: has_mask must be ({n},) bool, got {np.shape(self.has_mask)}")
        if self.hsv_gains is not None and np.shape(self.hsv_gains) != (3,):
            raise ValueError(f"{where}: hsv_gains must be (3,), got {np.shape(self.hsv_gains)}")
        if self.crowd_mask is not None and self.crowd_mask.shape != self.image.shape[:2]:
            raise ValueError(
                f"{where}: crowd_mask {self.crowd_mask.shape} does not match image {self.image.shape[:2]}"
            )


@dataclass(frozen=True)
class SampleBatch(Sequence[Sample]):
    """The samples of one batch and where that batch's annotations went, as one value.

    What ``SegDataset.__getitems__`` returns: a sequence of :class:`Sample` (so any collate that
    iterates a list takes it) with ``counts``, this batch's annotation counts by reason and its
    decode counts, which :class:`~seg_datamodule.data.batching.collate.DetectionCollate` puts on
    ``DetectionBatch.counts`` so the main process counts what it trains on, not what the workers
    built ahead.

    Attributes:
        samples (tuple[Sample, ...]): the batch, in order.
        counts (dict[str, int]): reason (or decode key) -> count, zeros left out.
    """

    samples: tuple[Sample, ...]
    counts: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.samples)

    @overload
    def __getitem__(self, i: int) -> Sample: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[Sample, ...]: ...

    def __getitem__(self, i: int | slice) -> Sample | tuple[Sample, ...]:
        return self.samples[i]

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples)
