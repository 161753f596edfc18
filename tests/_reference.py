"""Independent references for the tests: the full-grid crossing test, a scalar rectangle clip.

Each is a second implementation written apart from the package, so no test compares a result
with the code that produced it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def reference_rasterize(
    instances: Sequence[Sequence[np.ndarray]], canvas_size: tuple[int, int], stride: int
) -> np.ndarray:
    """Full-grid even-odd crossing test, literally as specified, ring by ring.

    Every edge is tested against every cell of the grid: ``(y0 > py) != (y1 > py)`` and
    ``px < x0 + (py - y0) * (x1 - x0) / (y1 - y0)`` in float64; rings of an instance are OR-ed.

    Returns:
        ndarray[N, Hp, Wp] bool.
    """
    height, width = canvas_size
    hp, wp = -(-height // stride), -(-width // stride)
    px = ((np.arange(wp) + 0.5) * stride)[None, :]
    py = ((np.arange(hp) + 0.5) * stride)[:, None]
    out = np.zeros((len(instances), hp, wp), bool)
    for n, rings in enumerate(instances):
        for ring in rings:
            ring = np.asarray(ring, np.float64).reshape(-1, 2)
            inside = np.zeros((hp, wp), bool)
            k = len(ring)
            for a in range(k):
                x0, y0 = ring[a]
                x1, y1 = ring[(a + 1) % k]
                straddles = (y0 > py) != (y1 > py)  # (hp, 1)
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    crosses = straddles & (px < x0 + (py - y0) * (x1 - x0) / (y1 - y0))
                inside ^= crosses
            out[n] |= inside
    return out


def reference_clip_ring(ring: np.ndarray, rect: Sequence[float]) -> np.ndarray:
    """Sutherland-Hodgman clip of one ring to ``x0, y0, x1, y1``, one vertex at a time.

    A deliberate second copy of the package's clip (``seg_datamodule.ops.geometry``), kept apart
    from it so the tests have an oracle that shares no code with what they test: plain Python
    floats, a loop per half-plane, the textbook emit rules. A point on the boundary is inside.

    Returns:
        ndarray[K, 2] float64, possibly with fewer than 3 vertices (nothing left).
    """
    x0, y0, x1, y1 = (float(c) for c in rect)
    # (axis, bound, keep points whose coordinate is >= bound?)
    planes = ((0, x0, True), (0, x1, False), (1, y0, True), (1, y1, False))
    points = [(float(x), float(y)) for x, y in np.asarray(ring, np.float64).reshape(-1, 2)]
    for axis, bound, keep_greater in planes:
        if not points:
            break

        def inside(p: tuple[float, float]) -> bool:
            return p[axis] >= bound if keep_greater else p[axis] <= bound

        def crossing(p: tuple[float, float], c: tuple[float, float]) -> tuple[float, float]:
            t = (bound - p[axis]) / (c[axis] - p[axis])
            other = p[1 - axis] + t * (c[1 - axis] - p[1 - axis])
            return (bound, other) if axis == 0 else (other, bound)

        result = []
        prev = points[-1]
        for cur in points:
            if inside(cur):
                if not inside(prev):
                    result.append(crossing(prev, cur))
                result.append(cur)
            elif inside(prev):
                result.append(crossing(prev, cur))
            prev = cur
        points = result
    return np.array(points, np.float64).reshape(-1, 2)


def reference_signed_area(ring: np.ndarray) -> float:
    """Shoelace area of one ring with ``math.fsum`` (positive when clockwise on screen)."""
    import math

    ring = np.asarray(ring, np.float64).reshape(-1, 2)
    k = len(ring)
    if k < 3:
        return 0.0
    terms = []
    for a in range(k):
        (xa, ya), (xb, yb) = ring[a], ring[(a + 1) % k]
        terms.extend((xa * yb, -xb * ya))
    return 0.5 * math.fsum(terms)
