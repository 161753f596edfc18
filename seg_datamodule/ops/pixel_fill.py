"""Ultralytics' mask targets on the stride grid: filled at pixel resolution, then resized.

Ultralytics (``ultralytics.data.utils.polygon2mask``, 8.x) makes each YOLO-seg mask target by
filling the polygon on the full canvas with ``cv2.fillPoly`` (vertices cast to int32, boundary
pixels filled) and shrinking the filled canvas to the prototype grid with ``cv2.resize``
(bilinear). A cell is then set when its two centre pixel rows and columns are about half filled,
which grows every mask by about half a pixel all round against the exact cell-centre test
(:mod:`seg_datamodule.ops.raster`): +14 % of the area of a 32 px object at stride 4, +30 % at
16 px. Ultralytics trains YOLO-seg on those targets; in ``docs/benchmarks/train-parity.md`` they
trained YOLO11n-seg to less mask AP than the exact cells did, so the rule is opt-in.

Semantics (the tests hold a full-canvas reference to it): the canvas ``(H, W)`` is padded to
``(Hp * stride, Wp * stride)`` (``Hp = ceil(H / stride)``; Ultralytics' canvases are multiples of
the stride, where this is its own rule); each instance's rings, clipped to ``[0, W] x [0, H]`` (as
Ultralytics clips its segments to the image) and cast to int32, are filled together with
``cv2.fillPoly`` on that canvas, which ``cv2.resize`` (``INTER_LINEAR``) shrinks to ``(Hp, Wp)``.

The work tracks the instance: both calls run on the instance's own window, whole cells wide with a
cell of margin, and a cell of the resized window depends only on the pixels of that cell, so each
mask is identical to the full-canvas fill and resize.
"""

from __future__ import annotations

import cv2
import numpy as np

from seg_datamodule.ops.raster import checked_flat

__all__ = ["rasterize_flat_pixel_fill"]


def rasterize_flat_pixel_fill(
    vertices: np.ndarray,
    ring_offsets: np.ndarray,
    instance_offsets: np.ndarray,
    canvas_size: tuple[int, int],
    stride: int = 4,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Rasterise instances given as flat polygon arrays with Ultralytics' fill-then-resize rule.

    Takes what :func:`~seg_datamodule.ops.raster.rasterize_flat` takes (the flat vertices, ring
    and instance offsets, ``(H, W)``, the stride, an optional zero-filled ``out``) and raises what
    it raises; only each instance's window of ``out`` is written.

    Returns:
        ndarray[N, Hp, Wp] bool: the instance masks (``out`` when given).
    """
    vertices, ring_offsets, instance_offsets, out = checked_flat(
        vertices, ring_offsets, instance_offsets, canvas_size, stride, out)
    height, width = canvas_size
    hp, wp = out.shape[1:]
    if len(ring_offsets) == 1 or hp == 0 or wp == 0:
        return out
    # Clipped, then truncated as Ultralytics' np.asarray(..., dtype=np.int32) does (>= 0 here).
    pixels = np.clip(vertices, 0.0, [float(width), float(height)]).astype(np.int32)
    for n in range(len(instance_offsets) - 1):
        first, last = instance_offsets[n], instance_offsets[n + 1]
        if first == last:
            continue
        own = pixels[ring_offsets[first] : ring_offsets[last]]
        # The cells holding the filled pixels (x0 .. x1 inclusive), and one of margin each side.
        (x0, y0), (x1, y1) = own.min(0), own.max(0)
        c0, c1 = max(int(x0) // stride - 1, 0), min(int(x1) // stride + 2, wp)
        r0, r1 = max(int(y0) // stride - 1, 0), min(int(y1) // stride + 2, hp)
        window = np.zeros(((r1 - r0) * stride, (c1 - c0) * stride), dtype=np.uint8)
        origin = np.array([c0 * stride, r0 * stride], dtype=np.int32)
        rings = [pixels[ring_offsets[r] : ring_offsets[r + 1]] - origin for r in range(first, last)]
        cv2.fillPoly(window, rings, color=1)
        out[n, r0:r1, c0:c1] |= cv2.resize(window, (c1 - c0, r1 - r0), interpolation=cv2.INTER_LINEAR).astype(bool)
    return out
