"""Exact polygon rasterisation onto a strided grid, at a cost that tracks the instance.

Semantics (the contract; the tests hold a plain full-grid reference to it):

* Canvas ``(H, W)`` in COCO pixel coordinates (x right, y down, pixel k covers [k, k+1)).
  Grid ``Hp = ceil(H / stride)``, ``Wp = ceil(W / stride)``; cell ``(i, j)`` is sampled at
  ``px = (j + 0.5) * stride``, ``py = (i + 0.5) * stride`` in float64.
* A ring is a closed polygon (the last vertex joins the first), filled with the even-odd rule:
  edge ``(x0, y0) -> (x1, y1)`` crosses the ray from ``(px, py)`` iff
  ``(y0 > py) != (y1 > py)`` and ``px < x0 + (py - y0) * (x1 - x0) / (y1 - y0)``.
* An instance is the union of its rings (pycocotools' merge for multi-polygon instances).

How it stays exact while only touching each ring's own window:

1. An edge can only cross in rows whose centre satisfies ``min(y0, y1) <= py < max(y0, y1)``
   (that is ``(y0 > py) != (y1 > py)``); those rows are found by exact counts of the float64
   centres below each vertex (as in 2), so no row outside a ring's vertical extent is visited.
2. For each (edge, row) pair the intercept is evaluated with the reference's expression, in the
   reference's operation order, on the same float64 values (the ring is sliced, never
   translated), so it is bit-identical. The count ``c`` of cell centres with ``px < x`` is then
   exact, so rounding of the intercept can never move a column in or out: it is the ceiling of
   ``x / stride - 0.5``, which no rounding can move across a centre (the proof is in
   ``_count_centres_below``).
3. In one row of one ring, cell ``j`` is inside iff an odd number of crossings have ``j < c``.
   A closed ring crosses every row an even number of times, so after sorting the row's counts
   ``c_1 <= c_2 <= ... <= c_2m`` the inside cells are exactly the spans ``[c_1, c_2)``,
   ``[c_3, c_4)``, ...: left of ``c_1`` the parity is even (the window's left edge), right of
   ``c_2m`` no crossing remains. Only those spans are written.

The work is O(edges + crossed rows + spans) per ring, independent of the canvas size, and
vectorised across all the rings of a batch, taken in chunks of about 8k vertices so the scratch
arrays reuse warm heap memory (fresh pages cost more to fault in than the arithmetic on them).
A span costs two writes whatever its length: a span of length L in [k, 2k) (k a power of two) is
covered by two k-byte stores of ones, at its start and at its end - k, through a byte-strided
view of the output.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from seg_datamodule.ops.checks import check_canvas_size, check_int
from seg_datamodule.ops.ragged import first_non_finite_instance, flatten_rings, segment_ids

__all__ = ["checked_flat", "grid_size", "rasterize_flat", "rasterize_polygons"]

# Rings go in chunks of about this many vertices, which keeps most scratch arrays (8 bytes an
# entry) near glibc's default 128 KiB mmap threshold, so they reuse warm heap memory.
_CHUNK_VERTICES = 8192


def checked_flat(
    vertices: np.ndarray,
    ring_offsets: np.ndarray,
    instance_offsets: np.ndarray,
    canvas_size: tuple[int, int],
    stride: int,
    out: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`rasterize_flat`'s arguments checked and normalised, and its output (zeroed when made).

    Returns:
        ``(vertices float64 [V, 2], ring_offsets int64, instance_offsets int64, out bool [N, Hp, Wp])``.

    Raises:
        TypeError, ValueError: as :func:`rasterize_flat`.
    """
    _check_stride_and_canvas(canvas_size, stride)
    hp, wp = grid_size(canvas_size, stride)
    vertices = np.ascontiguousarray(vertices, dtype=np.float64).reshape(-1, 2)
    ring_offsets = np.asarray(ring_offsets, dtype=np.int64)
    instance_offsets = np.asarray(instance_offsets, dtype=np.int64)
    num_rings = len(ring_offsets) - 1
    num_instances = len(instance_offsets) - 1
    if num_rings < 0 or num_instances < 0:
        raise ValueError("ring_offsets and instance_offsets need at least one entry (0)")
    if ring_offsets[0] != 0 or ring_offsets[-1] != len(vertices):
        raise ValueError(f"ring_offsets must run from 0 to V={len(vertices)}, got {ring_offsets[[0, -1]]}")
    if instance_offsets[0] != 0 or instance_offsets[-1] != num_rings:
        raise ValueError(f"instance_offsets must run from 0 to R={num_rings}")
    if out is None:
        # np.zeros maps fresh zero pages lazily: untouched cells cost nothing.
        out = np.zeros((num_instances, hp, wp), dtype=bool)
    elif out.shape != (num_instances, hp, wp) or out.dtype != np.bool_ or not out.flags.c_contiguous:
        raise ValueError(
            f"out must be C-contiguous bool {(num_instances, hp, wp)}, got {out.dtype} {out.shape}"
            f"{'' if out.flags.c_contiguous else ' (not contiguous)'}"
        )
    ring_lengths = np.diff(ring_offsets)
    if (ring_lengths < 3).any():
        ring = int(np.flatnonzero(ring_lengths < 3)[0])
        instance = int(np.searchsorted(instance_offsets, ring, side="right")) - 1
        raise ValueError(
            f"instance {instance}: ring {ring} has {ring_lengths[ring]} vertices, a ring needs at least 3"
        )
    if (np.diff(instance_offsets) < 0).any():
        raise ValueError("instance_offsets must be non-decreasing")
    if not np.isfinite(vertices).all():
        instance = first_non_finite_instance(vertices, ring_offsets, instance_offsets)
        raise ValueError(f"instance {instance}: NaN or infinite polygon coordinates")
    return vertices, ring_offsets, instance_offsets, out


