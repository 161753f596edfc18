"""Pure mosaic and letterbox placement, single-resample warps, and polygon transport.

A *tile plan* says, for each source image (one for a letterbox, four for a mosaic), the affine
that maps its original pixels straight to the output canvas and the rectangle of the original
image that shows (its *region*). Pixels and polygons both go through exactly these matrices:

* :func:`warp_tiles` resamples each source image once, straight into the output pixels whose
  centres lie in the tile's region, instead of building the ``2s x 2s`` mosaic canvas and
  warping it again (one resample, not two; a quarter of the work at ``s = 640``). A rotated or
  sheared tile takes one ``cv2.warpAffine``; an axis-aligned one (the default recipe) takes one
  ``cv2.resize`` of an integer crop, five times cheaper for the same bilinear resample, once
  :func:`snap_for_resize` has nudged its matrix (scale by ~1e-4 typically) to one that
  ``cv2.resize`` realises exactly.
* :func:`transform_polygons` clips each tile's polygons to its region, maps them, and clips them
  to the output canvas, with the exact rectangle clip of :mod:`seg_datamodule.geometry`.

Coordinates are continuous pixels (pixel ``k`` covers ``[k, k + 1)``) throughout; only the
OpenCV calls in :func:`warp_tiles` use OpenCV's pixel-index convention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import cv2
import numpy as np

from seg_datamodule.geometry import (
    affine_scale,
    apply_affine,
    clip_polygons,
    compose_affine,
    concat_polygons,
    instance_areas,
    invert_affine,
    polygon_boxes,
    to_cv2_matrix,
)
from seg_datamodule.raster import rasterize_flat

__all__ = [
    "DROP_REASONS",
    "FILL_VALUE",
    "TilePlan",
    "choose_reduce",
    "drop_reasons",
    "letterbox_layout",
    "mosaic_layout",
    "snap_for_resize",
    "transform_polygons",
    "visible_tiles",
    "warp_tiles",
]

FILL_VALUE = 114
"""Grey that fills output pixels no tile covers (the YOLO convention)."""

DROP_REASONS: tuple[str, ...] = ("kept", "degenerate", "outside", "clipped", "small_box")
"""Codes returned by :func:`drop_reasons`: index 0 keeps the instance, the others name why not."""


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


def _region_corners(region: np.ndarray) -> np.ndarray:
    x0, y0, x1, y1 = region
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float64)


def _pixel_window(
    matrix: np.ndarray, region: np.ndarray, output_size: tuple[int, int]
) -> tuple[int, int, int, int] | None:
    """Output pixel window (x0, y0, x1, y1), half-open, that holds the tile, or None if empty."""
    if region[2] <= region[0] or region[3] <= region[1]:
        return None
    corners = apply_affine(_region_corners(region), matrix)
    lo = np.floor(corners.min(axis=0) - 0.5)
    hi = np.ceil(corners.max(axis=0) + 0.5)
    x0, y0 = max(int(lo[0]), 0), max(int(lo[1]), 0)
    x1, y1 = min(int(hi[0]), output_size[1]), min(int(hi[1]), output_size[0])
    if x1 <= x0 or y1 <= y0:
        return None
    return x0, y0, x1, y1


def _covered_pixels(
    matrix: np.ndarray, region: np.ndarray, window: tuple[int, int, int, int]
) -> tuple[slice, slice] | np.ndarray:
    """Which output pixel centres in ``window`` the tile covers.

    Returns a (row slice, column slice) pair relative to the window when the tile is axis aligned
    (the covered set is then a rectangle: centres mapping into the half-open region), else a
    ``uint8`` mask over the window: the region's image (a parallelogram) rasterised with the
    package rasteriser, so tile boundaries follow the same rule as the instance masks.
    """
    x0, y0, x1, y1 = window
    if matrix[0, 1] == 0.0 and matrix[1, 0] == 0.0:
        inverse = invert_affine(matrix)
        u = inverse[0, 0] * (np.arange(x0, x1, dtype=np.float64) + 0.5) + inverse[0, 2]
        v = inverse[1, 1] * (np.arange(y0, y1, dtype=np.float64) + 0.5) + inverse[1, 2]
        cols = np.flatnonzero((u >= region[0]) & (u < region[2]))
        rows = np.flatnonzero((v >= region[1]) & (v < region[3]))
        if len(cols) == 0 or len(rows) == 0:
            return slice(0, 0), slice(0, 0)
        return slice(int(rows[0]), int(rows[-1]) + 1), slice(int(cols[0]), int(cols[-1]) + 1)
    corners = apply_affine(_region_corners(region), matrix) - (x0, y0)
    mask = rasterize_flat(
        corners, np.array([0, 4]), np.array([0, 1]), (y1 - y0, x1 - x0), stride=1
    )[0]
    return mask.view(np.uint8)


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


def _resize_tile(
    image: np.ndarray,
    spec: np.ndarray,
    rows: slice,
    cols: slice,
    window: tuple[int, int, int, int],
    out: np.ndarray,
    interpolation: int,
) -> bool:
    """Render a tile with ``cv2.resize`` per its spec; False when the spec cannot cover it."""
    ax0, ay0, ax1, ay1, dx, dy, bx, by = (int(v) for v in spec)
    wx0, wy0 = window[0], window[1]
    # Owned pixels in resized-crop coordinates.
    c0, c1 = wx0 + cols.start - bx, wx0 + cols.stop - bx
    r0, r1 = wy0 + rows.start - by, wy0 + rows.stop - by
    if c0 < 0 or r0 < 0 or c1 > dx or r1 > dy:
        return False
    h, w = image.shape[:2]
    # Bilinear neighbours of the owned pixels must lie in the crop, unless the crop's edge is the
    # image's edge (then resize's edge replication is what warpAffine's BORDER_REPLICATE does).
    kx, ky = (ax1 - ax0) / dx, (ay1 - ay0) / dy
    if ax0 > 0 and np.floor((c0 + 0.5) * kx - 0.5) < 0:
        return False
    if ax1 < w and np.floor((c1 - 0.5) * kx - 0.5) + 1 > ax1 - ax0 - 1:
        return False
    if ay0 > 0 and np.floor((r0 + 0.5) * ky - 0.5) < 0:
        return False
    if ay1 < h and np.floor((r1 - 0.5) * ky - 0.5) + 1 > ay1 - ay0 - 1:
        return False
    dst = out[wy0 + rows.start : wy0 + rows.stop, wx0 + cols.start : wx0 + cols.stop]
    crop = image[ay0:ay1, ax0:ax1]
    if interpolation == cv2.INTER_NEAREST:
        # resize's INTER_NEAREST samples at x * scale (a half-pixel shift); _EXACT samples at
        # pixel centres, as warpAffine's nearest does.
        interpolation = cv2.INTER_NEAREST_EXACT
    if (c0, r0, c1, r1) == (0, 0, dx, dy):
        res = cv2.resize(crop, (dx, dy), dst=dst, interpolation=interpolation)
        if not np.shares_memory(res, dst):
            dst[...] = res
    else:
        dst[...] = cv2.resize(crop, (dx, dy), interpolation=interpolation)[r0:r1, c0:c1]
    return True


def visible_tiles(plan: TilePlan) -> np.ndarray:
    """Which tiles cover at least one output pixel window (the others need not be decoded).

    Args:
        plan (TilePlan): the plan.

    Returns:
        ndarray[K] bool: False where the tile's region lands wholly outside the output.
    """
    return np.array([w is not None for w in plan.windows], dtype=bool)


def warp_tiles(
    images: Sequence[np.ndarray | None],
    plan: TilePlan,
    reduces: Sequence[int] | None = None,
    fill: int = FILL_VALUE,
    interpolation: int = cv2.INTER_LINEAR,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Resample each source image once, straight into the output canvas.

    Output pixel ``(i, j)`` takes tile ``k``'s pixels when its centre ``(j + 0.5, i + 0.5)`` lies
    in the tile's region mapped to the output (half-open, the rasteriser's rule, so tiles meet
    without gaps or overlaps and agree with the clipped polygons); it keeps ``fill`` where no tile
    covers it.
    Sampling near a region edge replicates the image's edge pixels rather than blending in grey.

    Args:
        images (Sequence[ndarray[h, w, C] | ndarray[h, w] | None]): one per tile, decoded at
            ``reduces[k]`` (pixel ``k`` of a reduced image covers original pixels
            ``[k r, (k + 1) r)``, as libjpeg's DCT scaling gives); ``None`` for a tile that
            :func:`visible_tiles` says is not visible.
        plan (TilePlan): matrices and regions in original pixels.
        reduces (Sequence[int] | None): decode reduction per tile; ``None`` means all 1.
        fill (int): value of uncovered pixels.
        interpolation (int): ``cv2.INTER_LINEAR`` for images, ``cv2.INTER_NEAREST`` for masks.
        out (ndarray | None): canvas to draw into (its current content is kept where no tile
            covers it); ``None`` allocates one filled with ``fill``, shaped like the images.

    Returns:
        ndarray[H, W, C] | ndarray[H, W]: the canvas, same dtype as the images.

    Raises:
        ValueError: lengths of ``images``, ``plan`` and ``reduces`` differ, or a visible tile has
            no image.
    """
    # 1. Check arguments and allocate the canvas.
    if len(images) != len(plan):
        raise ValueError(f"images has {len(images)} entries but the plan has {len(plan)} tiles")
    if reduces is None:
        reduces = [1] * len(plan)
    if len(reduces) != len(plan):
        raise ValueError(f"reduces has {len(reduces)} entries but the plan has {len(plan)} tiles")
    h_out, w_out = plan.output_size
    if out is None:
        first = next((im for im in images if im is not None), None)
        if first is None:
            raise ValueError("warp_tiles needs at least one image to know the channels and dtype")
        out = np.full((h_out, w_out, *first.shape[2:]), fill, dtype=first.dtype)
    for k, (image, matrix, region, reduce, window) in enumerate(
        zip(images, plan.matrices, plan.regions, reduces, plan.windows)
    ):
        # 2. The output window the tile can touch; skip tiles that land outside the canvas.
        if window is None:
            continue
        if image is None:
            raise ValueError(f"tile {k} is visible but its image is None")
        inside = _covered_pixels(matrix, region, window)
        wx0, wy0, _, _ = window
        if isinstance(inside, tuple):
            # 3a. Axis-aligned: the covered pixels form a rectangle; resize (when the plan says
            # how, and the image is not a reduced decode) or warp straight into it.
            rows, cols = inside
            if rows.stop <= rows.start or cols.stop <= cols.start:
                continue
            spec = None if plan.resize is None else plan.resize[k]
            if spec is not None and spec[0] >= 0 and reduce == 1:
                if _resize_tile(image, spec, rows, cols, window, out, interpolation):
                    continue
        # 4. Source pixels (reduced decode) -> window pixels, as one matrix.
        src_to_window = compose_affine(
            np.array([[1.0, 0.0, -wx0], [0.0, 1.0, -wy0]]),
            matrix,
            np.array([[float(reduce), 0.0, 0.0], [0.0, float(reduce), 0.0]]),
        )
        if isinstance(inside, tuple):
            # 5a. Axis-aligned warp into the covered rectangle.
            sub = compose_affine(
                np.array([[1.0, 0.0, -cols.start], [0.0, 1.0, -rows.start]]), src_to_window
            )
            dst = out[wy0 + rows.start : wy0 + rows.stop, wx0 + cols.start : wx0 + cols.stop]
            res = cv2.warpAffine(
                image,
                to_cv2_matrix(invert_affine(sub)),
                (dst.shape[1], dst.shape[0]),
                dst=dst,
                flags=interpolation | cv2.WARP_INVERSE_MAP,
                borderMode=cv2.BORDER_REPLICATE,
            )
            if not np.shares_memory(res, dst):  # OpenCV reallocated; copy back.
                dst[...] = res
        else:
            # 5b. Rotated or sheared: warp the bounding window, then copy the covered pixels.
            if not inside.any():
                continue
            wx0, wy0, wx1, wy1 = window
            res = cv2.warpAffine(
                image,
                to_cv2_matrix(invert_affine(src_to_window)),
                (wx1 - wx0, wy1 - wy0),
                flags=interpolation | cv2.WARP_INVERSE_MAP,
                borderMode=cv2.BORDER_REPLICATE,
            )
            dst = out[wy0:wy1, wx0:wx1]
            # cv2.copyTo writes through the view and is ~50x faster than np.copyto(where=...).
            res = cv2.copyTo(res, inside, dst)
            if not np.shares_memory(res, dst):
                dst[...] = res
    return out


