"""Assemble one sample from its tiles: load them (replacing bad images), then pixels, crowd
regions, polygons and drops.

Pure given its inputs: the same tiles, plan and generator give the same sample, whichever worker
builds it.
"""

from __future__ import annotations

from typing import Callable, Sequence

import cv2
import numpy as np

from seg_datamodule.data.loading import FederatedIndex, ImageIndex
from seg_datamodule.io.images import BadImageError
from seg_datamodule.structures import Polygons, Sample
from seg_datamodule.transforms.albu import AlbumentationsTransform, hsv_jitter
from seg_datamodule.transforms.hsv import HSVJitter
from seg_datamodule.transforms.plan import TilePlan, choose_reduce, visible_tiles
from seg_datamodule.transforms.polygons import drop_reasons, transform_polygons
from seg_datamodule.transforms.warp import FILL_VALUE, warp_tiles

__all__ = ["assemble_sample", "empty_sample", "federated_labels", "load_tiles", "other_index"]


def load_tiles(
    ids: np.ndarray,
    plan_for: Callable[[np.ndarray], TilePlan],
    load: Callable[[int, int], tuple[np.ndarray, int]],
    on_bad: Callable[[BadImageError, int, int], int],
) -> tuple[np.ndarray, TilePlan, list[np.ndarray | None], list[int]]:
    """Plan the tiles ``ids`` and decode the visible ones, replacing images that fail to load.

    Args:
        ids (ndarray[K] int64): image index per tile (the sample's own image first).
        plan_for: ``plan_for(ids) -> TilePlan`` under the sample's drawn geometry.
        load: ``load(i, reduce) -> (image, reduce it was decoded at)``, at most ``reduce``.
        on_bad: ``on_bad(error, i, retries) -> replacement index``; counts or raises.

    Returns:
        the tile ids after replacements, their plan, per tile the image (None when not
        visible) and the reduction it was decoded at.
    """
    ids = ids.copy()
    plan = plan_for(ids)
    images: list[np.ndarray | None] = [None] * len(ids)
    reduces = [1] * len(ids)
    retries = k = 0
    visible = visible_tiles(plan)
    while k < len(ids):
        if visible[k]:
            try:
                # The coarsest JPEG scale the tile's resample allows, decided before the decode.
                images[k], reduces[k] = load(int(ids[k]), choose_reduce(plan.matrices[k]))
            except BadImageError as err:
                retries += 1
                ids[k] = on_bad(err, int(ids[k]), retries)
                plan = plan_for(ids)
                visible = visible_tiles(plan)
                continue
        k += 1
    return ids, plan, images, reduces


