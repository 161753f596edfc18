"""Pure geometry over flat polygon arrays: exact rectangle clipping, areas, boxes, selection.

Every function here takes and returns the package's flat polygon layout (see
:mod:`seg_datamodule.structures.polygons`)::

    vertices          float64 (V, 2)   x, y (COCO convention: pixel k covers [k, k + 1))
    ring_offsets      int64   (R + 1,) ring r is vertices[ring_offsets[r]:ring_offsets[r + 1]]
    instance_offsets  int64   (N + 1,) instance n is rings instance_offsets[n]:instance_offsets[n + 1]

Why clip rather than clamp: moving vertices onto the border (clamping) changes a polygon's shape
wherever an edge crosses the border, shifting masks of objects cut by an image or tile edge
(Ultralytics issues #9429, #23663, #24935). Sutherland-Hodgman against a convex clip region is
exact for any input polygon, convex or not: a concave polygon cut into several pieces comes out
as one ring whose pieces are joined by zero-width edges running along the border, which add no
area and no crossings under the even-odd (or non-zero) fill the rasteriser uses.
"""

from __future__ import annotations

import numpy as np

from seg_datamodule.ops.ragged import offsets_from_lengths, segment_ids

__all__ = [
    "clip_polygons",
    "concat_polygons",
    "instance_areas",
    "polygon_boxes",
    "ring_areas",
    "select_instances",
    "zero_area_instances",
]


# --------------------------------------------------------------------------------------------
# Areas, boxes, selection
# --------------------------------------------------------------------------------------------


