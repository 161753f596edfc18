"""Polygon transport through a tile plan: clip to each tile's region, map, clip to the canvas.

The exact rectangle clip of :mod:`seg_datamodule.ops.geometry` is used at every border, so masks
of objects cut by a tile or canvas edge keep their shape; :func:`drop_reasons` then decides which
instances to keep and names why each other one goes.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from seg_datamodule.ops.ragged import segment_ids
from seg_datamodule.structures import Polygons
from seg_datamodule.transforms.plan import TilePlan

__all__ = ["DROP_REASONS", "drop_reasons", "transform_polygons"]

DROP_REASONS: tuple[str, ...] = ("kept", "degenerate", "outside", "clipped", "small_box", "occluded")
"""Codes returned by :func:`drop_reasons`: index 0 keeps the instance, the others name why not.
``occluded`` is never returned here: copy-paste (:mod:`~seg_datamodule.transforms.copy_paste`)
drops an instance that pasted objects cover for it."""


def transform_polygons(
    polygons: Sequence[Polygons], plan: TilePlan
) -> tuple[Polygons, np.ndarray, np.ndarray]:
    """Clip each tile's polygons to its region, map them to the output, clip to the output canvas.

    Args:
        polygons (Sequence[Polygons]): per tile, its instances in original image pixels.
        plan (TilePlan): the matrices and regions the pixels went through.

    Returns:
        polygons (Polygons): all tiles' N instances in tile order, in output pixels; an instance
            clipped away keeps its slot with no rings.
        area_before (ndarray[N] float64): each instance's area mapped to the output, before any clip.
        area_after (ndarray[N] float64): its area after both clips.

    Raises:
        ValueError: ``polygons`` and ``plan`` differ in length.
    """
    # 1. Concatenate the tiles, remembering each ring's tile.
    if len(polygons) != len(plan):
        raise ValueError(f"polygons has {len(polygons)} tiles but the plan has {len(plan)}")
    merged = Polygons.concat(polygons)
    inst_tile = np.repeat(np.arange(len(plan), dtype=np.int64), [len(p) for p in polygons])
    dets = np.abs(np.linalg.det(plan.matrices[:, :, :2])) if len(plan) else np.zeros(0)
    area_before = merged.areas() * dets[inst_tile]
    ring_tile = inst_tile[segment_ids(merged.instance_offsets)]

    lin = plan.matrices[:, :, :2]
    axis_aligned = bool(
        (lin[:, 0, 1] == 0).all() and (lin[:, 1, 0] == 0).all() and (lin[:, 0, 0] > 0).all()
        and (lin[:, 1, 1] > 0).all()
    )
    h, w = plan.output_size
    if axis_aligned:
        # 2a. Scale + translation per tile: map first, then one clip per ring against its tile's
        # region mapped to the output, cut to the canvas (the same set as 2b's two clips).
        diag, shift = lin[:, [0, 1], [0, 1]], plan.matrices[:, :, 2]
        vert_tile = ring_tile[segment_ids(merged.ring_offsets)]
        vertices = merged.vertices
        if len(vertices):
            vertices = vertices * diag[vert_tile] + shift[vert_tile]
        mapped = plan.regions * np.tile(diag, 2) + np.tile(shift, 2)
        rects = np.concatenate([np.maximum(mapped[:, :2], 0.0), np.minimum(mapped[:, 2:], (w, h))], axis=1)
        rects[:, 2:] = np.maximum(rects[:, 2:], rects[:, :2])  # an empty rectangle stays valid
        out = Polygons(vertices, merged.ring_offsets, merged.instance_offsets).clip(rects[ring_tile])
    else:
        # 2b. Clip to each tile's region in its own pixels (axis aligned there, whatever the
        # affine), map every vertex through its tile's matrix, clip to the output canvas.
        clipped = merged.clip(plan.regions[ring_tile])
        ring_tile = inst_tile[segment_ids(clipped.instance_offsets)]
        vert_tile = ring_tile[segment_ids(clipped.ring_offsets)]
        vertices = clipped.vertices
        if len(vertices):
            m = plan.matrices[vert_tile]
            vertices = np.einsum("vij,vj->vi", m[:, :, :2], vertices) + m[:, :, 2]
        out = Polygons(vertices, clipped.ring_offsets, clipped.instance_offsets).clip(
            (0.0, 0.0, float(w), float(h))
        )
    return out, area_before, out.areas()


def drop_reasons(
    polygons: Polygons,
    area_before: np.ndarray,
    area_after: np.ndarray,
    min_area_ratio: float,
    min_box_size: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Decide which instances to keep after clipping, and why the others go.

    Reasons, in the order they are tested (codes index :data:`DROP_REASONS`):
    ``degenerate`` (no area before clipping), ``outside`` (nothing left after clipping),
    ``clipped`` (``area_after < min_area_ratio * area_before``), ``small_box`` (box narrower or
    lower than ``min_box_size``).

    Args:
        polygons (Polygons): the N clipped instances in output pixels.
        area_before (ndarray[N] float64): areas before clipping (same pixels).
        area_after (ndarray[N] float64): areas after clipping.
        min_area_ratio (float): smallest kept fraction of an instance's area.
        min_box_size (float): smallest kept box width and height in pixels.

    Returns:
        codes (ndarray[N] int64): 0 to keep, else the index of the reason in :data:`DROP_REASONS`.
        boxes (ndarray[N, 4] float64): xyxy boxes of the clipped polygons.
    """
    boxes = polygons.boxes()
    n = len(area_before)
    codes = np.zeros(n, np.int64)
    wh = boxes[:, 2:] - boxes[:, :2]
    small = (wh < min_box_size).any(axis=1)
    clipped = area_after < min_area_ratio * area_before
    outside = (area_after <= 0) | (np.diff(polygons.instance_offsets) == 0)
    degenerate = ~(area_before > 0)
    # Later assignments win, so assign in reverse order of precedence.
    codes[small] = DROP_REASONS.index("small_box")
    codes[clipped] = DROP_REASONS.index("clipped")
    codes[outside] = DROP_REASONS.index("outside")
    codes[degenerate] = DROP_REASONS.index("degenerate")
    return codes, boxes
