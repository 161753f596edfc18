"""Pure inverse-letterbox kernels: predictions on the validation canvas -> original image pixels.

Validation samples are the original image letterboxed (:func:`~seg_datamodule.transforms.kernels.plan.letterbox_layout`):
a point ``p`` of the original image lands at ``p * scale + pad`` on the canvas, pixel *edges*
being the continuous coordinates (pixel ``x`` covers ``[x, x + 1)``). Boxes invert that affine
exactly. Masks are resampled: the value of original pixel ``(y, x)`` is the mask grid
interpolated bilinearly at the canvas point of that pixel's centre, ``((x + 0.5) * scale +
pad_x, (y + 0.5) * scale + pad_y)``; a grid cell ``(i, j)`` of stride ``s`` stands for the canvas
point ``((j + 0.5) * s, (i + 0.5) * s)``, the point the rasteriser samples for the targets.
So the pad is cropped and the image resized to its original size in one step, with no
half-pixel shift. Outside the grid the border cell's value holds (``grid_sample``'s
``padding_mode="border"``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "MaskWindow",
    "boxes_to_canvas",
    "boxes_to_original",
    "mask_windows",
    "masks_to_original",
    "resample_axis",
]


def _check_letterbox(scale: float, pad: tuple[float, float]) -> tuple[float, float, float]:
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
    try:
        pad_x, pad_y = (float(v) for v in pad)
    except (TypeError, ValueError):
        raise TypeError(f"pad must be (left, top) numbers, got {pad!r}") from None
    if not (math.isfinite(pad_x) and math.isfinite(pad_y)):
        raise ValueError(f"pad must be finite, got {pad!r}")
    return scale, pad_x, pad_y


def _check_boxes(boxes: Tensor) -> None:
    if not isinstance(boxes, Tensor):
        raise TypeError(f"boxes must be a Tensor[N, 4], got {type(boxes).__name__}")
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"boxes must have shape (N, 4), got {tuple(boxes.shape)}")


def _box_letterbox(boxes: Tensor, scale: float, pad: tuple[float, float]) -> tuple[Tensor, float, Tensor]:
    """Checked boxes (float32, or float64 kept), the scale, and the pad as an xyxy offset."""
    _check_boxes(boxes)
    scale, pad_x, pad_y = _check_letterbox(scale, pad)
    boxes = boxes if boxes.dtype == torch.float64 else boxes.float()
    return boxes, scale, boxes.new_tensor([pad_x, pad_y, pad_x, pad_y])


def boxes_to_canvas(boxes: Tensor, scale: float, pad: tuple[float, float]) -> Tensor:
    """Map xyxy boxes from original image pixels onto the letterboxed canvas.

    Args:
        boxes (Tensor[N, 4] float): xyxy boxes in original pixels.
        scale (float): original -> canvas scale.
        pad (tuple[float, float]): (left, top) padding in canvas pixels.

    Returns:
        Tensor[N, 4] float: ``boxes * scale + (pad_x, pad_y, pad_x, pad_y)``, float64 when the
        input is float64, float32 otherwise.

    Raises:
        TypeError, ValueError: bad shapes or a non-positive scale.
    """
    boxes, scale, offset = _box_letterbox(boxes, scale, pad)
    return boxes * scale + offset


def boxes_to_original(
    boxes: Tensor, scale: float, pad: tuple[float, float], orig_size: tuple[int, int] | None = None
) -> Tensor:
    """Map xyxy boxes from the letterboxed canvas back to original image pixels.

    Args:
        boxes (Tensor[N, 4] float): xyxy boxes in canvas pixels.
        scale (float): original -> canvas scale.
        pad (tuple[float, float]): (left, top) padding in canvas pixels.
        orig_size (tuple[int, int] | None): original (H, W); when given, boxes are clipped to
            ``[0, W] x [0, H]`` (a box reaching into the pad ends at the image border).

    Returns:
        Tensor[N, 4] float: ``(boxes - pad) / scale`` (float64 for float64 input, else float32).

    Raises:
        TypeError, ValueError: bad shapes or a non-positive scale.
    """
    boxes, scale, offset = _box_letterbox(boxes, scale, pad)
    out = (boxes - offset) / scale
    if orig_size is not None:
        height, width = (float(v) for v in orig_size)
        upper = boxes.new_tensor([width, height, width, height])
        out = torch.minimum(out.clamp(min=0.0), upper)
    return out


def resample_axis(
    length: int, grid_length: int, scale: float, pad: float, stride: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bilinear taps along one axis: where original pixel centres fall on a stride grid.

    Original pixel ``k`` (centre ``k + 0.5``) lands at canvas ``c = (k + 0.5) * scale + pad``,
    grid coordinate ``u = c / stride - 0.5`` (cell centres at integers). Its value is
    ``(1 - w) * grid[i0] + w * grid[i1]`` with ``i0 = floor(u)``, ``i1 = i0 + 1``, ``w = u - i0``,
    indices clamped to the grid.

    Args:
        length (int): pixels of the original image along the axis.
        grid_length (int): cells of the grid along the axis.
        scale (float): original -> canvas scale.
        pad (float): padding before the image on this axis, canvas pixels.
        stride (int): canvas pixels per grid cell.

    Returns:
        i0 (ndarray[length] int64), i1 (ndarray[length] int64), w (ndarray[length] float64).
    """
    # float64 coordinates: at 5000 px a float32 position is off by up to 2e-4 px.
    u = ((np.arange(length, dtype=np.float64) + 0.5) * scale + pad) / stride - 0.5
    lower = np.floor(u)
    i0 = np.clip(lower.astype(np.int64), 0, grid_length - 1)
    i1 = np.clip(lower.astype(np.int64) + 1, 0, grid_length - 1)
    return i0, i1, u - lower


