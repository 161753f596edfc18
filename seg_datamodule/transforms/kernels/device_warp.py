"""Pixels on the device (issue 53): a batch's JPEGs decoded and its tiles warped by torch ops.

The worker path decodes each image with OpenCV and resamples it once into the canvas
(:func:`~seg_datamodule.transforms.kernels.warp.warp_tiles`). Here the workers ship the encoded bytes and
the plans, and the accelerator does both for the whole batch:
:func:`~seg_datamodule.io.images.device_decode.decode_jpegs` (re-exported here) and
:func:`warp_tiles_device` (one gather pass over every output pixel of the batch).

The warp copies OpenCV 5.1's arithmetic, not just its geometry
(``tests/transforms/test_device_warp.py`` measures it):

* ``cv2.resize`` tiles (the default recipe): fractions ``float((d + 0.5) * scale - 0.5)``,
  11-bit weights, int32 rows and the SIMD vertical pass ``((h0 >> 4) * b0 >> 16) + ((h1 >> 4)
  * b1 >> 16) + 2 >> 2``, vertical weights unclamped at the crop's first and last rows. Bit for
  bit.
* rotated or sheared ``cv2.warpAffine`` tiles: OpenCV 5 interpolates 8-bit pixels in float32
  (the ``INTER_BITS`` fixed point is gone), along x then y, rounded half to even; coordinates
  here in float64 (float32 on MPS). About 1 value in 10^4 differs by one grey level.
* axis-aligned ``cv2.warpAffine`` tiles (where a tile cannot be resized): OpenCV takes an integer
  path for scale-and-shift matrices (pixels in Q6, fractions floored to Q14; found by probing,
  :func:`.opencv_bilinear.interpolate_shift`). Bit for bit where the four neighbours lie inside the image; where
  the replicated edge is sampled OpenCV rounds yet another way (a few values in 10^3 there).

OpenCV 4 (``cv2.__version__`` below 5) resamples the last two kinds in fixed point, and so does
the kernel there, bit for bit (:func:`.opencv_bilinear.fixed_point_sources`): source positions from the very matrix
``warp_tiles`` hands ``cv2.warpAffine``, rounded to 1/1024 per row and column, summed and cut to
1/32 pixel; weights ``(32 - a) * (32 - b)`` and so on, ``(sum + 512) >> 10``.

Coverage follows ``warp_tiles``: pixel ``(i, j)`` belongs to the last tile whose region holds the
inverse image of its centre ``(j + 0.5, i + 0.5)``, half-open. ``warp_tiles`` rasterises a rotated
tile's parallelogram instead: the same set but for centres within rounding of an edge.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from seg_datamodule.io.images.device_decode import (
    decode_jpegs,  # the batch's other half, re-exported
)
from seg_datamodule.ops.affine import compose_affine, invert_affine, to_cv2_matrix
from seg_datamodule.transforms.kernels.opencv_bilinear import (
    fixed_point_sources,
    interpolate_fixed,
    interpolate_resize,
    interpolate_shift,
    interpolate_warp,
    opencv4,
    resize_axis,
    warp_axis,
)
from seg_datamodule.transforms.kernels.plan import TilePlan

__all__ = ["decode_jpegs", "flip_canvases", "warp_tiles_device"]

_FILL = 114  # transforms.warp.FILL_VALUE, which brings OpenCV with it; a test keeps them equal
# Tile kinds (how warp_tiles renders a tile), and columns of the integer tile table.
_NONE, _AXIS, _RESIZE, _GENERAL = 0, 1, 2, 3
_I_BASE, _I_BOUNDS = 4, 6
_F_CV = 12  # columns of the float tile table from here: cv2.warpAffine's matrix (6), its origin (2)
_F_SAMPLE = 20  # and from here: canvas -> (reduced) source pixels, the sampling matrix (6)


def _cv2_warp_matrix(matrix: np.ndarray, window: tuple[int, int, int, int], rect: tuple[int, int, int, int] | None,
                     reduce: int) -> tuple[np.ndarray, tuple[int, int]]:
    """The matrix ``warp_tiles`` hands ``cv2.warpAffine`` (``WARP_INVERSE_MAP``, an image decoded at
    ``reduce``) and the canvas pixel its output starts at: the window, or an axis-aligned tile's
    covered rectangle. Composed as ``warp_tiles`` composes it, so the doubles are the same."""
    wx0, wy0 = window[0], window[1]
    src_to_window = compose_affine(np.array([[1.0, 0.0, -wx0], [0.0, 1.0, -wy0]]), matrix,
                                   np.array([[float(reduce), 0.0, 0.0], [0.0, float(reduce), 0.0]]))
    if rect is None:
        return to_cv2_matrix(invert_affine(src_to_window)), (wx0, wy0)
    sub = compose_affine(np.array([[1.0, 0.0, -(rect[0] - wx0)], [0.0, 1.0, -(rect[1] - wy0)]]), src_to_window)
    return to_cv2_matrix(invert_affine(sub)), (rect[0], rect[1])


def _axis_aligned_rect(matrix: np.ndarray, region: np.ndarray, window: tuple[int, int, int, int]
                       ) -> tuple[int, int, int, int] | None:
    """Output pixels ``x0, y0, x1, y1`` an axis-aligned tile covers, as ``warp_tiles`` computes
    them (so both paths agree on every seam); None when it covers none."""
    inverse = invert_affine(matrix)
    u = inverse[0, 0] * (np.arange(window[0], window[2], dtype=np.float64) + 0.5) + inverse[0, 2]
    v = inverse[1, 1] * (np.arange(window[1], window[3], dtype=np.float64) + 0.5) + inverse[1, 2]
    cols = window[0] + np.flatnonzero((u >= region[0]) & (u < region[2]))
    rows = window[1] + np.flatnonzero((v >= region[1]) & (v < region[3]))
    return None if len(cols) == 0 or len(rows) == 0 else (cols[0], rows[0], cols[-1] + 1, rows[-1] + 1)


def _resizable(spec: np.ndarray, rect: tuple[int, int, int, int], size: tuple[int, int]) -> bool:
    """Whether ``warp_tiles`` renders this tile with ``cv2.resize`` (its ``_resize_tile`` test):
    the spec's resized crop holds the covered pixels and their bilinear neighbours."""
    ax0, ay0, ax1, ay1, dx, dy, bx, by = (int(v) for v in spec)
    c0, r0, c1, r1 = rect[0] - bx, rect[1] - by, rect[2] - bx, rect[3] - by
    if ax0 < 0 or c0 < 0 or r0 < 0 or c1 > dx or r1 > dy:
        return False
    h, w = size
    kx, ky = (ax1 - ax0) / dx, (ay1 - ay0) / dy
    return not (
        (ax0 > 0 and math.floor((c0 + 0.5) * kx - 0.5) < 0)
        or (ax1 < w and math.floor((c1 - 0.5) * kx - 0.5) + 1 > ax1 - ax0 - 1)
        or (ay0 > 0 and math.floor((r0 + 0.5) * ky - 0.5) < 0)
        or (ay1 < h and math.floor((r1 - 0.5) * ky - 0.5) + 1 > ay1 - ay0 - 1)
    )


