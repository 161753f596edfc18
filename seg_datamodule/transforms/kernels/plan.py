"""Pure mosaic and letterbox placement: where each source image lands on the output canvas.

A *tile plan* says, for each source image (one for a letterbox, four for a mosaic), the affine
that maps its original pixels straight to the output canvas and the rectangle of the original
image that shows (its *region*). Pixels (:mod:`~seg_datamodule.transforms.kernels.warp`) and polygons
(:mod:`~seg_datamodule.transforms.kernels.polygons`) both go through exactly these matrices.
:func:`snap_for_resize` nudges an axis-aligned tile's matrix (scale by ~1e-4 typically) to one
that ``cv2.resize`` of an integer crop realises exactly, five times cheaper than
``cv2.warpAffine`` for the same bilinear resample.

Coordinates are continuous pixels (pixel ``k`` covers ``[k, k + 1)``) throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from seg_datamodule.ops.affine import affine_scale, apply_affine

__all__ = [
    "TilePlan",
    "choose_reduce",
    "draw_batch_partners",
    "letterbox_layout",
    "mosaic_layout",
    "region_corners",
    "snap_for_resize",
    "visible_tiles",
]


@dataclass(frozen=True)
class TilePlan:
    """Where each source image lands on the output canvas.

    Attributes:
        matrices (ndarray[K, 2, 3] float64): original image pixels -> output pixels, per tile.
        regions (ndarray[K, 4] float64): ``x0, y0, x1, y1`` in original image pixels, the part of
            each image that shows (a half-open rectangle for pixel centres, closed for polygons).
        output_size (tuple[int, int]): (H, W) of the output canvas.
        resize (ndarray[K, 8] int64 | None): per tile, how ``cv2.resize`` realises its matrix
            exactly (see :func:`snap_for_resize`): source crop ``x0, y0, x1, y1``, resized size
            ``w, h`` and where the resized crop's top-left lands ``bx, by``; a row of -1 (or
            ``None`` for all) means the tile is warped with ``cv2.warpAffine``.
    """

    matrices: np.ndarray
    regions: np.ndarray
    output_size: tuple[int, int]
    resize: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.matrices.shape[0])

    @cached_property
    def windows(self) -> list[tuple[int, int, int, int] | None]:
        """Per tile, the output pixel window (x0, y0, x1, y1) it may touch; None if none."""
        return [_pixel_window(m, r, self.output_size) for m, r in zip(self.matrices, self.regions)]


def _scale_translate(scale: float, tx: float, ty: float) -> np.ndarray:
    return np.array([[scale, 0.0, tx], [0.0, scale, ty]])


def mosaic_layout(
    image_sizes: np.ndarray, center: tuple[float, float], image_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """YOLO 4-image mosaic placement on a ``2s x 2s`` canvas.

    Each image is scaled so its long side is ``s`` and placed against the centre: top-left,
    top-right, bottom-left, bottom-right (Ultralytics ``Mosaic._mosaic4``). The part that falls
    outside the canvas is cut, as there.

    Args:
        image_sizes (ndarray[4, 2] int): (H, W) of the four original images.
        center (tuple[float, float]): x, y of the mosaic centre on the canvas.
        image_size (int): ``s``.

    Returns:
        matrices (ndarray[4, 2, 3] float64): original pixels -> canvas pixels.
        regions (ndarray[4, 4] float64): the visible rectangle of each image, in its own pixels.

    Raises:
        ValueError: ``image_sizes`` is not ``(4, 2)`` positive or ``image_size`` is not positive.
    """
    sizes = np.asarray(image_sizes, dtype=np.float64)
    if sizes.shape != (4, 2) or (sizes <= 0).any():
        raise ValueError(f"image_sizes must be (4, 2) positive (H, W), got {sizes.tolist()}")
    if image_size <= 0:
        raise ValueError(f"image_size must be positive, got {image_size!r}")
    s = float(image_size)
    xc, yc = float(center[0]), float(center[1])
    matrices = np.empty((4, 2, 3))
    regions = np.empty((4, 4))
    for k, (h, w) in enumerate(sizes):
        r = s / max(h, w)
        # Top-left corner of the placed image on the canvas.
        x = xc - w * r if k in (0, 2) else xc
        y = yc - h * r if k in (0, 1) else yc
        matrices[k] = _scale_translate(r, x, y)
        # Canvas [0, 2s] pulled back into image pixels, intersected with the image.
        regions[k] = (
            max(0.0, -x / r),
            max(0.0, -y / r),
            min(w, (2 * s - x) / r),
            min(h, (2 * s - y) / r),
        )
    return matrices, regions


def letterbox_layout(
    image_size_hw: tuple[int, int], canvas_size: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, float, tuple[float, float]]:
    """Scale an image to fit the canvas, keeping its aspect ratio, and centre it.

    The scale is exactly ``min(Hc / H, Wc / W)`` and the padding is not rounded, so a prediction
    maps back with ``x_orig = (x - pad_left) / scale``.

    Args:
        image_size_hw (tuple[int, int]): (H, W) of the original image.
        canvas_size (tuple[int, int]): (Hc, Wc) of the canvas.

    Returns:
        matrix (ndarray[2, 3] float64): original pixels -> canvas pixels.
        region (ndarray[4] float64): ``0, 0, W, H`` (the whole image shows).
        scale (float): the scale.
        pad (tuple[float, float]): (left, top) padding in canvas pixels.

    Raises:
        ValueError: a size is not positive.
    """
    h, w = (float(v) for v in image_size_hw)
    hc, wc = (float(v) for v in canvas_size)
    if min(h, w, hc, wc) <= 0:
        raise ValueError(
            f"image_size_hw and canvas_size must be positive, got {image_size_hw!r}, {canvas_size!r}"
        )
    scale = min(hc / h, wc / w)
    # Whole-pixel padding (rounded as Ultralytics does): a half-pixel offset would average every
    # output pixel from two source neighbours, blurring validation images that training never sees.
    pad = (float(round((wc - w * scale) / 2.0 - 0.1)), float(round((hc - h * scale) / 2.0 - 0.1)))
    pad = (max(pad[0], 0.0), max(pad[1], 0.0))
    return _scale_translate(scale, *pad), np.array([0.0, 0.0, w, h]), scale, pad


def choose_reduce(matrix: np.ndarray, allowed: Sequence[int] = (1, 2, 4, 8)) -> int:
    """Largest JPEG DCT reduction that still decodes at least the output's resolution.

    Args:
        matrix (ndarray[2, 3] float64): original pixels -> output pixels.
        allowed (Sequence[int]): reductions the decoder supports.

    Returns:
        int: the largest ``r`` in ``allowed`` with ``r <= 1 / stretch`` (``stretch`` the largest
        singular value of the matrix), else 1.
    """
    stretch = affine_scale(matrix)
    best = 1
    for r in allowed:
        if r * stretch <= 1.0 + 1e-9 and r > best:
            best = int(r)
    return best


def region_corners(region: np.ndarray) -> np.ndarray:
    """The four corners ``float64 (4, 2)`` of an ``x0, y0, x1, y1`` rectangle, clockwise on screen."""
    x0, y0, x1, y1 = region
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float64)


def _pixel_window(
    matrix: np.ndarray, region: np.ndarray, output_size: tuple[int, int]
) -> tuple[int, int, int, int] | None:
    """Output pixel window (x0, y0, x1, y1), half-open, that holds the tile, or None if empty."""
    if region[2] <= region[0] or region[3] <= region[1]:
        return None
    corners = apply_affine(region_corners(region), matrix)
    lo = np.floor(corners.min(axis=0) - 0.5)
    hi = np.ceil(corners.max(axis=0) + 0.5)
    x0, y0 = max(int(lo[0]), 0), max(int(lo[1]), 0)
    x1, y1 = min(int(hi[0]), output_size[1]), min(int(hi[1]), output_size[0])
    if x1 <= x0 or y1 <= y0:
        return None
    return x0, y0, x1, y1


_SNAP_MARGIN = 2  # source pixels kept beyond what the owned output pixels sample
_SNAP_SEARCH = 16  # crop lengths tried for the best rational approximation of the scale


def _snap_axis(
    scale: float, offset: float, lo: float, hi: float, size: int, out_size: int, anchor: int
) -> tuple[int, int, int, int] | None:
    """One axis of :func:`snap_for_resize`: crop ``[a0, a1)`` resized to ``d`` pixels at ``b``.

    The designed map is ``X = scale * u + offset``; ``[lo, hi]`` is the tile's region on this
    axis; ``anchor`` is -1 (free), 0 (source edge 0 must keep its output position) or 1 (edge
    ``size`` must). Returns None when no crop works (the caller then warps).
    """
    # An anchored edge that lands outside the output anchors no seam there.
    if anchor >= 0 and not 0.0 <= scale * (anchor * size) + offset <= out_size:
        anchor = -1
    # Source span the output pixels can sample, with a margin for the bilinear neighbours.
    x_lo = max(scale * lo + offset, 0.0)
    x_hi = min(scale * hi + offset, float(out_size))
    if x_hi <= x_lo:
        return None
    u_lo, u_hi = (x_lo - offset) / scale, (x_hi - offset) / scale
    crop_lo = max(0, math.floor(u_lo) - _SNAP_MARGIN)
    crop_hi = min(size, math.ceil(u_hi) + _SNAP_MARGIN)
    # Candidate crops: the anchored end stays, the other moves outwards (never past the image).
    # Plain Python: 16 scalar candidates cost less than numpy's per-call overhead.
    best_err, a0, a1, d = math.inf, 0, 0, 0
    for j in range(_SNAP_SEARCH):
        if anchor == 1:
            c0, c1 = crop_lo - j, size
            if c0 < 0:
                break
        else:
            c0, c1 = (0 if anchor == 0 else crop_lo), crop_hi + j
            if c1 > size:
                break
        length = (c1 - c0) * scale
        cd = round(length)
        if cd < 1:
            continue
        err = abs(cd / length - 1.0)
        if err < best_err:
            best_err, a0, a1, d = err, c0, c1, cd
    if d < 1:
        return None
    # Where the crop lands: the anchored edge keeps its (integer) output position.
    if anchor == 1:
        b = int(round(scale * size + offset)) - d
    else:
        b = int(round(scale * a0 + offset))
    return a0, a1, d, b


def snap_for_resize(plan: TilePlan, image_sizes: np.ndarray, anchors: np.ndarray) -> TilePlan:
    """Nudge axis-aligned tiles so that one ``cv2.resize`` of an integer crop realises them exactly.

    ``cv2.resize`` maps a crop ``[a0, a1)`` onto ``d`` output pixels at ``b`` as the continuous
    affine ``X = b + (u - a0) * d / (a1 - a0)`` (bilinear, edge pixels replicated) at a fifth of
    ``cv2.warpAffine``'s cost. Each tile's scale becomes the nearest such ratio (the crop length
    is chosen among 16 so the relative change is small: ~1e-4 typically, a few 1e-3 at worst on
    coco-mini mosaics) and its placement moves by a fraction of a pixel (up to ~2 px at the far
    edge of a tile, in the worst case); the returned plan holds the realised matrices, so pixels
    and polygons still go through one matrix. A tile's *footprint* on the output (its designed region mapped by its
    designed matrix) is kept: the new region is the footprint pulled back through the new
    matrix, cut to the image. With the mosaic centre on an integer output point and each tile's
    inner corner anchored there, the four tiles still meet exactly at the centre.

    Tiles that are rotated, sheared or flipped are left as they are (warped with
    ``cv2.warpAffine``).

    Args:
        plan (TilePlan): the designed plan.
        image_sizes (ndarray[K, 2] int): (H, W) of each tile's original image.
        anchors (ndarray[K, 2] int): per tile and axis (x, y): -1 free, 0 if source edge 0 must
            keep its output position, 1 if the far edge (W or H) must. That position must be an
            integer output coordinate.

    Returns:
        TilePlan: realised matrices, regions and ``resize`` specs.
    """
    matrices = plan.matrices.copy()
    regions = plan.regions.copy()
    specs = np.full((len(plan), 8), -1, np.int64)
    h_out, w_out = plan.output_size
    for k, (m, region, (h, w)) in enumerate(zip(plan.matrices.tolist(), plan.regions.tolist(),
                                                 np.asarray(image_sizes).tolist())):
        if m[0][1] != 0.0 or m[1][0] != 0.0 or m[0][0] <= 0.0 or m[1][1] <= 0.0:
            continue
        sx = _snap_axis(m[0][0], m[0][2], region[0], region[2], int(w), w_out, int(anchors[k][0]))
        sy = _snap_axis(m[1][1], m[1][2], region[1], region[3], int(h), h_out, int(anchors[k][1]))
        if sx is None or sy is None:
            continue
        (ax0, ax1, dx, bx), (ay0, ay1, dy, by) = sx, sy
        kx, ky = dx / (ax1 - ax0), dy / (ay1 - ay0)
        tx, ty = bx - ax0 * kx, by - ay0 * ky
        snapped = np.array([[kx, 0.0, tx], [0.0, ky, ty]])
        # The designed footprint (x0, y0, x1, y1) pulled back through the snapped matrix.
        fx0, fx1 = m[0][0] * region[0] + m[0][2], m[0][0] * region[2] + m[0][2]
        fy0, fy1 = m[1][1] * region[1] + m[1][2], m[1][1] * region[3] + m[1][2]
        regions[k] = (
            max((fx0 - tx) / kx, 0.0),
            max((fy0 - ty) / ky, 0.0),
            min((fx1 - tx) / kx, float(w)),
            min((fy1 - ty) / ky, float(h)),
        )
        matrices[k] = snapped
        specs[k] = (ax0, ay0, ax1, ay1, dx, dy, bx, by)
    return TilePlan(matrices, regions, plan.output_size, specs)


def visible_tiles(plan: TilePlan) -> np.ndarray:
    """Which tiles cover at least one output pixel window (the others need not be decoded).

    Args:
        plan (TilePlan): the plan.

    Returns:
        ndarray[K] bool: False where the tile's region lands wholly outside the output.
    """
    return np.array([w is not None for w in plan.windows], dtype=bool)


def draw_batch_partners(rng: np.random.Generator, batch_size: int, num_partners: int = 3) -> np.ndarray:
    """Mosaic partners from within a batch: for each position, ``num_partners`` other positions.

    A random permutation ``p`` lays the batch on a circle and ``num_partners`` distinct random
    shifts ``s_j`` in ``1..B-1`` pick the partners of ``p[i]`` as ``p[i + s_j]``: every image is
    then a partner exactly ``num_partners`` times, never its own, and never twice in one mosaic
    when ``B > num_partners`` (smaller batches repeat shifts).

    Args:
        rng (numpy.random.Generator): the batch's generator.
        batch_size (int): B >= 2.
        num_partners (int): partners per sample.

    Returns:
        ndarray[B, num_partners] int64: batch positions.

    Raises:
        ValueError: ``batch_size < 2``.
    """
    if batch_size < 2:
        raise ValueError(f"batch_size must be >= 2 to draw partners from the batch, got {batch_size}")
    perm = rng.permutation(batch_size)
    replace = batch_size - 1 < num_partners
    shifts = 1 + rng.choice(batch_size - 1, size=num_partners, replace=replace)
    position = np.empty(batch_size, np.int64)
    position[perm] = np.arange(batch_size)
    return perm[(position[:, None] + shifts[None, :]) % batch_size]