def _pixel_windows(occupied: np.ndarray, taps: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per mask, the pixel range ``[lo, hi)`` along one axis whose taps reach a candidate cell.

    ``occupied`` is ``(N, cells)`` bool: whether any cell of that row (or column) may be on. The
    taps are monotonic in the pixel index, so the pixels that read a cell in ``[first, last]`` are
    contiguous: from the first with ``i1 >= first`` to the last with ``i0 <= last``.
    """
    cells = occupied.shape[1]
    first = occupied.argmax(axis=1)
    last = cells - 1 - occupied[:, ::-1].argmax(axis=1)
    lo = np.searchsorted(taps[1], first, side="left")
    hi = np.searchsorted(taps[0], last, side="right")
    empty = ~occupied.any(axis=1)
    lo[empty], hi[empty] = 0, 0
    return lo, hi


def _window_taps(
    taps: tuple[np.ndarray, np.ndarray, np.ndarray], lo: int, hi: int, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Taps of pixels ``[lo, hi)`` re-based on the cells they read, and that cell range."""
    i0, i1, weight = (t[lo:hi] for t in taps)
    first = int(i0[0])
    return i0 - first, i1 - first, weight.astype(dtype), first, int(i1[-1]) + 1


class MaskWindow(NamedTuple):
    """The part of an original-size mask that may be on; everything outside it is off.

    Attributes:
        top (int): first row of the window in the original image.
        left (int): first column.
        mask (ndarray[h, w] bool): the window's pixels.
    """

    top: int
    left: int
    mask: np.ndarray


def _check_masks(masks: Tensor, orig_size: tuple[int, int], stride: int) -> tuple[int, int]:
    if not isinstance(masks, Tensor):
        raise TypeError(f"masks must be a Tensor[N, Hm, Wm], got {type(masks).__name__}")
    if masks.ndim != 3:
        raise ValueError(f"masks must have shape (N, Hm, Wm), got {tuple(masks.shape)}")
    height, width = (int(v) for v in orig_size)
    if height < 1 or width < 1:
        raise ValueError(f"orig_size must be positive (H, W), got {orig_size!r}")
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ValueError(f"stride must be an int >= 1, got {stride!r}")
    if masks.shape[0] and (masks.shape[1] == 0 or masks.shape[2] == 0):
        raise ValueError(f"masks must have a non-empty grid, got {tuple(masks.shape)}")
    return height, width


def mask_windows(
    masks: Tensor, scale: float, pad: tuple[float, float], orig_size: tuple[int, int], stride: int, threshold: float
) -> list[MaskWindow]:
    """Resample masks on a stride grid of the canvas to the original image, threshold them, and
    keep each one's window (the rows and columns that may be on).

    Bilinear (separable, see :func:`resample_axis`) over whatever the grid holds: logits
    (threshold the logit), probabilities, or a bool mask read as 0/1 (threshold 0.5: a pixel is
    on when its centre is nearer an "on" cell centre). A bilinear value is a convex combination
    of its taps, so it passes the threshold only where a tap does: pixels whose taps all lie
    outside the cells above the threshold are off without being computed. Exact, and an image
    with 100 detections costs what its objects cover, not 100 full-size masks. Runs in numpy on
    the CPU (the grid is copied there once): per-window work is small, where torch's per-call
    overhead would dominate.

    Args:
        masks (Tensor[N, Hm, Wm] float or bool): masks on the stride grid of the canvas
            (``Hm = ceil(Hc / stride)``; stride 1 is the canvas itself).
        scale (float): original -> canvas scale.
        pad (tuple[float, float]): (left, top) padding in canvas pixels.
        orig_size (tuple[int, int]): original (H, W).
        stride (int): canvas pixels per grid cell.
        threshold (float): a pixel is foreground when the interpolated value is ``> threshold``.

    Returns:
        N :class:`MaskWindow` (an empty ``(0, 0)`` window for a mask that is off everywhere).

    Raises:
        TypeError, ValueError: bad shapes, stride or letterbox.
    """
    height, width = _check_masks(masks, orig_size, stride)
    scale, pad_x, pad_y = _check_letterbox(scale, pad)
    n, grid_h, grid_w = masks.shape
    if n == 0:
        return []
    dtype = torch.float64 if masks.dtype == torch.float64 else torch.float32
    grid = masks.detach().to(device="cpu", dtype=dtype).numpy()
    rows = resample_axis(height, grid_h, scale, pad_y, stride)
    cols = resample_axis(width, grid_w, scale, pad_x, stride)
    # 1. Cells that may be on (a margin below the threshold: the window may only be wider).
    candidate = grid > threshold - 1e-3 * max(1.0, abs(threshold))
    y_lo, y_hi = _pixel_windows(candidate.any(axis=2), rows)
    x_lo, x_hi = _pixel_windows(candidate.any(axis=1), cols)
    empty = MaskWindow(0, 0, np.zeros((0, 0), bool))
    windows = [empty] * n
    for k in np.flatnonzero((y_hi > y_lo) & (x_hi > x_lo)).tolist():
        # 2. The block of cells the window's pixels read, interpolated along x, then along y.
        ry0, ry1, rw, cy0, cy1 = _window_taps(rows, int(y_lo[k]), int(y_hi[k]), grid.dtype)
        rx0, rx1, cw, cx0, cx1 = _window_taps(cols, int(x_lo[k]), int(x_hi[k]), grid.dtype)
        block = grid[k, cy0:cy1, cx0:cx1]
        left, right = block[:, rx0], block[:, rx1]
        along_x = left + cw * (right - left)  # (cells, w)
        top, bottom = along_x[ry0], along_x[ry1]
        value = top + rw[:, None] * (bottom - top)  # (h, w)
        windows[k] = MaskWindow(int(y_lo[k]), int(x_lo[k]), value > threshold)
    return windows


def masks_to_original(
    masks: Tensor, scale: float, pad: tuple[float, float], orig_size: tuple[int, int], stride: int, threshold: float
) -> Tensor:
    """Full-size original-image masks from masks on the canvas grid.

    Args: as :func:`mask_windows`, whose windows are pasted into full-size masks.

    Returns:
        Tensor[N, H, W] bool on ``masks.device``.

    Raises:
        TypeError, ValueError: bad shapes, stride or letterbox.
    """
    height, width = _check_masks(masks, orig_size, stride)
    out = np.zeros((masks.shape[0], height, width), dtype=bool)
    for k, (top, left, window) in enumerate(mask_windows(masks, scale, pad, orig_size, stride, threshold)):
        out[k, top : top + window.shape[0], left : left + window.shape[1]] = window
    return torch.from_numpy(out).to(masks.device)
