"""Pure COCO run-length encoding helpers (pycocotools does the compressed codec itself)."""

from __future__ import annotations

import numpy as np

__all__ = ["uncompressed_rle"]


def uncompressed_rle(mask: np.ndarray) -> dict[str, list[int]]:
    """COCO's uncompressed RLE of a mask, as crowd annotations store it.

    Column-major run lengths, starting with a (possibly empty) run of zeros, which is what
    ``pycocotools.mask.frPyObjects`` reads back.

    Args:
        mask (ndarray[H, W] bool): the region.

    Returns:
        ``{"counts": [int, ...], "size": [H, W]}``.
    """
    h, w = mask.shape
    flat = np.asarray(mask, bool).ravel(order="F")
    change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat.size and flat[0]:
        counts = [0] + counts
    return {"counts": [int(c) for c in counts], "size": [int(h), int(w)]}
