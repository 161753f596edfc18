"""Single-resample tile warps: each source image resampled once, straight into the output.

:func:`warp_tiles` resamples each source image once, straight into the output pixels whose
centres lie in the tile's region, instead of building the ``2s x 2s`` mosaic canvas and warping
it again (one resample, not two; a quarter of the work at ``s = 640``). A rotated or sheared tile
takes one ``cv2.warpAffine``; an axis-aligned one (the default recipe) takes one ``cv2.resize``
of an integer crop (see :func:`~seg_datamodule.transforms.kernels.plan.snap_for_resize`).

Only the OpenCV calls here use OpenCV's pixel-index convention; everything else in the package
uses continuous pixels (pixel ``k`` covers ``[k, k + 1)``).
"""

from __future__ import annotations

from typing import Sequence

import cv2
import numpy as np

from seg_datamodule.ops.affine import apply_affine, compose_affine, invert_affine, to_cv2_matrix
from seg_datamodule.ops.raster import rasterize_flat
from seg_datamodule.transforms.kernels.plan import TilePlan, region_corners

__all__ = ["FILL_VALUE", "warp_tiles"]

FILL_VALUE = 114
"""Grey that fills output pixels no tile covers (the YOLO convention)."""


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
    corners = apply_affine(region_corners(region), matrix) - (x0, y0)
    mask = rasterize_flat(
        corners, np.array([0, 4]), np.array([0, 1]), (y1 - y0, x1 - x0), stride=1
    )[0]
    return mask.view(np.uint8)


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
            :func:`~seg_datamodule.transforms.kernels.plan.visible_tiles` says is not visible.
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
