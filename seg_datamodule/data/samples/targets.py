"""Everything the index holds for a sample's tiles, read in one place.

:func:`fetch_targets` reads, for the images of a sample's tiles, their polygons (a box-only
instance as the rectangle of its box), labels, annotation ids, crowd regions (through the worker's
cache) and, for an LVIS index, the canvas's category lists (:func:`federated_labels`). The
pipeline (:mod:`~seg_datamodule.data.samples.pipeline`) then carries them through the warp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from seg_datamodule.data.samples.decoding import FederatedIndex, ImageIndex
from seg_datamodule.structures import Polygons
from seg_datamodule.transforms.kernels.box_only import with_box_rings

__all__ = ["CrowdSource", "TileTargets", "federated_labels", "fetch_targets"]


class CrowdSource(Protocol):
    """Where crowd masks come from (:class:`~seg_datamodule.data.samples.decoding.ImageSource`,
    :class:`~seg_datamodule.data.samples.decoding.BatchDecodes`)."""

    def crowd(self, i: int) -> np.ndarray | None:
        """Image ``i``'s crowd mask ``bool (H, W)``, or None when it has no crowd region."""


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
            is the rectangle of its box (:func:`~seg_datamodule.transforms.kernels.box_only.with_box_rings`);
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


def fetch_targets(index: ImageIndex, source: CrowdSource, ids: np.ndarray, visible: np.ndarray) -> TileTargets:
    """The targets of the tiles ``ids`` (crowd masks only for the ``visible`` ones, from ``source``:
    the worker's cache, or a batch's decodes, which decode each image's crowd regions once).

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
    not_exhaustive = [index.not_exhaustive_labels(int(i)) for i in ids]
    for i in ids[1:]:
        if not len(neg):  # an empty intersection stays empty (COCO data: every list is)
            break
        neg = np.intersect1d(neg, index.neg_labels(int(i)))
    # The union of all, as one unique (what union1d does pairwise).
    union = not_exhaustive[0] if len(ids) == 1 else np.unique(np.concatenate(not_exhaustive))
    return neg.astype(np.int64), union.astype(np.int64)
