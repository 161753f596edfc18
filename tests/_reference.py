"""Independent references for the tests: the plain full-grid crossing test of the contract."""

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
