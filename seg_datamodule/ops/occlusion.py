"""Exact occlusion on the stride grid: each instance's own region minus the regions above it.

An instance under pasted objects (copy-paste) carries its *occluders*: the polygons of every
object pasted above it, as one instance whose rings are all of theirs (an instance is the union
of its rings, so that is the union of the regions above). Its mask is then the cells of its own
region that no occluder covers, both sampled at the same cell centres with the same crossing
test (:func:`~seg_datamodule.ops.raster.rasterize_flat`), so the result is bit-identical to
"own AND NOT union(occluders)" computed with the full-grid reference, at every stride.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from seg_datamodule.ops.geometry import select_instances
from seg_datamodule.ops.ragged import offsets_from_lengths, ragged_index
from seg_datamodule.ops.pixel_fill import rasterize_flat_pixel_fill
from seg_datamodule.ops.raster import rasterize_flat

__all__ = ["group_occluders", "rasterize_visible"]

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]


def rasterize_visible(
    polygons: Arrays,
    occluders: Arrays | None,
    canvas_size: tuple[int, int],
    stride: int = 4,
    out: np.ndarray | None = None,
    fill: Literal["centre", "ultralytics"] = "centre",
) -> np.ndarray:
    """Rasterise N instances, each minus the union of its occluders, onto the stride grid.

    Args:
        polygons: ``(vertices, ring_offsets, instance_offsets)`` of the N instances.
        occluders: the same layout with N instances too (instance ``n`` holds the rings above
            instance ``n``; none for an unoccluded one), or None for no occlusion at all.
        canvas_size (tuple[int, int]): ``(H, W)``.
        stride (int): grid stride.
        out (ndarray[N, Hp, Wp] bool | None): zero-filled output (see ``rasterize_flat``).
        fill (str): ``"centre"``, the exact cell-centre test; ``"ultralytics"``, Ultralytics'
            fill-then-resize rule (:mod:`~seg_datamodule.ops.pixel_fill`) for both sets.

    Returns:
        ndarray[N, Hp, Wp] bool: the visible cells of each instance (``out`` when given).

    Raises:
        ValueError: ``occluders`` holds a different number of instances, or what
            ``rasterize_flat`` raises for either set.
    """
    rasterize = rasterize_flat_pixel_fill if fill == "ultralytics" else rasterize_flat
    masks = rasterize(*polygons, canvas_size, stride, out=out)
    if occluders is None:
        return masks
    n = len(polygons[2]) - 1
    if len(occluders[2]) - 1 != n:
        raise ValueError(f"occluders hold {len(occluders[2]) - 1} instances for {n} instances")
    has = np.diff(occluders[2]) > 0
    if not has.any():
        return masks
    # Only the occluded instances: their occluders' masks, then clear what those cover.
    covered = rasterize(*select_instances(*occluders, has), canvas_size, stride)
    idx = np.flatnonzero(has)
    masks[idx] &= ~covered
    return masks


def group_occluders(
    boxes: np.ndarray, occluders: Arrays, occluder_boxes: np.ndarray, margin: float = 1.0
) -> tuple[Arrays, np.ndarray]:
    """For each of N instances, one instance made of the rings of the occluders that may cover it.

    An occluder is attached to an instance when their boxes, grown by ``margin`` pixels, meet:
    regions whose boxes are that far apart share no cell centre, so leaving the others out
    changes no cell (and keeps the work proportional to the overlaps).

    Args:
        boxes (ndarray[N, 4] float): xyxy boxes of the instances.
        occluders: ``(vertices, ring_offsets, instance_offsets)`` of P occluding instances.
        occluder_boxes (ndarray[P, 4] float): their xyxy boxes.
        margin (float): pixels by which boxes are grown before the test.

    Returns:
        grouped: ``(vertices, ring_offsets, instance_offsets)`` with N instances.
        touched (ndarray[N] bool): instances with at least one occluder attached.
    """
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    occluder_boxes = np.asarray(occluder_boxes, np.float64).reshape(-1, 4)
    meets = (
        (boxes[:, None, 0] <= occluder_boxes[None, :, 2] + margin)
        & (occluder_boxes[None, :, 0] <= boxes[:, None, 2] + margin)
        & (boxes[:, None, 1] <= occluder_boxes[None, :, 3] + margin)
        & (occluder_boxes[None, :, 1] <= boxes[:, None, 3] + margin)
    )
    # 1. The (instance, occluder) pairs in instance order, and each pair's rings.
    vertices, ring_offsets, instance_offsets = occluders
    inst, occ = np.nonzero(meets)
    ring_counts = np.diff(instance_offsets)[occ]
    rings = ragged_index(instance_offsets[occ], ring_counts)
    # 2. Gather those rings' vertices; instance n owns the rings of all its pairs.
    ring_lengths = np.diff(ring_offsets)[rings]
    grouped = (
        np.asarray(vertices, np.float64).reshape(-1, 2)[ragged_index(ring_offsets[rings], ring_lengths)],
        offsets_from_lengths(ring_lengths),
        offsets_from_lengths(np.bincount(inst, weights=ring_counts, minlength=len(boxes)).astype(np.int64)),
    )
    return grouped, meets.any(axis=1)
