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
from seg_datamodule.transforms.kernels.plan import TilePlan

__all__ = ["DROP_REASONS", "drop_reasons", "transform_polygons", "transform_polygons_batch"]

DROP_REASONS: tuple[str, ...] = ("kept", "degenerate", "outside", "clipped", "small_box", "occluded")
"""Codes returned by :func:`drop_reasons`: index 0 keeps the instance, the others name why not.
``occluded`` is never returned here: copy-paste (:mod:`~seg_datamodule.transforms.group.copy_paste`)
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
    return transform_polygons_batch([polygons], [plan])[0]


def transform_polygons_batch(
    polygons: Sequence[Sequence[Polygons]], plans: Sequence[TilePlan]
) -> list[tuple[Polygons, np.ndarray, np.ndarray]]:
    """:func:`transform_polygons` of several samples at once: a batch's polygons in one pass.

    Every step is elementwise per vertex, ring or instance (the crossings, the clip tests, the
    shoelace sums run in each ring's own vertex order), so each sample's result is bit for bit
    what it alone would give; a batch just pays numpy's per-call cost once instead of per sample.
    Samples whose tiles are all scaled and translated (the default mosaic) share one pass; a
    rotated or sheared sample takes its own.

    Args:
        polygons (Sequence[Sequence[Polygons]]): per sample, per tile, its instances in original
            image pixels.
        plans (Sequence[TilePlan]): per sample, the matrices and regions its pixels went through.

    Returns:
        list[tuple[Polygons, ndarray, ndarray]]: per sample, what :func:`transform_polygons` returns.

    Raises:
        ValueError: ``polygons`` and ``plans`` differ in length, or a sample's tiles and plan do.
    """
    # 1. Check lengths; scale-and-translate samples share one pass, the others take their own.
    if len(polygons) != len(plans):
        raise ValueError(f"polygons has {len(polygons)} samples but plans has {len(plans)}")
    for tiles, plan in zip(polygons, plans):
        if len(tiles) != len(plan):
            raise ValueError(f"polygons has {len(tiles)} tiles but the plan has {len(plan)}")
    aligned = [_axis_aligned(plan) for plan in plans]
    out = [None if flag else _transform_general(tiles, plan) for tiles, plan, flag in zip(polygons, plans, aligned)]
    together = [b for b, flag in enumerate(aligned) if flag]
    if together:
        moved = _transform_aligned([polygons[b] for b in together], [plans[b] for b in together])
        for b, result in zip(together, moved):
            out[b] = result
    return out  # type: ignore[return-value]


def _axis_aligned(plan: TilePlan) -> bool:
    """Whether every tile of ``plan`` is a positive scale per axis plus a translation."""
    lin = plan.matrices[:, :, :2]
    return bool((lin[:, 0, 1] == 0).all() and (lin[:, 1, 0] == 0).all() and (lin[:, 0, 0] > 0).all()
                and (lin[:, 1, 1] > 0).all())


def _merge(tiles: Sequence[Polygons], matrices: np.ndarray) -> tuple[Polygons, np.ndarray, np.ndarray]:
    """The tiles' instances in one set, each instance's tile, and its area mapped to the output
    (before any clip): ``(polygons, inst_tile (N,) int64, area_before (N,) float64)``."""
    merged = Polygons.concat(tiles)
    inst_tile = np.repeat(np.arange(len(tiles), dtype=np.int64), [len(p) for p in tiles])
    dets = np.abs(np.linalg.det(matrices[:, :, :2])) if len(tiles) else np.zeros(0)
    return merged, inst_tile, merged.areas() * dets[inst_tile]


def _transform_aligned(
    polygons: Sequence[Sequence[Polygons]], plans: Sequence[TilePlan]
) -> list[tuple[Polygons, np.ndarray, np.ndarray]]:
    """Scale + translation per tile, every sample at once: map first, then one clip per ring
    against its tile's region mapped to the output, cut to the canvas (the same set as
    :func:`_transform_general`'s two clips)."""
    # 1. Every tile of every sample in one set; the per-tile numbers stacked.
    matrices = np.concatenate([plan.matrices for plan in plans])
    merged, inst_tile, area_before = _merge([p for sample in polygons for p in sample], matrices)
    regions = np.concatenate([plan.regions for plan in plans])
    canvas = np.repeat(np.array([(plan.output_size[1], plan.output_size[0]) for plan in plans], np.float64),
                       [len(plan) for plan in plans], axis=0)
    # 2. Map, then clip each ring to its tile's region on the output, cut to the canvas.
    ring_tile = inst_tile[segment_ids(merged.instance_offsets)]
    diag, shift = matrices[:, [0, 1], [0, 1]], matrices[:, :, 2]
    vert_tile = ring_tile[segment_ids(merged.ring_offsets)]
    vertices = merged.vertices
    if len(vertices):
        vertices = vertices * diag[vert_tile] + shift[vert_tile]
    mapped = regions * np.tile(diag, 2) + np.tile(shift, 2)
    rects = np.concatenate([np.maximum(mapped[:, :2], 0.0), np.minimum(mapped[:, 2:], canvas)], axis=1)
    rects[:, 2:] = np.maximum(rects[:, 2:], rects[:, :2])  # an empty rectangle stays valid
    clipped = Polygons(vertices, merged.ring_offsets, merged.instance_offsets).clip(rects[ring_tile])
    area_after = clipped.areas()
    # 3. Back to samples: each sample's instances are one contiguous run.
    if len(polygons) == 1:
        return [(clipped, area_before, area_after)]
    per_sample = [sum(len(p) for p in sample) for sample in polygons]
    bounds = np.concatenate([[0], np.cumsum(per_sample)]).tolist()
    return [(part, area_before[a:b], area_after[a:b])
            for part, a, b in zip(clipped.split(per_sample), bounds[:-1], bounds[1:])]


def _transform_general(polygons: Sequence[Polygons], plan: TilePlan) -> tuple[Polygons, np.ndarray, np.ndarray]:
    """Any affine per tile: clip to each tile's region in its own pixels (axis aligned there,
    whatever the affine), map every vertex through its tile's matrix, clip to the output canvas."""
    merged, inst_tile, area_before = _merge(polygons, plan.matrices)
    h, w = plan.output_size
    clipped = merged.clip(plan.regions[inst_tile[segment_ids(merged.instance_offsets)]])
    ring_tile = inst_tile[segment_ids(clipped.instance_offsets)]
    vert_tile = ring_tile[segment_ids(clipped.ring_offsets)]
    vertices = clipped.vertices
    if len(vertices):
        m = plan.matrices[vert_tile]
        vertices = np.einsum("vij,vj->vi", m[:, :, :2], vertices) + m[:, :, 2]
    out = Polygons(vertices, clipped.ring_offsets, clipped.instance_offsets).clip((0.0, 0.0, float(w), float(h)))
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
