"""Box-only instances (``box_only: keep``) through the geometry: as the rectangle of their box.

A box-only annotation has a box and no mask; the index stores it as an instance without a ring.
So that the warp, flips, clips and drop rules of the sample path move its box exactly as they
move a polygon (its box is the box of its transformed, clipped corners), :func:`with_box_rings`
gives it the rectangle of its box as one ring for the way, and :func:`without_rings` empties it
again once its box is taken: the sample carries it without a ring and with ``has_mask`` False,
so it covers no pixel of a mask, pastes no pixel and occludes nothing.
"""

from __future__ import annotations

import numpy as np

from seg_datamodule.ops.ragged import offsets_from_lengths
from seg_datamodule.structures import Polygons

__all__ = ["box_corners", "with_box_rings", "without_rings"]


def box_corners(xywh: np.ndarray) -> np.ndarray:
    """The 4 corners of each ``[x, y, w, h]`` box, clockwise in image coordinates.

    Args:
        xywh (ndarray[K, 4] float): COCO boxes.

    Returns:
        ndarray[K, 4, 2] float64.
    """
    b = np.asarray(xywh, np.float64).reshape(-1, 4)
    x0, y0, x1, y1 = b[:, 0], b[:, 1], b[:, 0] + b[:, 2], b[:, 1] + b[:, 3]
    return np.stack([np.stack([x0, y0], 1), np.stack([x1, y0], 1), np.stack([x1, y1], 1), np.stack([x0, y1], 1)], 1)


def with_box_rings(polygons: Polygons, xywh: np.ndarray) -> tuple[Polygons, np.ndarray]:
    """``polygons`` with each instance without a ring given the rectangle of its box as its ring.

    Args:
        polygons (Polygons): N instances (box-only ones without a ring).
        xywh (ndarray[N, 4] float): every instance's ``[x, y, w, h]`` box (only box-only ones are read).

    Returns:
        polygons (Polygons): N instances, each with at least one ring (same object if none was box-only).
        has_mask (ndarray[N] bool): False for the instances that had no ring.
    """
    nrings = np.diff(polygons.instance_offsets)
    has_mask = nrings > 0
    if has_mask.all():
        return polygons, has_mask
    corners = box_corners(np.asarray(xywh)[~has_mask])
    parts, k = [], 0
    for n in range(len(polygons)):
        if has_mask[n]:
            parts.append(polygons.select(np.arange(len(polygons)) == n))
        else:
            parts.append(Polygons(corners[k], np.array([0, 4], np.int64), np.array([0, 1], np.int64)))
            k += 1
    return Polygons.concat(parts), has_mask


def without_rings(polygons: Polygons, has_mask: np.ndarray) -> Polygons:
    """``polygons`` with every ring of the instances where ``has_mask`` is False removed.

    Args:
        polygons (Polygons): N instances.
        has_mask (ndarray[N] bool): which instances keep their rings.

    Returns:
        Polygons: N instances (same object if every instance keeps its rings).
    """
    has_mask = np.asarray(has_mask, bool)
    if has_mask.all():
        return polygons
    nrings = np.diff(polygons.instance_offsets)
    ring_keep = np.repeat(has_mask, nrings)
    lens = np.diff(polygons.ring_offsets)
    vertices = polygons.vertices[np.repeat(ring_keep, lens)]
    return Polygons(vertices, offsets_from_lengths(lens[ring_keep]), offsets_from_lengths(np.where(has_mask, nrings, 0)))
