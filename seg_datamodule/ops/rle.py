"""Pure COCO run-length encoding helpers: the compressed-string codec, RLE checks, masks to rings.

pycocotools does the compressed codec itself; what is here is what it does not do safely or at
all: decoding a ``counts`` string in Python to check it before pycocotools reads it (its decoder
writes past its buffer when the runs do not sum to ``height * width``), encoding run lengths into
that string without its encoder's two overflows (below), checking an RLE object against its
image, and turning a mask into exact polygon rings.

pycocotools' string holds each number (a run, or from the fourth on its difference from the run
two before) in 5-bit characters, and its encoder (``rleToString``) allocates 6 characters a
number: a run of 2^29 or more takes a 7th (which its decoder also misreads), and when every
number takes all 6 the closing NUL lands one byte past the buffer. Either corrupts the heap and
can abort the process (``free(): invalid next size``, ``corrupted size vs. prev_size``; tested
in ``tests/ops/test_rle.py``). Below 2^24 pixels an image's numbers take at most 5 characters,
so pycocotools encodes its masks safely (:data:`RLE_SAFE_PIXELS`); beyond, the package encodes
run lengths itself (:func:`rle_string`) and refuses runs of :data:`RLE_MAX_RUN` or more.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import cv2
import numpy as np

__all__ = [
    "RLE_MAX_PIXELS", "RLE_MAX_RUN", "RLE_SAFE_PIXELS", "check_rle", "mask_to_rings", "polygon_rle_problem",
    "rle_counts_from_string", "rle_run_problem", "rle_string", "uncompressed_rle",
]

#: pycocotools keeps sizes and runs as C ``unsigned int``: ``height * width`` must be below this.
RLE_MAX_PIXELS = 2**32
#: Runs pycocotools' compressed strings hold: each number in at most 6 characters of 5 bits, signed.
RLE_MAX_RUN = 2**29
#: Below this many pixels every number of an image's RLE string takes at most 5 of the 6
#: characters pycocotools allocates for it, so its encoder cannot overflow on that image.
RLE_SAFE_PIXELS = 2**24


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


def rle_counts_from_string(counts: str | bytes) -> list[int]:
    """Decode pycocotools' compressed RLE string into run lengths (``rleFrString`` in Python).

    Needed to check a compressed RLE before handing it to pycocotools, whose decoder writes past
    its buffer when the runs do not sum to ``height * width``.

    Args:
        counts: the ``counts`` string of a compressed RLE.

    Returns:
        the run lengths, starting with a run of zeros.

    Raises:
        ValueError: a character outside the alphabet, or a number cut short.
    """
    data = counts.encode("ascii") if isinstance(counts, str) else bytes(counts)
    out: list[int] = []
    p, n = 0, len(data)
    while p < n:
        x, k, more = 0, 0, True
        while more:
            if p >= n:
                raise ValueError("compressed RLE string ends inside a number")
            c = data[p] - 48
            if not 0 <= c < 64:
                raise ValueError(f"compressed RLE string has an invalid character {chr(data[p])!r}")
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(out) > 2:
            x += out[-2]
        out.append(x)
    return out


def rle_string(counts: Sequence[int] | np.ndarray) -> bytes:
    """pycocotools' compressed RLE string of run lengths (``rleToString``), without its overflows.

    Byte for byte what pycocotools writes wherever it writes safely; also right where it would
    write past its buffer (every number 6 characters long). Runs of :data:`RLE_MAX_RUN` or more are
    encoded too, in 7 characters or more, which pycocotools' decoder misreads: check them first
    (:func:`rle_run_problem`).

    Args:
        counts (sequence of int | ndarray[M] int): run lengths, starting with a run of zeros.

    Returns:
        the ``counts`` string as bytes (ASCII 48-111).
    """
    runs = np.asarray(counts, np.int64).reshape(-1)
    numbers = runs.copy()
    numbers[3:] -= runs[1:-2]  # from the fourth on, the difference from the run two before
    # Characters per number: 5 bits each, two's complement, so the top bit of the last is the sign.
    limits = np.int64(1) << (5 * np.arange(1, 13, dtype=np.int64) - 1)
    length = 1 + ((numbers[:, None] >= limits) | (numbers[:, None] < -limits)).sum(axis=1)
    places = np.arange(int(length.max()) if length.size else 1, dtype=np.int64)
    digits = (numbers[:, None] >> (5 * places)) & 0x1F  # arithmetic shift: negatives stay negative
    digits |= (places < (length - 1)[:, None]) << 5  # "more follows" on all but a number's last
    return (digits[places < length[:, None]] + 48).astype(np.uint8).tobytes()


def rle_run_problem(counts: Sequence[int] | np.ndarray) -> str | None:
    """What makes run lengths impossible for pycocotools to hold as a string, or None.

    Args:
        counts (sequence of int | ndarray[M] int): run lengths.

    Returns:
        ``"a run of N pixels (pycocotools' RLE strings hold runs below 2^29)"``, or None.
    """
    runs = np.asarray(counts, np.int64).reshape(-1)
    longest = int(runs.max()) if runs.size else 0
    if longest >= RLE_MAX_RUN:
        return f"a run of {longest} pixels (pycocotools' RLE strings hold runs below 2^29)"
    return None


def polygon_rle_problem(rings: Sequence[np.ndarray], height: int, width: int) -> str | None:
    """Why pycocotools' own encoding of a polygon's mask (``frPyObjects`` on polygons, ``merge``)
    might write past its buffer on an image of ``height`` x ``width``, or None when it cannot.

    Its run lengths are not known before pycocotools computes them, so this bounds them:
    below :data:`RLE_SAFE_PIXELS` pixels nothing can overflow. On a larger image a run is at most
    ``height`` times the columns it spans (the columns left of the polygon's box, right of it, or
    within it), which must stay below :data:`RLE_MAX_RUN`; and every number takes all 6
    characters only when the first run of mask pixels is 2^24 or longer, which needs a mask
    that crosses from the bottom of one column to the top of the next, so a box that leaves the
    top or bottom row free (on an image under 2^24 rows) is safe. (An empty mask, one number,
    puts its NUL one byte into malloc's minimum chunk, past the 6 bytes asked for: harmless.)

    Args:
        rings: the polygon's rings, each ndarray[K, 2] of x, y (pixels).
        height: the image's height.
        width: the image's width.

    Returns:
        a phrase saying what is too large, or None.
    """
    if height * width < RLE_SAFE_PIXELS:
        return None
    xy = np.concatenate([np.asarray(r, np.float64).reshape(-1, 2) for r in rings])
    left = max(0, math.floor(float(xy[:, 0].min())))
    right = min(width, math.ceil(float(xy[:, 0].max())) + 1)
    columns = max(left + 1, width - right + 1, right - left + 2)
    if height * columns >= RLE_MAX_RUN:
        return (f"on this {height}x{width} (HxW) image its mask may hold a run of 2^29 pixels or more, "
                "which pycocotools' RLE strings cannot hold")
    if height >= RLE_SAFE_PIXELS or (xy[:, 1].min() < 1 and xy[:, 1].max() > height - 1):
        return (f"it spans the full height of this {height}x{width} (HxW) image of 2^24 pixels or more, where "
                "pycocotools' RLE encoder may write past its buffer")
    return None


def check_rle(seg: Mapping[str, Any], height: int, width: int) -> tuple[str, str] | None:
    """Check a COCO RLE object against its image before pycocotools reads it.

    Args:
        seg: the ``segmentation`` object, ``{"size": [H, W], "counts": list | str}``.
        height: the image's height from the JSON.
        width: the image's width from the JSON.

    Returns:
        None when valid, else ``(reason, detail)`` with reason ``"rle_invalid"`` (size not two
        ints, sizes pycocotools cannot hold, counts not non-negative ints summing to
        ``height * width``, a bad string, a run of :data:`RLE_MAX_RUN` or more) or
        ``"rle_size_mismatch"``.
    """
    size, counts = seg.get("size"), seg.get("counts")
    if not (isinstance(size, list) and len(size) == 2 and all(type(s) is int for s in size)):
        return "rle_invalid", f"RLE size must be [height, width] of ints, got {size!r}"
    if not (0 < size[0] < 2**31 and 0 < size[1] < 2**31 and size[0] * size[1] < RLE_MAX_PIXELS):
        return "rle_invalid", f"RLE size {size} is beyond pycocotools (height * width must be below 2^32)"
    if size != [height, width]:
        return "rle_size_mismatch", f"RLE size {size} but the image is {height}x{width} (HxW)"
    total = height * width
    if isinstance(counts, list):
        # type() rather than a dtype: numpy would turn True into 1 next to other ints.
        if counts and not set(map(type, counts)) <= {int}:
            return "rle_invalid", "RLE counts must be a list of non-negative integers"
        runs = np.asarray(counts, dtype=object if not counts else None)
        if counts and (runs.dtype.kind not in "iu" or (runs < 0).any()):
            return "rle_invalid", "RLE counts must be a list of non-negative integers"
        if sum(counts) != total:
            return "rle_invalid", f"RLE counts sum to {sum(counts)}, height * width is {total}"
        problem = rle_run_problem(counts)
        return None if problem is None else ("rle_invalid", f"RLE counts hold {problem}")
    if isinstance(counts, (str, bytes)):
        try:
            runs_list = rle_counts_from_string(counts)
        except ValueError as err:
            return "rle_invalid", str(err)
        if any(r < 0 for r in runs_list) or sum(runs_list) != total:
            return "rle_invalid", (
                f"compressed RLE runs sum to {sum(runs_list)} (or are negative), height * width is {total}"
            )
        problem = rle_run_problem(runs_list)
        return None if problem is None else ("rle_invalid", f"compressed RLE holds {problem}")
    return "rle_invalid", f"RLE counts must be a list or a string, got {type(counts).__name__}"


def _simplify_closed(points: np.ndarray) -> np.ndarray:
    """Drop repeated and collinear vertices of a closed axis-aligned outline."""
    keep = np.any(points != np.roll(points, 1, axis=0), axis=1)
    points = points[keep] if keep.any() else points[:1]
    prev, nxt = np.roll(points, 1, axis=0), np.roll(points, -1, axis=0)
    turn = (points[:, 0] - prev[:, 0]) * (nxt[:, 1] - points[:, 1]) - (points[:, 1] - prev[:, 1]) * (
        nxt[:, 0] - points[:, 0]
    )
    corners = turn != 0
    return points[corners] if corners.sum() >= 3 else points


def mask_to_rings(mask: np.ndarray) -> list[np.ndarray]:
    """Exact polygon rings of a binary mask, on pixel corners.

    Each 8-connected component becomes one ring: its outline along pixel edges, followed by each
    of its holes, joined to the outline's first vertex by a bridge edge that is walked there and
    back. Under the even-odd rule the bridge crosses every ray twice (no effect), so filling the
    ring at pixel centres, and taking the union over rings, gives back ``mask`` exactly.

    How: the mask is upsampled 2x, so OpenCV's border following (which lists boundary *pixels*)
    runs half a pixel inside the outline; mapping upsampled index ``p`` to ``(p + 1) // 2`` moves
    every boundary pixel onto the pixel corner it stands for.

    Args:
        mask (ndarray[H, W] bool): the mask.

    Returns:
        list of rings, each ndarray[K, 2] float64 of x, y on integer pixel corners; empty when
        the mask is.
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 2:
        raise ValueError(f"mask must be 2-D (H, W), got shape {mask.shape}")
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if rows.size == 0:
        return []
    y0, y1, x0, x1 = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
    crop = np.zeros((y1 - y0 + 2, x1 - x0 + 2), np.uint8)  # one pixel of background around
    crop[1:-1, 1:-1] = mask[y0:y1, x0:x1]
    upsampled = np.repeat(np.repeat(crop, 2, axis=0), 2, axis=1)
    contours, hierarchy = cv2.findContours(upsampled, cv2.RETR_CCOMP, cv2.CHAIN_APPROX_NONE)
    shift = np.array([x0 - 1, y0 - 1], np.int64)
    outlines = [_simplify_closed((c[:, 0, :].astype(np.int64) + 1) // 2 + shift) for c in contours]
    links = hierarchy[0]  # [next, previous, first_child, parent]; holes are children of outers
    rings = []
    for k, (_, _, child, parent) in enumerate(links):
        if parent != -1:
            continue
        start = outlines[k][:1]
        parts = [outlines[k], start]
        while child != -1:
            if len(parts) > 2:
                parts.append(start)
            parts += [outlines[child], outlines[child][:1]]
            child = links[child][0]
        rings.append(np.concatenate(parts).astype(np.float64))
    return rings
