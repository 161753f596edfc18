"""Build one sample from its decoded tiles and its images' targets, fetched in one place.

The second stage of the sample path (:mod:`~seg_datamodule.data.sample_path`), after
:mod:`~seg_datamodule.data.tiles`: :func:`fetch_targets` reads everything the index holds for the
tiles' images (polygons, labels, annotation ids, crowd regions, LVIS lists), and
:func:`assemble_sample` warps pixels, crowd regions and polygons onto the canvas, runs the
per-sample steps and returns the sample with the fate of every annotation. Pure given its
inputs: the same tiles, targets and generator give the same sample, whichever worker builds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from seg_datamodule.data.loading import FederatedIndex, ImageIndex, ImageSource
from seg_datamodule.data.tiles import Tiles
from seg_datamodule.structures import Polygons, Sample
from seg_datamodule.transforms.box_only import with_box_rings, without_rings
from seg_datamodule.transforms.albu import AlbumentationsTransform
from seg_datamodule.transforms.plan import TilePlan
from seg_datamodule.transforms.polygons import drop_reasons, transform_polygons
from seg_datamodule.transforms.steps import Canvas, CanvasStep
from seg_datamodule.transforms.warp import FILL_VALUE, warp_tiles

__all__ = ["Frame", "SampleSteps", "TileTargets", "assemble_sample", "empty_sample", "federated_labels",
           "fetch_targets"]


@dataclass(frozen=True)
class SampleSteps:
    """The per-sample steps of training (validation has none and keeps every instance).

    Attributes:
        pixel_steps (tuple[CanvasStep, ...]): the recipe's pixel steps, drawn and applied in order
            after the plan-phase ones (the user's albumentations pipeline, then YOLO's HSV jitter,
            Ultralytics' order; with ``on_device`` HSV records its gains on the sample instead).
        min_area_ratio (float): drop an instance keeping less than this fraction of its area.
        min_box_size (float): drop an instance whose box is narrower or lower than this.
    """

    pixel_steps: tuple[CanvasStep, ...]
    min_area_ratio: float
    min_box_size: float

    @property
    def transforms(self) -> AlbumentationsTransform:
        """The albumentations step (an empty one when the recipe has none)."""
        return next((s for s in self.pixel_steps if isinstance(s, AlbumentationsTransform)),
                    AlbumentationsTransform(None))


@dataclass(frozen=True)
class Frame:
    """Where a letterboxed validation image sits on the canvas (so predictions map back)."""

    scale: float
    pad: tuple[float, float]
    orig_size: tuple[int, int]


@dataclass(frozen=True)
class TileTargets:
    """Everything the index holds for a sample's tiles, read once.

    Attributes:
        image_id (int): COCO id of the first tile's image (the sample's own).
        polygons (tuple[Polygons, ...]): per tile, its image's instances (original pixels).
        labels (ndarray[N] int64), annotation_ids (ndarray[N] int64): of every tile's instances.
        crowds (tuple[ndarray | None, ...]): per tile, its crowd mask ``bool (H, W)`` (None: none,
            or the tile does not show).
        neg_labels, not_exhaustive_labels (ndarray int64 | None): the canvas's LVIS lists
            (:func:`federated_labels`); None when the index has none.
        has_mask (ndarray[N] bool | None): False for a box-only instance, whose polygon here
            is the rectangle of its box (:func:`~seg_datamodule.transforms.box_only.with_box_rings`);
            None when every instance has a mask.
    """

    image_id: int
    polygons: tuple[Polygons, ...]
    labels: np.ndarray
    annotation_ids: np.ndarray
    crowds: tuple[np.ndarray | None, ...]
    neg_labels: np.ndarray | None = None
    not_exhaustive_labels: np.ndarray | None = None
    has_mask: np.ndarray | None = None


def fetch_targets(index: ImageIndex, source: ImageSource, ids: np.ndarray, visible: np.ndarray) -> TileTargets:
    """The targets of the tiles ``ids`` (crowd masks only for the ``visible`` ones, through the cache).

    An index with box-only instances (no ring; ``box_only: keep``) has ``bboxes(i)``, as
    ``CocoIndex`` and a streamed index do: their boxes are read there.
    """
    tiles = [int(i) for i in ids]
    neg = not_exhaustive = None
    if isinstance(index, FederatedIndex):
        neg, not_exhaustive = federated_labels(index, ids)
    polygons, has_mask = [], []
    for i in tiles:
        own = index.polygons(i)
        # Box-only instances (no ring, box_only: keep) go through the geometry as their box.
        boxed, mask = (own, None) if np.all(np.diff(own.instance_offsets) > 0) else with_box_rings(own, index.bboxes(i))
        polygons.append(boxed)
        has_mask.append(np.ones(len(own), bool) if mask is None else mask)
    flags = np.concatenate(has_mask) if has_mask else np.zeros(0, bool)
    return TileTargets(
        image_id=int(index.image_ids[tiles[0]]),
        polygons=tuple(polygons),
        has_mask=None if flags.all() else flags,
        labels=np.concatenate([index.labels(i) for i in tiles]).astype(np.int64),
        annotation_ids=np.concatenate([index.annotation_ids(i) for i in tiles]).astype(np.int64),
        crowds=tuple(source.crowd(i) if v else None for i, v in zip(tiles, visible)),
        neg_labels=neg,
        not_exhaustive_labels=not_exhaustive,
    )


def assemble_sample(
    tiles: Tiles,
    targets: TileTargets,
    steps: SampleSteps | None,
    rng: np.random.Generator | None,
    drawn: tuple[tuple[CanvasStep, object], ...] = (),
    frame: Frame | None = None,
) -> tuple[Sample, np.ndarray]:
    """Warp the tiles into one canvas and carry every instance of every tile through.

    Args:
        tiles (Tiles): the decoded tiles and their plan.
        targets (TileTargets): the tiles' instances and crowd regions.
        steps (SampleSteps | None): training's per-sample steps; None (validation) runs none
            and drops only degenerate or outside instances.
        rng (numpy.random.Generator | None): the sample's generator, for ``steps``.
        drawn (tuple[tuple[CanvasStep, object], ...]): the canvas steps drawn in the plan phase
            (the flip) with their parameters, applied in order after the warp.
        frame (Frame | None): where a letterboxed image sits (validation).

    Returns:
        sample (Sample): the kept instances.
        codes (ndarray[N] int64): per instance of every tile, 0 if kept or the index of its
            drop reason in :data:`~seg_datamodule.transforms.polygons.DROP_REASONS`.
    """
    plan = tiles.plan
    assert plan is not None, "a load ended by a bad image has no plan"
    # 1. Pixels: one resample per tile, straight into the output.
    image = warp_tiles(list(tiles.images), plan, list(tiles.reduces))

    # 2. Crowd regions through the same matrices (nearest), if the index keeps them.
    crowd = None
    if any(c is not None for c in targets.crowds):
        sel = [k for k, c in enumerate(targets.crowds) if c is not None]
        sub = TilePlan(plan.matrices[sel], plan.regions[sel], plan.output_size,
                       None if plan.resize is None else plan.resize[sel])
        crowd = warp_tiles([targets.crowds[k].view(np.uint8) for k in sel], sub, fill=0,  # type: ignore[union-attr]
                           interpolation=cv2.INTER_NEAREST, out=np.zeros(plan.output_size, np.uint8))

    # 3. Polygons: clip to each tile's region, map, clip to the output.
    polygons, area_before, area_after = transform_polygons(list(targets.polygons), plan)

    canvas = Canvas(image, polygons, crowd, area_before, area_after)
    # 4. The canvas steps drawn before decode (the flip): exact on the output, no resample.
    for step, params in drawn:
        canvas = step.apply(canvas, params)

    # 5. The pixel steps (training only), each drawn now, in order: albumentations, then HSV
    # (Ultralytics' order; HSV drawn after every other draw, so setting it changes no other).
    if steps is not None and rng is not None:
        for step in steps.pixel_steps:
            canvas = step.apply(canvas, step.draw(rng))
    image, polygons, crowd = canvas.image, canvas.polygons, canvas.crowd
    area_before, area_after, hsv_gains = canvas.area_before, canvas.area_after, canvas.hsv_gains

    # 6. Drop what is degenerate, outside, mostly cut off or tiny (validation keeps tiny instances:
    # losses see every target there).
    min_area_ratio, min_box_size = (0.0, 0.0) if steps is None else (steps.min_area_ratio, steps.min_box_size)
    codes, boxes = drop_reasons(polygons, area_before, area_after, min_area_ratio, min_box_size)
    keep = codes == 0
    # 7. Box-only instances kept their box: now they lose the rectangle that carried it.
    has_mask = None if targets.has_mask is None else targets.has_mask[keep]
    kept = polygons.select(keep) if has_mask is None else without_rings(polygons.select(keep), has_mask)
    sample = Sample(
        image=np.ascontiguousarray(image),
        image_id=targets.image_id,
        polygons=kept,
        has_mask=None if has_mask is None or has_mask.all() else has_mask,
        labels=targets.labels[keep],
        annotation_ids=targets.annotation_ids[keep],
        boxes=boxes[keep].astype(np.float32),
        crowd_mask=None if crowd is None else crowd.astype(bool),
        hsv_gains=hsv_gains,
        neg_labels=targets.neg_labels,
        not_exhaustive_labels=targets.not_exhaustive_labels,
        **({} if frame is None else {"scale": frame.scale, "pad": frame.pad, "orig_size": frame.orig_size}),
    )
    return sample, codes


def federated_labels(index: FederatedIndex, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The LVIS category lists of a canvas made of the images ``ids``.

    A category is verified absent from the canvas only when every tile's image verified it
    absent (a category one tile's image was never checked for may be visible in that tile);
    it may be incompletely annotated when it is so in any tile's image.

    Args:
        index (FederatedIndex): the per-image lists.
        ids (ndarray[K] int64): image index of each tile.

    Returns:
        neg_labels (ndarray int64) and not_exhaustive_labels (ndarray int64), sorted, unique.
    """
    neg = index.neg_labels(int(ids[0]))
    not_exhaustive = index.not_exhaustive_labels(int(ids[0]))
    for i in ids[1:]:
        neg = np.intersect1d(neg, index.neg_labels(int(i)))
        not_exhaustive = np.union1d(not_exhaustive, index.not_exhaustive_labels(int(i)))
    return neg.astype(np.int64), not_exhaustive.astype(np.int64)


def empty_sample(image_id: int, image_size: int, frame: Frame) -> Sample:
    """A grey validation sample without instances, standing in for an image that failed to load."""
    return Sample(
        image=np.full((image_size, image_size, 3), FILL_VALUE, np.uint8),
        image_id=image_id,
        polygons=Polygons.empty(),
        labels=np.zeros(0, np.int64),
        annotation_ids=np.zeros(0, np.int64),
        boxes=np.zeros((0, 4), np.float32),
        scale=frame.scale,
        pad=frame.pad,
        orig_size=frame.orig_size,
    )
