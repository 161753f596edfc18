"""Pure inverse-letterbox kernels: predictions on the validation canvas -> original image pixels.

Validation samples are the original image letterboxed (:func:`~seg_datamodule.transforms.plan.letterbox_layout`):
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

import torch
from torch import Tensor

__all__ = [
    "boxes_to_canvas",
    "boxes_to_original",
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
    _check_boxes(boxes)
    scale, pad_x, pad_y = _check_letterbox(scale, pad)
    boxes = boxes if boxes.dtype == torch.float64 else boxes.float()
    offset = boxes.new_tensor([pad_x, pad_y, pad_x, pad_y])
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
    _check_boxes(boxes)
    scale, pad_x, pad_y = _check_letterbox(scale, pad)
    boxes = boxes if boxes.dtype == torch.float64 else boxes.float()
    offset = boxes.new_tensor([pad_x, pad_y, pad_x, pad_y])
    out = (boxes - offset) / scale
    if orig_size is not None:
        height, width = (float(v) for v in orig_size)
        upper = boxes.new_tensor([width, height, width, height])
        out = torch.minimum(out.clamp(min=0.0), upper)
    return out


def resample_axis(
    length: int, grid_length: int, scale: float, pad: float, stride: int, device: torch.device | None = None
) -> tuple[Tensor, Tensor, Tensor]:
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
        device: where the taps are made.

    Returns:
        i0 (Tensor[length] int64), i1 (Tensor[length] int64), w (Tensor[length] float32).
    """
    # float64 coordinates: at 5000 px a float32 position is off by up to 2e-4 px.
    centres = (torch.arange(length, dtype=torch.float64, device=device) + 0.5) * scale + pad
    u = centres / stride - 0.5
    lower = torch.floor(u)
    weight = (u - lower).to(torch.float32)
    i0 = lower.to(torch.int64).clamp(0, grid_length - 1)
    i1 = (lower.to(torch.int64) + 1).clamp(0, grid_length - 1)
    return i0, i1, weight


def _lerp_along(values: Tensor, dim: int, taps: tuple[Tensor, Tensor, Tensor]) -> Tensor:
    i0, i1, weight = taps
    shape = [1] * values.ndim
    shape[dim] = -1
    weight = weight.to(values.dtype).view(shape)
    if dim == values.ndim - 1:
        # gather, not index_select: on CPU index_select along the last axis is ~8x slower.
        index_shape = (*values.shape[:-1], i0.shape[0])
        a = torch.gather(values, dim, i0.expand(index_shape))
        b = torch.gather(values, dim, i1.expand(index_shape))
    else:
        a = values.index_select(dim, i0)
        b = values.index_select(dim, i1)
    return torch.lerp(a, b, weight)


def masks_to_original(
    masks: Tensor,
    scale: float,
    pad: tuple[float, float],
    orig_size: tuple[int, int],
    stride: int,
    threshold: float,
    transposed: bool = False,
    chunk: int = 16,
) -> Tensor:
    """Resample masks on a stride grid of the canvas to the original image and threshold them.

    Bilinear (separable, see :func:`resample_axis`) over whatever the grid holds: logits
    (threshold the logit), probabilities, or a bool mask read as 0/1 (threshold 0.5: a pixel is
    on when its centre is nearer an "on" cell centre).

    Args:
        masks (Tensor[N, Hm, Wm] float or bool): masks on the stride grid of the canvas
            (``Hm = ceil(Hc / stride)``; stride 1 is the canvas itself).
        scale (float): original -> canvas scale.
        pad (tuple[float, float]): (left, top) padding in canvas pixels.
        orig_size (tuple[int, int]): original (H, W).
        stride (int): canvas pixels per grid cell.
        threshold (float): a pixel is foreground when the interpolated value is ``> threshold``.
        transposed (bool): return ``(N, W, H)`` (each mask's column-major layout, which
            ``pycocotools.mask.encode`` reads without a copy) instead of ``(N, H, W)``.
        chunk (int): masks resampled at a time (bounds the float working memory).

    Returns:
        Tensor[N, H, W] bool (``Tensor[N, W, H]`` when ``transposed``), on ``masks.device``.

    Raises:
        TypeError, ValueError: bad shapes, stride or letterbox.
    """
    if not isinstance(masks, Tensor):
        raise TypeError(f"masks must be a Tensor[N, Hm, Wm], got {type(masks).__name__}")
    if masks.ndim != 3:
        raise ValueError(f"masks must have shape (N, Hm, Wm), got {tuple(masks.shape)}")
    scale, pad_x, pad_y = _check_letterbox(scale, pad)
    height, width = (int(v) for v in orig_size)
    if height < 1 or width < 1:
        raise ValueError(f"orig_size must be positive (H, W), got {orig_size!r}")
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ValueError(f"stride must be an int >= 1, got {stride!r}")
    n, grid_h, grid_w = masks.shape
    shape = (n, width, height) if transposed else (n, height, width)
    out = torch.empty(shape, dtype=torch.bool, device=masks.device)
    if n == 0:
        return out
    if grid_h == 0 or grid_w == 0:
        raise ValueError(f"masks must have a non-empty grid, got {tuple(masks.shape)}")
    rows = resample_axis(height, grid_h, scale, pad_y, stride, masks.device)
    cols = resample_axis(width, grid_w, scale, pad_x, stride, masks.device)
    for start in range(0, n, chunk):
        part = masks[start : start + chunk]
        part = part.float() if part.dtype in (torch.bool, torch.uint8, torch.float16, torch.bfloat16) else part
        # The gather along the last (strided) axis runs on the small grid; the one that makes
        # the full-size output gathers whole contiguous rows, several times faster.
        if transposed:
            part, first, second = part.transpose(1, 2).contiguous(), rows, cols  # (n, Wm, Hm)
        else:
            part, first, second = part.contiguous(), cols, rows
        value = _lerp_along(_lerp_along(part, 2, first), 1, second)
        torch.gt(value, threshold, out=out[start : start + chunk])
    return out