def _tile_tables(
    images: Sequence[torch.Tensor | None], plans: Sequence[TilePlan], tile_images: list[list[int]],
    reduces: list[list[int]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """Per tile slot ``t = k * B + b``, on the host: what the device pass needs.

    Returns:
        floats (ndarray[K * B, 26] float64): inverse matrix (6), region (4), resize scales (2),
            ``cv2.warpAffine``'s matrix (6) and the canvas pixel its output starts at (2), the
            inverse of the matrix from the tile's decoded (maybe reduced) pixels (6).
        ints (ndarray[K * B, 10] int64): resize crop origin and placement (4), start in the flat
            pixel buffer, row stride, pixels sampling clamps to ``x_lo, x_hi, y_lo, y_hi``.
        kinds (ndarray[K * B] int64): ``_NONE``, ``_AXIS``, ``_RESIZE`` or ``_GENERAL``.
        used (list[int]): the images the buffer holds, in order.
    """
    batch, slots = len(plans), max(len(p) for p in plans)
    floats = np.zeros((slots * batch, 26))  # a zero region: an empty slot covers nothing
    ints = np.zeros((slots * batch, 10), np.int64)
    kinds = np.zeros(slots * batch, np.int64)
    base: dict[int, int] = {}
    used: list[int] = []
    for b, plan in enumerate(plans):
        for k, (matrix, region, window) in enumerate(zip(plan.matrices, plan.regions, plan.windows)):
            if window is None:
                continue
            index, t = tile_images[b][k], k * batch + b
            image = images[index] if 0 <= index < len(images) else None
            if image is None:
                raise ValueError(f"tile {k} of sample {b} is visible but has no image (index {index})")
            h, w = int(image.shape[-2]), int(image.shape[-1])
            rect, kinds[t] = None, _GENERAL
            if matrix[0, 1] == 0.0 and matrix[1, 0] == 0.0:
                rect, kinds[t] = _axis_aligned_rect(matrix, region, window), _AXIS
                if rect is None:
                    kinds[t] = _NONE
                    continue
            if index not in base:
                base[index] = sum(images[i].shape[-2] * images[i].shape[-1] for i in used)
                used.append(index)
            reduce = reduces[b][k]
            scale = np.array([[float(reduce), 0.0, 0.0], [0.0, float(reduce), 0.0]])
            floats[t, :10] = *invert_affine(matrix).ravel(), *region
            cv_matrix, origin = _cv2_warp_matrix(matrix, window, rect, reduce)
            floats[t, _F_CV:_F_SAMPLE] = *cv_matrix.ravel(), *origin
            # Sampling from a reduced decode (warp_tiles: never resized); coverage keeps the plan's.
            floats[t, _F_SAMPLE:] = invert_affine(compose_affine(matrix, scale) if reduce > 1 else matrix).ravel()
            ints[t, _I_BASE:] = base[index], w, 0, w - 1, 0, h - 1
            spec = None if plan.resize is None else plan.resize[k]
            if rect is not None and spec is not None and reduce == 1 and _resizable(spec, rect, (h, w)):
                ax0, ay0, ax1, ay1, dx, dy, bx, by = (int(v) for v in spec)
                kinds[t] = _RESIZE
                # cv2.resize's scale: 1 / inv_scale in double, as OpenCV computes it.
                floats[t, 10:12] = 1.0 / (dx / (ax1 - ax0)), 1.0 / (dy / (ay1 - ay0))
                ints[t, :4] = ax0, ay0, bx, by
                ints[t, _I_BOUNDS:] = ax0, ax1 - 1, ay0, ay1 - 1  # resize replicates the crop's edge
    if sum(images[i].shape[-2] * images[i].shape[-1] for i in used) >= 2**31:
        raise ValueError("the batch's images hold 2**31 pixels or more; warp it in parts")
    return floats, ints, kinds, used


def _check_batch(images: Sequence[torch.Tensor | None], plans: Sequence[TilePlan],
                 tile_images: Sequence[Sequence[int]] | None) -> list[list[int]]:
    """Argument checks of :func:`warp_tiles_device`; the tile-to-image indices as lists."""
    if tile_images is None:
        starts = np.cumsum([0] + [len(p) for p in plans])
        tile_images = [range(s, s + len(p)) for s, p in zip(starts, plans)]
    if len(tile_images) != len(plans):
        raise ValueError(f"tile_images has {len(tile_images)} samples but plans has {len(plans)}")
    indices = [[int(i) for i in row] for row in tile_images]
    for b, (row, plan) in enumerate(zip(indices, plans)):
        if len(row) != len(plan):
            raise ValueError(f"tile_images[{b}] has {len(row)} entries but its plan has {len(plan)} tiles")
        if tuple(plan.output_size) != tuple(plans[0].output_size):
            raise ValueError(f"plans[{b}] has output_size {plan.output_size}, plans[0] {plans[0].output_size}")
    given = [im for im in images if im is not None]
    for im in given:
        if not isinstance(im, torch.Tensor) or im.dtype != torch.uint8 or im.ndim != 3 or im.shape[0] != given[0].shape[0]:
            raise TypeError(f"images must be uint8 (C, H, W) tensors with one C, got {im!r:.80}")
        if im.device != given[0].device:
            raise ValueError(f"images must share a device, got {im.device} and {given[0].device}")
    return indices


def warp_tiles_device(
    images: Sequence[torch.Tensor | None],
    plans: Sequence[TilePlan],
    tile_images: Sequence[Sequence[int]] | None = None,
    fill: int = _FILL,
    device: torch.device | str | None = None,
    reduces: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:
    """Warp every tile of a batch into its canvas in one pass, as ``warp_tiles`` does per sample.

    Sample ``b``'s canvas is ``warp_tiles([images[i] for i in tile_images[b]], plans[b])``
    (full-size images, bilinear) up to what the module docstring lists. The work: a coverage test
    per tile slot, source coordinates per column and row of axis-aligned tiles (per pixel of
    rotated ones), one gather of four neighbours per output pixel from all images laid end to end.

    Args:
        images (Sequence[Tensor[C, h, w] uint8 | None]): decoded full-size images on one device;
            None for an image no visible tile uses.
        plans (Sequence[TilePlan]): per sample, its tiles (any number each; one output size).
        tile_images (Sequence[Sequence[int]] | None): ``tile_images[b][k]`` indexes the image of
            tile ``k`` of sample ``b`` (an image may serve several tiles, e.g. batch partners);
            None: ``images`` holds the samples' tiles one after another.
        fill (int): value of pixels no tile covers.
        device (torch.device | str | None): device of the canvases when no image is given (all
            tiles invisible); default the CPU.
        reduces (Sequence[Sequence[int]] | None): per sample, per tile, the factor its image was
            decoded smaller by (``warp_tiles``' ``reduces``: the image is ``ceil(h / r) x ceil(w / r)``,
            and such a tile is never resized); None: all full size.

    Returns:
        Tensor[B, C, H, W] uint8: the canvases (``C`` 3 when no image is given; ``(0, C, 0, 0)``
        for an empty batch).

    Raises:
        TypeError: an image is not a ``uint8 (C, h, w)`` tensor, or channels differ.
        ValueError: lengths disagree, output sizes differ, images are on different devices,
            ``fill`` is not in 0..255, or a visible tile has no image.
    """
    # 1. Check arguments; an empty batch, or one with no visible tile, needs no pixel work.
    if not (isinstance(fill, (int, np.integer)) and 0 <= fill <= 255):
        raise ValueError(f"fill must be an int in 0..255, got {fill!r}")
    indices = _check_batch(images, plans, tile_images)
    factors = [[1] * len(row) for row in indices] if reduces is None else [[int(r) for r in row] for row in reduces]
    if [len(row) for row in factors] != [len(row) for row in indices]:
        raise ValueError("reduces must give one factor per tile of every sample")
    reduced = any(r > 1 for row in factors for r in row)
    given = [im for im in images if im is not None]
    channels = int(given[0].shape[0]) if given else 3
    dev = given[0].device if given else torch.device(device if device is not None else "cpu")
    if not plans:
        return torch.empty((0, channels, 0, 0), dtype=torch.uint8, device=dev)
    (height, width), batch = plans[0].output_size, len(plans)
    floats, ints, kinds, used = _tile_tables(images, plans, indices, factors)
    if not used:
        return torch.full((batch, channels, height, width), fill, dtype=torch.uint8, device=dev)
    real = torch.float32 if dev.type == "mps" else torch.float64  # MPS has no float64
    ftab = torch.from_numpy(floats).to(dev, real).T.contiguous()[..., None]  # (26, T, 1)
    itab = torch.from_numpy(ints).to(dev).T.contiguous()[..., None]  # (10, T, 1)
    kind = torch.from_numpy(kinds).to(dev)
    cols = torch.arange(width, device=dev, dtype=real)
    rows = torch.arange(height, device=dev, dtype=real)

    # 2. Coverage: each output pixel takes the last tile slot whose region holds its centre's
    # inverse image (the rasteriser's half-open rule; warp_tiles lets later tiles overwrite).
    # For axis-aligned slots the test splits into columns and rows, in the same arithmetic.
    # Rotated slots keep their pixels' inverse images: warpAffine's source coordinates.
    sample = torch.arange(batch, device=dev, dtype=torch.int32).view(batch, 1, 1)
    tile = torch.full((batch, height, width), -1, dtype=torch.int32, device=dev)
    xc, yc = (cols + 0.5).view(1, 1, width), (rows + 0.5).view(1, height, 1)
    general = (kinds == _GENERAL).any()
    src_x = src_y = torch.zeros((batch, height, width), dtype=real, device=dev) if general else None
    for k in range(len(kinds) // batch):
        f = ftab[:, k * batch:(k + 1) * batch].view(-1, batch, 1, 1)
        if (kinds[k * batch:(k + 1) * batch] == _GENERAL).any():
            u, v = (f[0] * xc + f[2]) + f[1] * yc, (f[4] * yc + f[5]) + f[3] * xc
        else:  # f[1], f[3] are +-0: the sums of warp_tiles' axis-aligned test, column by row
            u, v = f[0] * xc + f[2], f[4] * yc + f[5]
        inside = (u >= f[6]) & (u < f[8]) & (v >= f[7]) & (v < f[9])
        tile = torch.where(inside, sample + k * batch, tile)
        if general and u.shape == tile.shape:
            if reduced:  # sampled in the reduced image's pixels
                g = f[_F_SAMPLE:]
                u, v = (g[0] * xc + g[2]) + g[1] * yc, (g[4] * yc + g[5]) + g[3] * xc
            src_x, src_y = torch.where(inside, u, src_x), torch.where(inside, v, src_y)
    covered = tile >= 0
    tile.clamp_(min=0)

    # 3. Source pixels and fractions per column and per row of every axis-aligned tile, in the
    # arithmetic of the OpenCV call warp_tiles makes for it; then looked up per output pixel.
    resize = (kind == _RESIZE).view(-1, 1)
    g = ftab[_F_SAMPLE:]  # the plan's inverse, or (reduced decode) that of the image's own matrix
    x_warp, fx_warp = warp_axis(g[0] * (cols + 0.5) + g[2] - 0.5)
    y_warp, fy_warp = warp_axis(g[4] * (rows + 0.5) + g[5] - 0.5)
    x_res, fx_res = resize_axis(cols, itab[2], ftab[10], itab[0], itab[_I_BOUNDS + 1] - itab[_I_BOUNDS] + 1)
    y_res, fy_res = resize_axis(rows, itab[3], ftab[11], itab[1], None)
    x0, x1, fx = _clamped(torch.where(resize, x_res, x_warp), torch.where(resize, fx_res, fx_warp),
                          itab[_I_BOUNDS], itab[_I_BOUNDS + 1], None, None)
    y0, y1, fy = _clamped(torch.where(resize, y_res, y_warp), torch.where(resize, fy_res, fy_warp),
                          itab[_I_BOUNDS + 2], itab[_I_BOUNDS + 3], itab[_I_BASE], itab[_I_BASE + 1])
    by_col = (tile * width + torch.arange(width, device=dev, dtype=torch.int32)).view(-1)
    by_row = (tile * height + torch.arange(height, device=dev, dtype=torch.int32).view(height, 1)).view(-1)
    x0, x1, fx = (t.view(-1).index_select(0, by_col) for t in (x0, x1, fx))
    y0, y1, fy = (t.view(-1).index_select(0, by_row) for t in (y0, y1, fy))
    flat = tile.view(-1)
    if general or opencv4():
        start, stride, x_lo, x_hi, y_lo, y_hi = itab[_I_BASE:, :, 0].T.contiguous().index_select(0, flat).unbind(1)
    if opencv4():
        # warpAffine's fixed point, for every pixel not resized (rotated and axis-aligned tiles).
        sx, sy = fixed_point_sources(ftab[_F_CV:_F_SAMPLE], cols, rows, by_col, by_row)
        gx = _clamped(sx >> 5, (sx & 31).to(torch.float32) / 32, x_lo, x_hi, None, None)
        gy = _clamped(sy >> 5, (sy & 31).to(torch.float32) / 32, y_lo, y_hi, start, stride)
        warped = (kind != _RESIZE).index_select(0, flat)
        x0, x1, fx = (torch.where(warped, a, b) for a, b in zip(gx, (x0, x1, fx)))
        y0, y1, fy = (torch.where(warped, a, b) for a, b in zip(gy, (y0, y1, fy)))
    elif general:
        # Rotated or sheared tiles: per pixel, from the inverse images kept in step 2.
        gx = _clamped(*warp_axis(src_x.view(-1) - 0.5), x_lo, x_hi, None, None)
        gy = _clamped(*warp_axis(src_y.view(-1) - 0.5), y_lo, y_hi, start, stride)
        rotated = (kind == _GENERAL).index_select(0, flat)
        x0, x1, fx = (torch.where(rotated, a, b) for a, b in zip(gx, (x0, x1, fx)))
        y0, y1, fy = (torch.where(rotated, a, b) for a, b in zip(gy, (y0, y1, fy)))

    # 4. Gather the four neighbours from all images laid end to end, interpolate as OpenCV does.
    pixels = torch.cat([images[i].reshape(channels, -1) for i in used], dim=1)
    p = [pixels.index_select(1, r + c) for r in (y0, y1) for c in (x0, x1)]
    out = torch.full_like(p[0], fill)
    pixel_kind = torch.where(covered.view(-1), kind.index_select(0, tile.view(-1)), _NONE)
    kernels = ((_GENERAL, interpolate_fixed), (_AXIS, interpolate_fixed)) if opencv4() else (
        (_GENERAL, interpolate_warp), (_AXIS, interpolate_shift))
    for k, interpolate in (*kernels, (_RESIZE, interpolate_resize)):
        if (kinds == k).any():
            out = torch.where(pixel_kind == k, interpolate(p, fx, fy), out)
    return out.view(channels, batch, height, width).transpose(0, 1).contiguous()


def _clamped(whole: torch.Tensor, frac: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
             start: torch.Tensor | None, stride: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """Both neighbours along an axis, clamped to ``[lo, hi]`` (BORDER_REPLICATE, or resize's crop
    edge), as int32 offsets into the flat buffer (``start + i * stride``, or ``i``); the fraction."""
    first, second = whole.clamp(lo, hi), (whole + 1).clamp(lo, hi)
    if start is not None:
        first, second = start + first * stride, start + second * stride
    return first.to(torch.int32), second.to(torch.int32), frac


def flip_canvases(canvases: torch.Tensor, flips: torch.Tensor, axis: int = 1) -> torch.Tensor:
    """Mirror the canvases whose flag is set, as :func:`~seg_datamodule.transforms.geometric.flips.flip_canvas`.

    Args:
        canvases (Tensor[B, C, H, W]): the batch.
        flips (Tensor[B] bool): which to mirror.
        axis (int): ``1`` left-right (``x -> W - x``), ``0`` upside down.

    Returns:
        Tensor[B, C, H, W]: a new batch.

    Raises:
        ValueError: ``axis`` is not 0 or 1, or ``flips`` is not ``(B,)``.
    """
    if axis not in (0, 1):
        raise ValueError(f"axis must be 0 or 1, got {axis!r}")
    if tuple(flips.shape) != (canvases.shape[0],):
        raise ValueError(f"flips must be ({canvases.shape[0]},), got {tuple(flips.shape)}")
    mirrored = canvases.flip(-1 if axis == 1 else -2)
    return torch.where(flips.to(device=canvases.device, dtype=torch.bool).view(-1, 1, 1, 1), mirrored, canvases)