def transform_polygons(
    polygons: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    plan: TilePlan,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Clip each tile's polygons to its region, map them to the output, clip to the output canvas.

    Args:
        polygons (Sequence[tuple]): per tile, ``(vertices (float64[V, 2]), ring_offsets
            (int64[R + 1]), instance_offsets (int64[N + 1]))`` in original image pixels.
        plan (TilePlan): the matrices and regions the pixels went through.

    Returns:
        vertices (float64[V', 2]), ring_offsets (int64[R' + 1]), instance_offsets (int64[N + 1]):
            all tiles' instances in tile order, in output pixels; an instance clipped away keeps
            its slot with no rings.
        area_before (float64[N]): each instance's area mapped to the output, before any clip.
        area_after (float64[N]): its area after both clips.

    Raises:
        ValueError: ``polygons`` and ``plan`` differ in length.
    """
    # 1. Concatenate the tiles, remembering each ring's tile.
    if len(polygons) != len(plan):
        raise ValueError(f"polygons has {len(polygons)} tiles but the plan has {len(plan)}")
    vertices, ring_offsets, instance_offsets = concat_polygons(list(polygons))
    inst_tile = np.repeat(
        np.arange(len(plan), dtype=np.int64), [len(io) - 1 for _, _, io in polygons]
    )
    dets = np.abs(np.linalg.det(plan.matrices[:, :, :2])) if len(plan) else np.zeros(0)
    area_before = instance_areas(vertices, ring_offsets, instance_offsets) * dets[inst_tile]
    ring_tile = np.repeat(inst_tile, np.diff(instance_offsets))

    lin = plan.matrices[:, :, :2]
    axis_aligned = bool(
        (lin[:, 0, 1] == 0).all() and (lin[:, 1, 0] == 0).all() and (lin[:, 0, 0] > 0).all()
        and (lin[:, 1, 1] > 0).all()
    )
    h, w = plan.output_size
    if axis_aligned:
        # 2a. Scale + translation per tile: map first, then one clip per ring against its tile's
        # region mapped to the output, cut to the canvas (the same set as 2b's two clips).
        diag, shift = lin[:, [0, 1], [0, 1]], plan.matrices[:, :, 2]
        vert_tile = np.repeat(ring_tile, np.diff(ring_offsets))
        if len(vertices):
            vertices = vertices * diag[vert_tile] + shift[vert_tile]
        mapped = plan.regions * np.tile(diag, 2) + np.tile(shift, 2)
        rects = np.concatenate([np.maximum(mapped[:, :2], 0.0), np.minimum(mapped[:, 2:], (w, h))], axis=1)
        rects[:, 2:] = np.maximum(rects[:, 2:], rects[:, :2])  # an empty rectangle stays valid
        vertices, ring_offsets, instance_offsets = clip_polygons(
            vertices, ring_offsets, instance_offsets, rects[ring_tile]
        )
    else:
        # 2b. Clip to each tile's region in its own pixels (axis aligned there, whatever the
        # affine), map every vertex through its tile's matrix, clip to the output canvas.
        vertices, ring_offsets, instance_offsets = clip_polygons(
            vertices, ring_offsets, instance_offsets, plan.regions[ring_tile]
        )
        ring_tile = np.repeat(inst_tile, np.diff(instance_offsets))
        vert_tile = np.repeat(ring_tile, np.diff(ring_offsets))
        if len(vertices):
            m = plan.matrices[vert_tile]
            vertices = np.einsum("vij,vj->vi", m[:, :, :2], vertices) + m[:, :, 2]
        vertices, ring_offsets, instance_offsets = clip_polygons(
            vertices, ring_offsets, instance_offsets, (0.0, 0.0, float(w), float(h))
        )
    area_after = instance_areas(vertices, ring_offsets, instance_offsets)
    return vertices, ring_offsets, instance_offsets, area_before, area_after


def drop_reasons(
    vertices: np.ndarray,
    ring_offsets: np.ndarray,
    instance_offsets: np.ndarray,
    area_before: np.ndarray,
    area_after: np.ndarray,
    min_area_ratio: float,
    min_box_size: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Decide which instances to keep after clipping, and why the others go.

    Reasons, in the order they are tested (codes index :data:`DROP_REASONS`):
    ``degenerate`` (no area before clipping), ``outside`` (nothing left after clipping),
    ``clipped`` (``area_after < min_area_ratio * area_before``), ``small_box`` (box narrower or
    lower than ``min_box_size``).

    Args:
        vertices (ndarray[V, 2] float64): clipped vertices in output pixels.
        ring_offsets (ndarray[R + 1] int64): ring boundaries.
        instance_offsets (ndarray[N + 1] int64): instance boundaries.
        area_before (ndarray[N] float64): areas before clipping (same pixels).
        area_after (ndarray[N] float64): areas after clipping.
        min_area_ratio (float): smallest kept fraction of an instance's area.
        min_box_size (float): smallest kept box width and height in pixels.

    Returns:
        codes (ndarray[N] int64): 0 to keep, else the index of the reason in :data:`DROP_REASONS`.
        boxes (ndarray[N, 4] float64): xyxy boxes of the clipped polygons.
    """
    boxes = polygon_boxes(vertices, ring_offsets, instance_offsets)
    n = len(area_before)
    codes = np.zeros(n, np.int64)
    wh = boxes[:, 2:] - boxes[:, :2]
    small = (wh < min_box_size).any(axis=1)
    clipped = area_after < min_area_ratio * area_before
    outside = (area_after <= 0) | (np.diff(instance_offsets) == 0)
    degenerate = ~(area_before > 0)
    # Later assignments win, so assign in reverse order of precedence.
    codes[small] = DROP_REASONS.index("small_box")
    codes[clipped] = DROP_REASONS.index("clipped")
    codes[outside] = DROP_REASONS.index("outside")
    codes[degenerate] = DROP_REASONS.index("degenerate")
    return codes, boxes