def grid_size(canvas_size: tuple[int, int], stride: int) -> tuple[int, int]:
    """``(Hp, Wp) = (ceil(H / stride), ceil(W / stride))``."""
    height, width = canvas_size
    return -(-int(height) // stride), -(-int(width) // stride)


def _check_stride_and_canvas(canvas_size: tuple[int, int], stride: int) -> tuple[int, int]:
    check_int("stride", stride, 1)
    return check_canvas_size("canvas_size", canvas_size)


def _count_centres_below(values: np.ndarray, stride: int, n: int) -> np.ndarray:
    """For each value v, the number of grid centres ``(k + 0.5) * stride``, k in [0, n), below v.

    Equal to ``np.searchsorted(centres, values, side="left")`` on the exact float64 centres, and
    computed as ``clip(ceil(v / stride - 0.5), 0, n)`` without a correction, because for an
    integer stride s no rounding can move a value across a centre c = (k + 0.5) s:

    * v <= c gives ``v / s <= k + 0.5`` (rounding is monotonic and k + 0.5 is a float);
    * v > c is at least the float after c, one ulp(c) above it, so ``v / s`` exceeds k + 0.5 by at
      least ulp(c) / s, and ulp(c) >= ulp(k + 0.5) * 2**floor(log2 s) > ulp(k + 0.5) * s / 2: more
      than half a spacing of the quotient, so it cannot round back onto k + 0.5;
    * subtracting 0.5 from a quotient below 2**52 is exact, and ``ceil`` of the exact
      ``v / s - 0.5`` is the count. Larger, negative and infinite values land on the clip.

    Args:
        values (ndarray[M] float64): query coordinates (may be +-inf, never NaN).
        stride (int): grid stride (an int >= 1).
        n (int): number of centres.

    Returns:
        ndarray[M] int64 in [0, n].
    """
    est = values / stride
    est -= 0.5
    np.ceil(est, out=est)
    np.clip(est, 0, n, out=est)
    return est.astype(np.int64)


def rasterize_flat(
    vertices: np.ndarray,
    ring_offsets: np.ndarray,
    instance_offsets: np.ndarray,
    canvas_size: tuple[int, int],
    stride: int = 4,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Rasterise instances given as flat polygon arrays onto the stride grid.

    Args:
        vertices (ndarray[V, 2] float64): x, y in canvas pixels.
        ring_offsets (ndarray[R + 1] int64): ring r is ``vertices[ring_offsets[r]:ring_offsets[r + 1]]``.
        instance_offsets (ndarray[N + 1] int64): instance n is rings
            ``instance_offsets[n]:instance_offsets[n + 1]`` (may be empty: an all-False mask).
        canvas_size (tuple[int, int]): ``(H, W)`` of the canvas in pixels.
        stride (int): grid stride; cells are sampled at their centres.
        out (ndarray[N, Hp, Wp] bool | None): zero-filled output to write into (e.g. a view of a
            shared-memory tensor); allocated when None. Only inside cells are written.

    Returns:
        ndarray[N, Hp, Wp] bool: the instance masks (``out`` when given).

    Raises:
        TypeError: ``stride`` or ``canvas_size`` is not made of ints.
        ValueError: bad stride or canvas size, inconsistent offsets, a ring with fewer than 3
            vertices, or NaN / infinite coordinates (naming the instance index).
    """
    vertices, ring_offsets, instance_offsets, out = checked_flat(
        vertices, ring_offsets, instance_offsets, canvas_size, stride, out)
    hp, wp = out.shape[1:]
    num_rings = len(ring_offsets) - 1
    if num_rings == 0 or hp == 0 or wp == 0:
        return out
    # Rings are independent (an instance is the OR of its rings), so they are rasterised in
    # chunks of about _CHUNK_VERTICES vertices: every scratch array then stays under the
    # allocator's mmap threshold and reuses warm heap memory, where one pass over a whole batch
    # would map (and the kernel zero-fill) tens of MB of fresh pages each call. The spans are
    # small (two int64 each), so they are gathered and filled in one pass at the end.
    ring_instance = segment_ids(instance_offsets)
    starts: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    first_ring = 0
    while first_ring < num_rings:
        limit = ring_offsets[first_ring] + _CHUNK_VERTICES
        end_ring = max(int(np.searchsorted(ring_offsets, limit, side="right")) - 1, first_ring + 1)
        v0, v1 = ring_offsets[first_ring], ring_offsets[end_ring]
        spans = _ring_spans(
            vertices[v0:v1],
            ring_offsets[first_ring : end_ring + 1] - v0,
            ring_instance[first_ring:end_ring],
            stride,
            (hp, wp),
        )
        if spans is not None:
            starts.append(spans[0])
            lengths.append(spans[1])
        first_ring = end_ring
    if starts:
        # Setting a cell True twice is the union of an instance's rings.
        _fill_spans(out.reshape(-1), np.concatenate(starts), np.concatenate(lengths))
    return out


def _ring_spans(
    vertices: np.ndarray,
    ring_offsets: np.ndarray,
    ring_instance: np.ndarray,
    stride: int,
    grid: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray] | None:
    """The inside spans of some rings, as runs of cells of the flat ``(N * Hp * Wp)`` output.

    Args:
        vertices (ndarray[V, 2] float64): the rings' vertices.
        ring_offsets (ndarray[R + 1] int64): ring boundaries into ``vertices`` (from 0).
        ring_instance (ndarray[R] int64): the instance each ring belongs to.
        stride (int): grid stride.
        grid (tuple[int, int]): ``(Hp, Wp)``.

    Returns:
        ``(starts, lengths)``, ndarray[S] int64 each (every length >= 1, a span never leaves its
        row), or None when no ring covers a cell centre.
    """
    hp, wp = grid
    # 1. Edges: vertex k joins k + 1, and each ring's last vertex joins its first.
    x0 = vertices[:, 0]
    y0 = vertices[:, 1]
    nxt = np.arange(1, len(vertices) + 1, dtype=np.int64)
    nxt[ring_offsets[1:] - 1] = ring_offsets[:-1]

    # 2. Rows each edge crosses: centres with min(y0, y1) <= py < max(y0, y1). The count is
    # monotonic in y, so counting once per vertex and taking min / max per edge is the same.
    below = _count_centres_below(y0, stride, hp)
    below_next = below[nxt]
    rows_per_edge = np.abs(below - below_next)
    active = np.flatnonzero(rows_per_edge)
    if len(active) == 0:
        return None
    counts = rows_per_edge[active]
    total = int(counts.sum())
    first = np.cumsum(counts)
    first -= counts

    # 3. One entry per (edge, row) crossing. Everything a crossing needs from its edge is one
    # row of `per_edge`, repeated once per crossed row: x0, y0, x1 - x0, y1 - y0 (the very
    # float64 values the reference subtracts), the row offset and the sort key's (ring, row)
    # offset (integers below 2**53, exact in float64).
    col_bits = int(wp).bit_length()  # columns 0..wp
    row_bits = int(hp - 1).bit_length()  # rows 0..hp-1
    per_edge = np.empty((len(active), 6), np.float64)
    per_edge[:, 0] = x0[active]
    per_edge[:, 1] = y0[active]
    edge_end = nxt[active]
    np.subtract(x0[edge_end], per_edge[:, 0], out=per_edge[:, 2])
    np.subtract(y0[edge_end], per_edge[:, 1], out=per_edge[:, 3])
    row_offset = np.minimum(below[active], below_next[active])
    row_offset -= first
    per_edge[:, 4] = row_offset
    key_offset = segment_ids(ring_offsets)[active] << (row_bits + col_bits)
    key_offset += row_offset * (1 << col_bits)  # may be negative: multiply, not shift
    per_edge[:, 5] = key_offset
    crossing = np.repeat(per_edge, counts, axis=0)
    position = np.arange(total, dtype=np.float64)
    row = crossing[:, 4] + position
    # The intercept in the reference's order: x0 + ((py - y0) * (x1 - x0)) / (y1 - y0).
    x = row
    x += 0.5
    x *= stride  # py = (row + 0.5) * stride
    x -= crossing[:, 1]
    x *= crossing[:, 2]
    with np.errstate(over="ignore"):  # a near-horizontal edge may give +-inf: still exact
        x /= crossing[:, 3]
    x += crossing[:, 0]
    col = _count_centres_below(x, stride, wp)

    # 4. Sort crossings by key = (ring, row, column) packed in bits; consecutive pairs are a
    # row's inside spans. 32-bit keys sort faster, and usually fit (stride 4 on 640: 28 bits).
    position *= 1 << col_bits
    position += crossing[:, 5]
    narrow = (len(ring_offsets) << (row_bits + col_bits)) <= np.iinfo(np.int32).max
    key = position.astype(np.int32 if narrow else np.int64)
    key += col
    key.sort()
    if len(key) % 2:  # a closed ring crosses each row an even number of times
        raise RuntimeError("internal error: a ring crossed a grid row an odd number of times")
    span_start = key[0::2]
    span_len = key[1::2] - span_start
    keep = np.flatnonzero(span_len)
    if len(keep) == 0:
        return None
    span_start = span_start[keep].astype(np.int64)
    span_len = span_len[keep].astype(np.int64)
    span_col = span_start & ((1 << col_bits) - 1)
    span_start >>= col_bits
    span_row = span_start & ((1 << row_bits) - 1)
    span_start >>= row_bits  # now the ring
    flat_start = ring_instance[span_start] * (hp * wp)
    flat_start += span_row * wp
    flat_start += span_col
    return flat_start, span_len


def _ones(width: int) -> np.generic:
    """A scalar of ``width`` bytes, each 1 (``True``): ``uint8..uint64``, or raw bytes beyond."""
    ones = _ONES.get(width)
    if ones is None:
        dtype = np.dtype(f"<u{width}") if width <= 8 else np.dtype(f"V{width}")
        ones = _ONES[width] = np.frombuffer(b"\x01" * width, dtype=dtype)[0]
    return ones


_ONES: dict[int, np.generic] = {}


def _fill_spans(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
    """Set ``flat[s:s + l] = True`` for every span, with two stores per span.

    A span of length l in [k, 2k), k a power of two, is the union of ``[s, s + k)`` and
    ``[s + l - k, s + l)``: both are one k-byte element of a view of ``flat`` whose elements start
    at every byte (stride 1), so the stores never leave the span, and a span costs two writes
    however long it is (per-cell indices cost more to build than to scatter).

    Args:
        flat (ndarray[M] bool): C-contiguous output.
        starts (ndarray[S] int64): first cell of each span.
        lengths (ndarray[S] int64): span lengths, each >= 1 with ``starts + lengths <= M``.
    """
    data = flat.view(np.uint8)
    size_class = np.frexp(lengths)[1].astype(np.int8)  # l in [2**(c - 1), 2**c)
    order = np.argsort(size_class, kind="stable")  # a radix sort for 8-bit keys
    ends = np.cumsum(np.bincount(size_class))
    starts = starts[order]
    lengths = lengths[order]
    for c in range(1, len(ends)):
        lo, hi = int(ends[c - 1]), int(ends[c])
        if lo == hi:
            continue
        width = 1 << (c - 1)
        ones = _ones(width)
        view = np.ndarray((len(data) - width + 1,), ones.dtype, buffer=data, strides=(1,))
        view[starts[lo:hi]] = ones
        last = starts[lo:hi] + lengths[lo:hi]
        last -= width
        view[last] = ones


def rasterize_polygons(
    instances: Sequence[Sequence[Any]],
    canvas_size: tuple[int, int],
    stride: int = 4,
) -> np.ndarray:
    """Rasterise polygon instances onto the stride grid of a canvas.

    Args:
        instances: one item per instance, each a sequence of rings; a ring is array-like
            ``(K, 2)`` of x, y in canvas pixels or a flat COCO list ``[x0, y0, x1, y1, ...]``,
            K >= 3. Rings may lie partly or wholly outside the canvas, self-intersect, repeat
            vertices or have horizontal edges.
        canvas_size (tuple[int, int]): ``(H, W)`` in pixels.
        stride (int): grid stride (4 for YOLACT's ProtoNet targets, 1 for full resolution).

    Returns:
        ndarray[N, Hp, Wp] bool with ``Hp = ceil(H / stride)``, ``Wp = ceil(W / stride)``;
        ``(0, Hp, Wp)`` for no instances.

    Raises:
        TypeError: ``stride`` or ``canvas_size`` is not made of ints.
        ValueError: a malformed ring, or NaN / infinite coordinates (naming the instance index),
            or a bad stride or canvas size.
    """
    _check_stride_and_canvas(canvas_size, stride)
    vertices, ring_offsets, instance_offsets = flatten_rings(instances)
    return rasterize_flat(vertices, ring_offsets, instance_offsets, canvas_size, stride)