def _ring_cross_terms(vertices: np.ndarray, ring_offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per vertex: its ring id and the two products of the shoelace cross term, about the ring's first vertex."""
    v = np.asarray(vertices, dtype=np.float64)
    # Next vertex within the ring, wrapping the last vertex of each ring to its first.
    nxt = np.arange(1, len(v) + 1, dtype=np.int64)
    ends = ring_offsets[1:][np.diff(ring_offsets) > 0]
    starts = ring_offsets[:-1][np.diff(ring_offsets) > 0]
    nxt[ends - 1] = starts
    # Cross products about the ring's first vertex keep the sums well conditioned far from 0.
    rid = segment_ids(ring_offsets)
    origin = v[ring_offsets[:-1][rid].clip(max=len(v) - 1)]
    a = v - origin
    b = v[nxt] - origin
    return rid, a[:, 0] * b[:, 1], a[:, 1] * b[:, 0]


def ring_areas(vertices: np.ndarray, ring_offsets: np.ndarray) -> np.ndarray:
    """Signed shoelace area of every ring.

    Args:
        vertices (ndarray[V, 2] float64): vertices.
        ring_offsets (ndarray[R + 1] int64): ring boundaries.

    Returns:
        ndarray[R] float64: signed areas, positive for rings that turn clockwise on screen (x right,
        y down); 0 for rings with fewer than 3 vertices.
    """
    r = len(ring_offsets) - 1
    if r <= 0 or len(vertices) == 0:
        return np.zeros(max(r, 0), np.float64)
    rid, ab, ba = _ring_cross_terms(vertices, ring_offsets)
    return 0.5 * np.bincount(rid, weights=ab - ba, minlength=r)


def zero_area_instances(
    vertices: np.ndarray, ring_offsets: np.ndarray, instance_offsets: np.ndarray, rtol: float = 1e-12
) -> np.ndarray:
    """Which instances have zero area up to rounding (collinear or repeated points).

    An instance counts as zero when the sum of its rings' absolute shoelace areas is at most
    ``rtol`` times the sum of the magnitudes of the shoelace products (the size of the rounding
    error of the area), so the test does not depend on where the polygon lies or its units.
    A bow-tie whose lobes cancel also has zero net area: callers that care test coverage apart.

    Args:
        vertices (ndarray[V, 2] float64): vertices.
        ring_offsets (ndarray[R + 1] int64): ring boundaries.
        instance_offsets (ndarray[N + 1] int64): instance boundaries into the rings.
        rtol (float): relative tolerance.

    Returns:
        ndarray[N] bool: True for zero-area instances (and those without rings or vertices).
    """
    n = len(instance_offsets) - 1
    r = len(ring_offsets) - 1
    if n <= 0:
        return np.zeros(0, bool)
    if r <= 0 or len(vertices) == 0:
        return np.ones(n, bool)
    rid, ab, ba = _ring_cross_terms(vertices, ring_offsets)
    area2 = np.abs(np.bincount(rid, weights=ab - ba, minlength=r))
    scale = np.bincount(rid, weights=np.abs(ab) + np.abs(ba), minlength=r)
    iid = segment_ids(instance_offsets)
    total = np.bincount(iid, weights=area2, minlength=n)[:n]
    total_scale = np.bincount(iid, weights=scale, minlength=n)[:n]
    return total <= rtol * total_scale


def instance_areas(
    vertices: np.ndarray, ring_offsets: np.ndarray, instance_offsets: np.ndarray
) -> np.ndarray:
    """Area of every instance: the sum of its rings' absolute shoelace areas.

    Exact for COCO's usual instances (disjoint simple rings); an over-estimate where rings overlap
    or a ring crosses itself, since the mask fills each ring with the even-odd rule and takes
    the union.

    Args:
        vertices (ndarray[V, 2] float64): vertices.
        ring_offsets (ndarray[R + 1] int64): ring boundaries.
        instance_offsets (ndarray[N + 1] int64): instance boundaries into the rings.

    Returns:
        ndarray[N] float64: areas in squared pixels; 0 for an instance without rings.
    """
    n = len(instance_offsets) - 1
    areas = np.abs(ring_areas(vertices, ring_offsets))
    iid = segment_ids(instance_offsets)
    if n <= 0:
        return np.zeros(0)
    # bincount of an empty input gives int64 zeros even with float weights.
    return np.bincount(iid, weights=areas, minlength=n)[:n].astype(np.float64, copy=False)


def polygon_boxes(
    vertices: np.ndarray, ring_offsets: np.ndarray, instance_offsets: np.ndarray
) -> np.ndarray:
    """Tight xyxy box of every instance's vertices.

    Args:
        vertices (ndarray[V, 2] float64): vertices.
        ring_offsets (ndarray[R + 1] int64): ring boundaries.
        instance_offsets (ndarray[N + 1] int64): instance boundaries into the rings.

    Returns:
        ndarray[N, 4] float64: ``x0, y0, x1, y1``; all zeros for an instance without vertices.
    """
    n = len(instance_offsets) - 1
    boxes = np.zeros((max(n, 0), 4), np.float64)
    if n <= 0 or len(vertices) == 0:
        return boxes
    # Vertex range of each instance; instances are contiguous in the vertex array.
    vstart = ring_offsets[instance_offsets[:-1]]
    vend = ring_offsets[instance_offsets[1:]]
    nonempty = vend > vstart
    if not nonempty.any():
        return boxes
    v = np.asarray(vertices, dtype=np.float64)
    starts = vstart[nonempty]
    boxes[nonempty, 0:2] = np.minimum.reduceat(v, starts, axis=0)
    boxes[nonempty, 2:4] = np.maximum.reduceat(v, starts, axis=0)
    return boxes


def select_instances(
    vertices: np.ndarray,
    ring_offsets: np.ndarray,
    instance_offsets: np.ndarray,
    keep: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keep a subset of instances (in their order).

    Args:
        vertices (ndarray[V, 2] float64): vertices.
        ring_offsets (ndarray[R + 1] int64): ring boundaries.
        instance_offsets (ndarray[N + 1] int64): instance boundaries into the rings.
        keep (ndarray[N] bool): which instances to keep.

    Returns:
        vertices (float64[V', 2]), ring_offsets (int64[R' + 1]), instance_offsets (int64[N' + 1]).

    Raises:
        ValueError: ``keep`` is not a bool array of length N.
    """
    keep = np.asarray(keep)
    n = len(instance_offsets) - 1
    if keep.dtype != np.bool_ or keep.shape != (n,):
        raise ValueError(f"keep must be a bool array of shape ({n},), got {keep.dtype} {keep.shape}")
    if keep.all():
        return vertices, ring_offsets, instance_offsets
    ring_keep = np.repeat(keep, np.diff(instance_offsets))
    vert_keep = np.repeat(ring_keep, np.diff(ring_offsets))
    new_rings = offsets_from_lengths(np.diff(ring_offsets)[ring_keep])
    new_inst = offsets_from_lengths(np.diff(instance_offsets)[keep])
    return np.asarray(vertices, np.float64)[vert_keep], new_rings, new_inst


def concat_polygons(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenate several flat polygon sets into one (instances in order).

    Args:
        parts: ``(vertices, ring_offsets, instance_offsets)`` triples.

    Returns:
        vertices (float64[V, 2]), ring_offsets (int64[R + 1]), instance_offsets (int64[N + 1]).
    """
    verts = [np.zeros((0, 2), np.float64)]
    rings = [np.zeros(1, np.int64)]
    insts = [np.zeros(1, np.int64)]
    v_base = r_base = 0
    for v, ro, io in parts:
        verts.append(np.asarray(v, np.float64))
        rings.append(ro[1:] + v_base)
        insts.append(io[1:] + r_base)
        v_base += int(ro[-1])
        r_base += int(io[-1])
    return np.concatenate(verts), np.concatenate(rings), np.concatenate(insts)


# --------------------------------------------------------------------------------------------
# Clipping
# --------------------------------------------------------------------------------------------


def _clip_edge(
    v: np.ndarray,
    rid: np.ndarray,
    prev: np.ndarray,
    inside: np.ndarray,
    axis: int,
    bound: np.ndarray | np.float64,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One Sutherland-Hodgman pass against the half-plane boundary ``v[:, axis] = bound``.

    For each vertex ``c`` with predecessor ``p`` in its ring, the pass emits ``c`` if it is
    inside, preceded by the edge's crossing point if ``p`` is outside; or the crossing alone if
    ``c`` is outside and ``p`` inside. Vectorised over all rings at once.

    Returns:
        (new vertices, their ring ids, index of the input vertex each came from).
    """
    crosses = inside != inside[prev]
    count = inside.astype(np.int64) + crosses
    src = np.repeat(np.arange(len(v), dtype=np.int64), count)
    out = v[src]
    ci = np.flatnonzero(crosses)
    if len(ci):
        # The crossing (if any) comes first among what a vertex emits.
        slot = (np.cumsum(count) - count)[ci]
        c = v[ci]
        p = v[prev[ci]]
        b = bound[ci] if np.ndim(bound) else bound
        other = 1 - axis
        pa, ca, po, co = p[:, axis], c[:, axis], p[:, other], c[:, other]
        val = po + (b - pa) / (ca - pa) * (co - po)
        # Rounding must not leave the segment (keeps earlier passes' guarantees).
        np.clip(val, np.minimum(po, co), np.maximum(po, co), out=val)
        out[slot, axis] = b
        out[slot, other] = val
    return out, rid[src], src


def clip_polygons(
    vertices: np.ndarray,
    ring_offsets: np.ndarray,
    instance_offsets: np.ndarray,
    rect: np.ndarray | tuple[float, float, float, float],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Clip every ring to an axis-aligned rectangle, exactly (Sutherland-Hodgman).

    The result covers exactly the part of each ring's even-odd region inside the closed
    rectangle; vertices are never clamped. Rings left with fewer than 3 vertices are removed;
    an instance whose rings all vanish stays, with no rings, so instance indices still match
    labels (see :func:`select_instances` to drop them).

    Args:
        vertices (ndarray[V, 2] float64): vertices.
        ring_offsets (ndarray[R + 1] int64): ring boundaries.
        instance_offsets (ndarray[N + 1] int64): instance boundaries into the rings.
        rect (ndarray[4] | ndarray[R, 4] float64): ``x0, y0, x1, y1`` with ``x0 <= x1`` and
            ``y0 <= y1``: one rectangle for all rings, or one per ring.

    Returns:
        vertices (float64[V', 2]), ring_offsets (int64[R' + 1]), instance_offsets (int64[N + 1]).
        Returns the inputs themselves when nothing lies outside the rectangle.

    Raises:
        ValueError: ``rect`` is neither ``(4,)`` nor ``(R, 4)``, or has ``x0 > x1`` or ``y0 > y1``.
    """
    # 1. Check arguments; a vertex-wise rect makes one call serve rings with different regions.
    v = np.asarray(vertices, dtype=np.float64)
    ring_offsets = np.asarray(ring_offsets, np.int64)
    instance_offsets = np.asarray(instance_offsets, np.int64)
    num_rings = len(ring_offsets) - 1
    rect = np.asarray(rect, dtype=np.float64)
    if rect.shape not in ((4,), (num_rings, 4)):
        raise ValueError(f"rect must be (4,) or ({num_rings}, 4), got shape {rect.shape}")
    if (rect[..., 0] > rect[..., 2]).any() or (rect[..., 1] > rect[..., 3]).any():
        raise ValueError(f"rect must have x0 <= x1 and y0 <= y1, got {rect.tolist()}")
    if len(v) == 0:
        return v, ring_offsets, instance_offsets
    rid = segment_ids(ring_offsets)
    per_vertex = rect.ndim == 2
    vrect = rect[rid] if per_vertex else rect

    # 2. Fast path: everything inside.
    lo_ok = v >= (vrect[:, :2] if per_vertex else vrect[:2])
    hi_ok = v <= (vrect[:, 2:] if per_vertex else vrect[2:])
    if lo_ok.all() and hi_ok.all():
        return v, ring_offsets, instance_offsets

    # 3. Four passes (x >= x0, x <= x1, y >= y0, y <= y1), skipping those nothing crosses.
    for col, axis, keep_greater in ((0, 0, True), (2, 0, False), (1, 1, True), (3, 1, False)):
        if len(v) == 0:
            break
        bound = vrect[:, col] if per_vertex else vrect[col]
        inside = v[:, axis] >= bound if keep_greater else v[:, axis] <= bound
        if inside.all():
            continue
        # Predecessor within the (current) ring, wrapping the first vertex to the last.
        prev = np.arange(-1, len(v) - 1, dtype=np.int64)
        new_ring = np.empty(len(v), bool)
        new_ring[0] = True
        np.not_equal(rid[1:], rid[:-1], out=new_ring[1:])
        starts = np.flatnonzero(new_ring)
        ends = np.empty_like(starts)
        ends[:-1] = starts[1:] - 1
        ends[-1] = len(v) - 1
        prev[starts] = ends
        v, rid, src = _clip_edge(v, rid, prev, inside, axis, bound)
        if per_vertex:
            vrect = vrect[src]

    # 4. Drop rings with fewer than 3 vertices (no area) and rebuild the offsets.
    lengths = np.bincount(rid, minlength=num_rings) if len(rid) else np.zeros(num_rings, np.int64)
    ring_ok = lengths >= 3
    if not ring_ok.all():
        v = v[ring_ok[rid]]
        lengths = lengths[ring_ok]
    new_rings = offsets_from_lengths(lengths)
    kept_per_instance = (
        np.add.reduceat(np.append(ring_ok, False).astype(np.int64), instance_offsets[:-1])
        if num_rings
        else np.zeros(len(instance_offsets) - 1, np.int64)
    )
    # reduceat over an empty instance (equal offsets) returns the element at that offset, not 0.
    kept_per_instance = np.where(np.diff(instance_offsets) > 0, kept_per_instance, 0)
    return v, new_rings, offsets_from_lengths(kept_per_instance)