def assemble_sample(
    index: ImageIndex,
    ids: np.ndarray,
    plan: TilePlan,
    images: Sequence[np.ndarray | None],
    reduces: Sequence[int],
    crowd_tiles: Sequence[np.ndarray | None],
    *,
    flip: bool,
    transforms: AlbumentationsTransform | None,
    rng: np.random.Generator | None,
    min_area_ratio: float,
    min_box_size: float,
    hsv: HSVJitter | None = None,
) -> tuple[Sample, np.ndarray]:
    """Warp the tiles into one canvas and carry every instance of every tile through.

    Args:
        index (ImageIndex): polygons, labels and annotation ids of the tiles' images.
        ids (ndarray[K] int64): image index of each tile (the sample's own image first).
        plan (TilePlan): where each tile lands.
        images: per tile, the decoded image (None for a tile that does not show).
        reduces: per tile, the JPEG reduction its image was decoded at.
        crowd_tiles: per tile, its crowd mask ``bool (H, W)`` or None.
        flip (bool): mirror the canvas horizontally.
        transforms (AlbumentationsTransform | None): the user's pipeline (training only).
        rng (numpy.random.Generator | None): the sample's generator, for ``transforms``.
        min_area_ratio (float): drop an instance keeping less than this fraction of its area.
        min_box_size (float): drop an instance whose box is narrower or lower than this.
        hsv (HSVJitter | None): YOLO's HSV jitter (training only), drawn from ``rng`` after
            everything else and applied last, after ``transforms`` (Ultralytics' order); with
            ``hsv.on_device`` the gains go on the sample instead, for the accelerator.

    Returns:
        sample (Sample): the kept instances.
        codes (ndarray[N] int64): per instance of every tile, 0 if kept or the index of its
            drop reason in :data:`~seg_datamodule.transforms.polygons.DROP_REASONS`.
    """
    # 1. Pixels: one resample per tile, straight into the output.
    image = warp_tiles(images, plan, reduces)

    # 2. Crowd regions through the same matrices (nearest), if the index keeps them.
    crowd = None
    if any(c is not None for c in crowd_tiles):
        sel = [k for k, c in enumerate(crowd_tiles) if c is not None]
        sub = TilePlan(plan.matrices[sel], plan.regions[sel], plan.output_size,
                       None if plan.resize is None else plan.resize[sel])
        crowd = warp_tiles(
            [crowd_tiles[k].view(np.uint8) for k in sel],
            sub,
            fill=0,
            interpolation=cv2.INTER_NEAREST,
            out=np.zeros(plan.output_size, np.uint8),
        )

    # 3. Polygons: clip to each tile's region, map, clip to the output.
    labels = np.concatenate([index.labels(int(i)) for i in ids]).astype(np.int64)
    ann_ids = np.concatenate([index.annotation_ids(int(i)) for i in ids]).astype(np.int64)
    polygons, area_before, area_after = transform_polygons([index.polygons(int(i)) for i in ids], plan)

    # 4. Horizontal flip: mirror pixels and vertices (exact; no resample).
    if flip:
        w = plan.output_size[1]
        image = cv2.flip(image, 1, dst=image)  # in place: the canvas is ours
        crowd = None if crowd is None else cv2.flip(crowd, 1, dst=crowd)
        polygons = polygons.flip_lr(w)

    # 5. The user's albumentations pipeline (training only); geometric steps move the
    # vertices as keypoints, then the polygons are clipped to the image again.
    if transforms and rng is not None:
        if transforms.geometric:
            image, vertices, crowd = transforms(rng, image, polygons.vertices, crowd)
            unclipped = Polygons(vertices, polygons.ring_offsets, polygons.instance_offsets)
            polygons = unclipped.clip((0.0, 0.0, float(image.shape[1]), float(image.shape[0])))
            moved, after = unclipped.areas(), polygons.areas()
            # Compound the two clips' ratios: before * (moved / area_after) is the area the
            # final clip should be compared with.
            with np.errstate(divide="ignore", invalid="ignore"):
                area_before = np.where(area_after > 0, area_before * moved / area_after, area_before)
            area_after = after
        else:
            image = transforms(rng, image)[0]

    # 6. YOLO's HSV jitter last (after albumentations, as Ultralytics runs it), drawn after every
    # other draw so that setting it changes no other augmentation.
    hsv_gains = None
    if hsv is not None and rng is not None:
        hsv_gains = hsv.draw(rng)
        if not hsv.on_device:
            image, hsv_gains = hsv_jitter(image, hsv_gains), None

    # 7. Drop what is degenerate, outside, mostly cut off or tiny.
    codes, boxes = drop_reasons(polygons, area_before, area_after, min_area_ratio, min_box_size)
    keep = codes == 0
    sample = Sample(
        image=np.ascontiguousarray(image),
        image_id=int(index.image_ids[int(ids[0])]),
        polygons=polygons.select(keep),
        labels=labels[keep],
        annotation_ids=ann_ids[keep],
        boxes=boxes[keep].astype(np.float32),
        crowd_mask=None if crowd is None else crowd.astype(bool),
        hsv_gains=hsv_gains,
    )
    if isinstance(index, FederatedIndex):
        sample.neg_labels, sample.not_exhaustive_labels = federated_labels(index, ids)
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


def other_index(rng: np.random.Generator, bad: int, n: int) -> int:
    """A uniform draw from ``0..n-1`` without ``bad`` (``bad`` itself when it is the only one)."""
    if n < 2:
        return bad
    other = int(rng.integers(0, n - 1))
    return other + (other >= bad)


def empty_sample(
    image_id: int, image_size: int, scale: float, pad: tuple[float, float], orig_size: tuple[int, int]
) -> Sample:
    """A grey validation sample without instances, standing in for an image that failed to load."""
    return Sample(
        image=np.full((image_size, image_size, 3), FILL_VALUE, np.uint8),
        image_id=image_id,
        polygons=Polygons.empty(),
        labels=np.zeros(0, np.int64),
        annotation_ids=np.zeros(0, np.int64),
        boxes=np.zeros((0, 4), np.float32),
        scale=float(scale),
        pad=(float(pad[0]), float(pad[1])),
        orig_size=orig_size,
    )
