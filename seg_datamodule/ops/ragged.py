"""Ragged-array helpers: offsets from lengths, segment ids, gathers of many ranges at once.

The package stores variable-length things (vertices of rings, rings of instances, instances of
images) as one flat array plus an ``int64 (K + 1,)`` offsets array whose ``k``-th segment is
``flat[offsets[k]:offsets[k + 1]]``. These are the only implementations of the arithmetic on them.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np

__all__ = ["flatten_rings", "offsets_from_lengths", "ragged_index", "segment_ids"]


def offsets_from_lengths(lengths: np.ndarray | Sequence[int]) -> np.ndarray:
    """Offsets of consecutive segments.

    Args:
        lengths (ndarray[K] int): segment lengths.

    Returns:
        ndarray[K + 1] int64: ``[0, l0, l0 + l1, ...]``.
    """
    lengths = np.asarray(lengths, np.int64)
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def segment_ids(offsets: np.ndarray) -> np.ndarray:
    """The segment each element belongs to.

    Args:
        offsets (ndarray[K + 1] int64): segment boundaries, non-decreasing from 0.

    Returns:
        ndarray[offsets[-1]] int64: ``k`` repeated ``offsets[k + 1] - offsets[k]`` times.
    """
    lengths = np.diff(np.asarray(offsets, np.int64))
    return np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)


def ragged_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each ``(s, n)``, vectorised.

    Args:
        starts (ndarray[K] int): first element of each range.
        lengths (ndarray[K] int): length of each range (>= 0).

    Returns:
        ndarray[sum(lengths)] int64.
    """
    lengths = np.asarray(lengths, np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    exclusive = np.cumsum(lengths) - lengths
    return np.arange(total, dtype=np.int64) - np.repeat(exclusive - np.asarray(starts, np.int64), lengths)


def first_non_finite_instance(
    vertices: np.ndarray, ring_offsets: np.ndarray, instance_offsets: np.ndarray
) -> int:
    """The instance holding the first NaN or infinite vertex (call it only when there is one).

    Args:
        vertices (ndarray[V, 2] float64): flat vertices.
        ring_offsets (ndarray[R + 1] int64): ring boundaries into ``vertices``.
        instance_offsets (ndarray[N + 1] int64): instance boundaries into the rings.

    Returns:
        int: the instance index.
    """
    bad_vertex = int(np.flatnonzero(~np.isfinite(vertices).all(axis=1))[0])
    ring = int(np.searchsorted(ring_offsets, bad_vertex, side="right")) - 1
    return int(np.searchsorted(instance_offsets, ring, side="right")) - 1


def flatten_rings(
    instances: Sequence[Sequence[Any]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flatten nested instances into flat polygon arrays.

    Rings that are all ``(K, 2)`` arrays, or all flat coordinate lists, are converted in one
    pass (one ``np.concatenate`` or one ``np.fromiter``) and checked vectorised; a per-ring
    ``np.asarray`` costs more than rasterising the ring.

    Args:
        instances: one item per instance, each a sequence of rings; a ring is array-like
            ``(K, 2)`` of x, y or a flat COCO list ``[x0, y0, x1, y1, ...]``.

    Returns:
        vertices (float64[V, 2]), ring_offsets (int64[R + 1]), instance_offsets (int64[N + 1]).

    Raises:
        ValueError: a ring is not ``(K, 2)`` or a flat list of even length, has fewer than 3
            vertices, or holds NaN or infinite coordinates; the message names the instance index.
    """
    # 1. Gather the rings, remembering each one's instance. A lone (K, 2) array is one ring, not
    # K rings of 2 numbers, so input holding one takes the instance-by-instance loop.
    if np.ndarray in set(map(type, instances)):
        rings: list[Any] = []
        rings_per_instance = []
        for instance in instances:
            if isinstance(instance, np.ndarray) and instance.ndim == 2 and instance.shape[1] == 2:
                instance = (instance,)
            rings.extend(instance)
            rings_per_instance.append(len(instance))
        instance_offsets = offsets_from_lengths(rings_per_instance)
    else:
        instance_offsets = offsets_from_lengths(np.fromiter(map(len, instances), np.int64, len(instances)))
        rings = list(itertools.chain.from_iterable(instances))
    if not rings:
        return np.zeros((0, 2), np.float64), np.zeros(1, np.int64), instance_offsets
    owner = segment_ids(instance_offsets)

    # 2. Convert: one pass for uniform input, ring by ring otherwise (which also names the
    # instance of a malformed ring).
    kinds = set(map(type, rings))
    vertices = None
    if kinds == {np.ndarray}:
        # np.concatenate insists on equal ndim and equal trailing sizes, so a (V, 2) result
        # means every ring was (K, 2); anything else goes the ring-by-ring way.
        try:
            joined = np.concatenate(rings)
        except (ValueError, TypeError):
            joined = None
        if joined is not None and joined.ndim == 2 and joined.shape[1] == 2 and joined.dtype.kind in "biuf":
            lengths = np.fromiter(map(len, rings), np.int64, len(rings))
            vertices = joined.astype(np.float64, copy=False)
    elif kinds <= {list, tuple} and all(not r or not isinstance(r[0], (list, tuple, np.ndarray)) for r in rings):
        sizes = np.fromiter(map(len, rings), np.int64, len(rings))
        odd = np.flatnonzero(sizes % 2)
        if len(odd):
            raise ValueError(
                f"instance {owner[odd[0]]}: flat ring has an odd number of coordinates ({sizes[odd[0]]})"
            )
        flat = np.fromiter(itertools.chain.from_iterable(rings), np.float64, int(sizes.sum()))
        lengths, vertices = sizes // 2, flat.reshape(-1, 2)
    if vertices is None:
        arrays = [_as_ring(ring, int(owner[r])) for r, ring in enumerate(rings)]
        lengths = np.fromiter(map(len, arrays), np.int64, len(arrays))
        vertices = np.concatenate(arrays)

    # 3. Check every ring at once, naming the first bad instance.
    short = np.flatnonzero(lengths < 3)
    if len(short):
        raise ValueError(f"instance {owner[short[0]]}: a ring needs at least 3 vertices, got {lengths[short[0]]}")
    ring_offsets = offsets_from_lengths(lengths)
    if not np.isfinite(vertices).all():
        instance = first_non_finite_instance(vertices, ring_offsets, instance_offsets)
        raise ValueError(f"instance {instance}: ring has NaN or infinite coordinates")
    return np.ascontiguousarray(vertices), ring_offsets, instance_offsets


def _as_ring(ring: Any, instance: int) -> np.ndarray:
    """One ring as ``float64 (K, 2)``; raises ``ValueError`` naming the instance."""
    arr = np.asarray(ring, dtype=np.float64)
    if arr.ndim == 1:
        if arr.size % 2:
            raise ValueError(f"instance {instance}: flat ring has an odd number of coordinates ({arr.size})")
        arr = arr.reshape(-1, 2)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"instance {instance}: a ring must be (K, 2) or a flat list, got shape {arr.shape}")
    return arr
