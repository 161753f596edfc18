"""OpenCV's bilinear arithmetic in torch ops, for the device warp (:mod:`.device_warp`).

Each function copies one OpenCV code path bit for bit, so canvases warped on the accelerator equal
the workers' (``tests/transforms/test_device_warp.py``): ``cv2.resize``, ``cv2.warpAffine`` in
OpenCV 5 (float32; an integer path for scale-and-shift matrices) and in OpenCV 4 (fixed point).
Neighbours ``p`` come as ``(top-left, top-right, bottom-left, bottom-right)``, each ``(C, N)``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

__all__ = [
    "fixed_point_sources", "interpolate_fixed", "interpolate_resize", "interpolate_shift", "interpolate_warp",
    "opencv4", "resize_axis", "warp_axis",
]


@functools.cache
def opencv4() -> bool:
    """Whether the workers' OpenCV is 4.x (fixed-point warpAffine) rather than 5 (float32)."""
    import cv2  # the worker path's library; only its version matters here

    return int(cv2.__version__.split(".")[0]) < 5


def fixed_point_sources(m: torch.Tensor, cols: torch.Tensor, rows: torch.Tensor, by_col: torch.Tensor,
                         by_row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """OpenCV 4's ``warpAffine`` source positions per output pixel, in 1/32 pixel (int64).

    Per row ``y`` and column ``x`` of the tile's output (``m[6:8]``: where it starts on the canvas):
    ``X = (round((m0 * x) * 1024) + round((m1 * y + m2) * 1024) + 16) >> 5``, likewise ``Y``, rounded
    half to even in float64 (``saturate_cast<int>``); then looked up per pixel by its tile.
    """
    x, y = cols - m[6], rows - m[7]  # (T, W), (T, H)
    per_col = torch.stack([(m[0] * x * 1024).round(), (m[3] * x * 1024).round()]).to(torch.int64)
    per_row = torch.stack([((m[1] * y + m[2]) * 1024).round(), ((m[4] * y + m[5]) * 1024).round()]).to(torch.int64)
    cx, cy = (t.reshape(-1).index_select(0, by_col) for t in per_col)
    rx, ry = (t.reshape(-1).index_select(0, by_row) for t in per_row)
    return (cx + rx + 16) >> 5, (cy + ry + 16) >> 5


def interpolate_fixed(p: Sequence[torch.Tensor], fx: torch.Tensor, fy: torch.Tensor) -> torch.Tensor:
    """OpenCV 4's fixed-point bilinear: fractions in 1/32, weights ``(32 - a) * (32 - b)`` and so
    on (``INTER_REMAP_COEF_SCALE`` 2**15 is 32 times theirs), ``(sum + 512) >> 10``."""
    a, b = (fx * 32).round().to(torch.int32), (fy * 32).round().to(torch.int32)
    top, right, bottom, corner = (q.to(torch.int32) for q in p)
    top.mul_(32 - a).add_(right.mul_(a)).mul_(32 - b)
    bottom.mul_(32 - a).add_(corner.mul_(a)).mul_(b)
    return top.add_(bottom).add_(512).bitwise_right_shift_(10).to(torch.uint8)


def warp_axis(coord: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``warpAffine``'s integer source pixel and float32 fraction of an OpenCV pixel coordinate."""
    whole = torch.floor(coord)
    return whole.to(torch.int64), (coord - whole).to(torch.float32)


def resize_axis(index: torch.Tensor, place: torch.Tensor, scale: torch.Tensor, origin: torch.Tensor,
                 crop: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``cv2.resize``'s source pixel and float32 fraction along one axis of the resized crop.

    ``f = float((d + 0.5) * scale - 0.5)`` for output pixel ``d`` of the resized crop; along x
    (``crop`` given: the crop's width) a neighbour off the crop pins the fraction to 0, along y
    OpenCV keeps the fraction and repeats the edge row instead.
    """
    f = ((index - place.to(index.dtype) + 0.5) * scale - 0.5).to(torch.float32)
    whole = torch.floor(f)
    f = f - whole
    whole = whole.to(torch.int64)
    if crop is not None:
        f = torch.where((whole < 0) | (whole >= crop - 1), 0.0, f)
        whole = torch.minimum(whole.clamp(min=0), crop - 1)
    return origin + whole, f


def interpolate_warp(p: Sequence[torch.Tensor], fx: torch.Tensor, fy: torch.Tensor) -> torch.Tensor:
    """OpenCV 5's float32 bilinear of 8-bit pixels: along x, then y, rounded half to even."""
    top, right, bottom, corner = (q.to(torch.float32) for q in p)
    top.add_(right.sub_(top).mul_(fx))  # in place: each (C, N) pass allocates nothing
    bottom.add_(corner.sub_(bottom).mul_(fx))
    return top.add_(bottom.sub_(top).mul_(fy)).round_().to(torch.uint8)


def interpolate_shift(p: Sequence[torch.Tensor], fx: torch.Tensor, fy: torch.Tensor) -> torch.Tensor:
    """OpenCV 5's integer bilinear for scale-and-shift matrices: pixels in Q6, fractions floored to
    Q14, along x rounded, along y truncated (found by probing it; exact inside the image)."""
    a, b = (fx * 16384).floor().to(torch.int32), (fy * 16384).floor().to(torch.int32)
    top, right, bottom, corner = (q.to(torch.int32).bitwise_left_shift_(6) for q in p)
    top.add_(right.sub_(top).mul_(a).add_(8192).bitwise_right_shift_(14))
    bottom.add_(corner.sub_(bottom).mul_(a).add_(8192).bitwise_right_shift_(14))
    top.add_(bottom.sub_(top).mul_(b).bitwise_right_shift_(14))
    return top.add_(32).bitwise_right_shift_(6).to(torch.uint8)


def interpolate_resize(p: Sequence[torch.Tensor], fx: torch.Tensor, fy: torch.Tensor) -> torch.Tensor:
    """``cv2.resize``'s 8-bit bilinear: 11-bit weights, rows in int32, then its SIMD vertical pass."""
    a0, a1 = ((1.0 - fx) * 2048).round().to(torch.int32), (fx * 2048).round().to(torch.int32)
    b0, b1 = ((1.0 - fy) * 2048).round().to(torch.int32), (fy * 2048).round().to(torch.int32)
    top, right, bottom, corner = (q.to(torch.int32) for q in p)
    top.mul_(a0).add_(right.mul_(a1)).bitwise_right_shift_(4).mul_(b0).bitwise_right_shift_(16)
    bottom.mul_(a0).add_(corner.mul_(a1)).bitwise_right_shift_(4).mul_(b1).bitwise_right_shift_(16)
    return top.add_(bottom).add_(2).bitwise_right_shift_(2).clamp_(0, 255).to(torch.uint8)
