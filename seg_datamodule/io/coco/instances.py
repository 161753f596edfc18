"""Check one chunk of annotations' numbers and turn them into arrays: polygons, crowd RLE.

Crowd regions (``iscrowd=1``) are never training targets: each is kept as compressed RLE bytes
(a crowd polygon is converted to RLE here with ``pycocotools.mask``), decoded on demand by
:meth:`~seg_datamodule.io.coco.index.CocoIndex.crowd_mask`.

Non-crowd RLE instances are converted to polygons by :func:`~seg_datamodule.ops.rle.mask_to_rings`:
the exact pixel-edge outline of the mask. Filling those rings at pixel centres, as the
rasteriser does, reproduces the RLE mask bit for bit at the original resolution. Chosen over
carrying bitmaps because everything downstream (mosaic, affine augmentation, clipping, the
windowed rasteriser and the ``Sample`` format) speaks polygons only: one code path, exact masks,
and no full-image bitmap per instance in memory. The cost is paid once, at build, and cached.

Target polygons are checked vectorised over a whole chunk (non-numbers, bounding boxes,
non-finite coordinates, zero area) and stored as int32 hundredths when that is exact (COCO's
2-decimal coordinates: half the bytes of float64).
"""

from __future__ import annotations

import math
from array import array
from typing import Any, Callable, NamedTuple

import numpy as np
from pycocotools import mask as mask_utils

from seg_datamodule.ops.geometry import instance_areas, select_instances, zero_area_instances
from seg_datamodule.ops.ragged import offsets_from_lengths
from seg_datamodule.ops.raster import rasterize_flat
from seg_datamodule.ops.rle import check_rle, mask_to_rings, polygon_rle_problem, rle_string

__all__ = [
    "OUT_OF_BOUNDS_FACTOR", "VERTEX_SCALE", "ZERO_AREA_RTOL", "ChunkRows", "CrowdRegion", "check_bbox", "check_crowd",
    "covers_pixels", "finish_chunk", "rle_rings",
]

VERTEX_SCALE = 100  # COCO has 2 decimals: int32 hundredths store them exactly in half the bytes
ZERO_AREA_RTOL = 1e-12  # |twice area| within this fraction of the shoelace terms is zero (rounding)
#: A coordinate more than this many image widths (heights) beyond the image's edges is not a
#: typo of a real outline but garbage; it also keeps every later product of coordinates finite.
OUT_OF_BOUNDS_FACTOR = 100
#: pycocotools' frPoly walks every crowd polygon edge in 1/5 pixel steps and allocates ~24 bytes
#: a step: this many steps (~400 MB) is the most a crowd polygon may cost.
_MAX_CROWD_POLYGON_STEPS = 2**24
_MAX_COVER_CELLS = 2**22  # cells rasterised to decide whether a zero-area polygon covers a pixel

#: ``bad(pos, reason, detail, annotation_id, image_id, image_index)``: report a bad annotation.
Reporter = Callable[[int, str, str, Any, Any, "int | None"], None]


class ChunkRows(NamedTuple):
    """What the scan of a chunk packed for its target instances, for :func:`finish_chunk`.

    Attributes:
        rows: 6 ints per instance: position in the annotation list, image index, label,
            annotation id, number of rings, index of its first coordinate in ``coords``.
        boxes: 4 numbers per instance, NaN where the JSON's bbox is not 4 numbers.
        areas: the JSON's area per instance, NaN where missing.
        ring_lens: vertices per ring.
        coords: the coordinates of every ring, flat (placeholders where not numbers).
        non_numbers: the instances whose polygon holds something other than numbers.
    """

    rows: list[int]
    boxes: array
    areas: list[float]
    ring_lens: list[int]
    coords: array
    non_numbers: list[int]


class CrowdRegion(NamedTuple):
    """One checked crowd annotation: image index, label, annotation id, bbox, area, compressed RLE counts."""

    img: int
    label: int
    id: int
    bbox: Any
    area: float
    rle: bytes


def _out_of_bounds(vertices: np.ndarray, height: np.ndarray | int, width: np.ndarray | int) -> np.ndarray:
    """Per vertex: more than :data:`OUT_OF_BOUNDS_FACTOR` image sizes beyond the image (NaN: False)."""
    x, y, f = vertices[:, 0], vertices[:, 1], OUT_OF_BOUNDS_FACTOR
    return (x < -f * width) | (x > (f + 1) * width) | (y < -f * height) | (y > (f + 1) * height)


def _crowd_polygon_rle(seg: list[Any], height: int, width: int) -> tuple[bytes | None, tuple[str, str] | None]:
    """Check a crowd polygon ring by ring and turn it into compressed RLE with pycocotools.

    Returns:
        (compressed counts, None), or (None, (reason, detail)).
    """
    if not seg or all(isinstance(r, (list, array)) and not r for r in seg):
        return None, ("segmentation_empty", "segmentation has no polygon coordinates")
    rings = []
    for k, ring in enumerate(seg):
        if not isinstance(ring, (list, array)):
            return None, ("segmentation_invalid", f"polygon ring {k} is a {type(ring).__name__}, not a list")
        if len(ring) % 2:
            return None, ("polygon_odd_coordinates", f"polygon ring {k} has an odd number of coordinates ({len(ring)})")
        if len(ring) < 6:
            return None, ("polygon_too_few_points", f"polygon ring {k} has {len(ring) // 2} points; at least 3 are needed")
        if type(ring) is list and not all(type(c) is float or type(c) is int for c in ring):  # True: no number
            return None, ("segmentation_invalid", f"polygon ring {k} holds something other than numbers")
        xy = np.asarray(ring, np.float64).reshape(-1, 2)
        if not np.isfinite(xy).all():
            return None, ("polygon_non_finite", f"polygon ring {k} has a NaN or infinite coordinate")
        if _out_of_bounds(xy, height, width).any():
            return None, ("polygon_out_of_bounds", (
                f"polygon ring {k} has a coordinate more than {OUT_OF_BOUNDS_FACTOR} image sizes "
                f"outside the {height}x{width} (HxW) image"
            ))
        rings.append(xy)
    vertices = np.concatenate(rings)
    ring_offsets = offsets_from_lengths([len(r) for r in rings])
    instance_offsets = np.array([0, len(rings)])
    if zero_area_instances(vertices, ring_offsets, instance_offsets, ZERO_AREA_RTOL)[0]:
        return None, ("zero_area", "polygon has zero area")
    # pycocotools walks the outline in 1/5 px steps, in C ints: refuse what would cost too much
    # memory, or overflow an int (possible within the bound above on a very wide image).
    nxt = np.arange(1, len(vertices) + 1)
    nxt[ring_offsets[1:] - 1] = ring_offsets[:-1]
    steps = 5 * float(np.abs(vertices[nxt] - vertices).max(axis=1).sum()) + len(vertices)
    if steps > _MAX_CROWD_POLYGON_STEPS or np.abs(vertices).max() * 5 >= 2**31:
        return None, ("polygon_too_long", f"crowd polygon outline is {steps / 5:.0f} px long")
    # Its RLE is pycocotools' to encode (rings, then their union): only where that cannot overflow.
    problem = polygon_rle_problem(rings, height, width)
    if problem is not None:
        return None, ("polygon_too_long", f"crowd polygon cannot be turned into RLE safely: {problem}")
    rles = mask_utils.frPyObjects([list(r) for r in seg], height, width)  # the JSON's numbers, as COCO() reads them
    return mask_utils.merge(rles, intersect=0)["counts"], None


def check_bbox(bbox: Any) -> tuple[str, str] | None:
    """The bbox checks of the vectorised pass, for one (crowd or box-only) annotation: (reason, detail) or None."""
    shown = bbox.tolist() if isinstance(bbox, array) else bbox
    if type(bbox) is array and len(bbox) == 4:  # packed by the parser: 4 numbers
        pass
    elif not (isinstance(bbox, list) and len(bbox) == 4 and all(type(v) is int or type(v) is float for v in bbox)):
        return "bbox_invalid", f"bbox must be 4 numbers [x, y, width, height], got {shown!r}"
    if not all(math.isfinite(v) for v in bbox):
        return "bbox_invalid", f"bbox has a NaN or infinite value: {shown!r}"
    if bbox[2] <= 0 or bbox[3] <= 0:
        return "bbox_non_positive", f"bbox width and height must be positive, got {shown!r}"
    return None


def _compressed_rle(seg: dict[str, Any], height: int, width: int) -> tuple[bytes | None, tuple[str, str] | None]:
    """A checked RLE object as pycocotools' compressed counts, or (None, (reason, detail))."""
    problem = check_rle(seg, height, width)
    if problem is not None:
        return None, problem
    counts = seg["counts"]
    if isinstance(counts, list):  # pycocotools' frPyObjects, without its encoder's overflows
        return rle_string(counts), None
    return (counts.encode("ascii") if isinstance(counts, str) else bytes(counts)), None


def rle_rings(seg: dict[str, Any], height: int, width: int) -> tuple[list[np.ndarray], float] | tuple[str, str]:
    """A non-crowd RLE target as exact polygon rings and its pixel count, or (reason, detail)."""
    compressed, problem = _compressed_rle(seg, height, width)
    if problem is not None:
        return problem
    mask = mask_utils.decode({"size": [height, width], "counts": compressed})
    rings = mask_to_rings(mask)
    if not rings:
        return "zero_area", "RLE mask is empty"
    return rings, float(mask.sum())


def check_crowd(
    seg: Any, bbox: Any, area: float, height: int, width: int
) -> tuple[bytes, float] | tuple[str, str]:
    """Check one crowd annotation of an image of ``height`` x ``width``.

    Returns:
        (compressed RLE counts, area: the JSON's, or the mask's where missing), or (reason, detail).
    """
    problem = check_bbox(bbox)
    compressed = None
    if problem is None:
        if isinstance(seg, dict):
            compressed, problem = _compressed_rle(seg, height, width)
        elif isinstance(seg, list):
            compressed, problem = _crowd_polygon_rle(seg, height, width)
        elif seg is None or seg == "":
            problem = ("segmentation_empty", "segmentation is missing")
        else:
            problem = ("segmentation_invalid", f"segmentation is a {type(seg).__name__}, not polygons or RLE")
    if problem is None:
        rle = {"size": [height, width], "counts": compressed}
        mask_area = int(mask_utils.area(rle))
        if mask_area == 0:
            problem = ("zero_area", "crowd region covers no pixel")
        elif area != area:
            area = float(mask_area)
    if problem is not None:
        return problem
    return compressed, area


def finish_chunk(
    anns: list[Any], packed: ChunkRows, image_sizes: np.ndarray, bad: Reporter
) -> dict[str, np.ndarray] | None:
    """Vectorised checks of a chunk's target instances; drop and report the bad ones.

    Args:
        anns: the JSON's annotation list (for the image id of a bad one).
        packed: the chunk's target instances as the scan packed them.
        image_sizes (ndarray[I, 2] int64): (H, W) of every image.
        bad: called for each instance found bad.

    Returns:
        the chunk's good instances as arrays (``pos``, ``img``, ``labels``, ``annotation_ids``,
        ``bboxes``, ``areas``, ``nrings``, ``ring_lens``, ``vertices``), or None if none is good.
    """
    rows, boxes, areas, ring_lens, coords, non_numbers = packed
    table = np.array(rows, np.int64).reshape(-1, 6)
    pos, img, labels, ids, nrings, first = table.T
    n = len(table)
    reason = np.zeros(n, np.int8)  # 0 ok, else 1 + index into _VECTOR_REASONS
    rlens = np.asarray(ring_lens, np.int64)

    # The parser packed the numbers (parse.py); what was not numbers is marked first.
    flat = np.frombuffer(coords, np.float64) if len(coords) else np.zeros(0)
    box = np.frombuffer(boxes, np.float64).reshape(n, 4)
    reason[non_numbers] = _VECTOR_REASONS.index("segmentation_invalid") + 1
    finite_box = np.isfinite(box).all(axis=1)
    _mark(reason, ~finite_box, "bbox_invalid")
    _mark(reason, finite_box & ((box[:, 2] <= 0) | (box[:, 3] <= 0)), "bbox_non_positive")

    # Polygons: non-finite coordinates, then zero area (shoelace, summed over rings).
    vertices = flat.reshape(-1, 2)
    ring_offsets, instance_offsets = offsets_from_lengths(rlens), offsets_from_lengths(nrings)
    ann_non_finite = np.zeros(n, bool)
    if not np.isfinite(flat).all():
        bad_vertex = ~np.isfinite(vertices).all(axis=1)
        ring_bad = np.logical_or.reduceat(bad_vertex, ring_offsets[:-1])
        ann_non_finite = np.logical_or.reduceat(ring_bad, instance_offsets[:-1])
        _mark(reason, ann_non_finite, "polygon_non_finite")
    # Far outside the image: garbage, and the products below must stay finite.
    vertex_image = np.repeat(img, np.diff(ring_offsets[instance_offsets]))
    far = _out_of_bounds(vertices, image_sizes[vertex_image, 0], image_sizes[vertex_image, 1])
    if far.any():
        ring_far = np.logical_or.reduceat(far, ring_offsets[:-1])
        _mark(reason, np.logical_or.reduceat(ring_far, instance_offsets[:-1]), "polygon_out_of_bounds")
    with np.errstate(invalid="ignore", over="ignore"):
        zero = zero_area_instances(vertices, ring_offsets, instance_offsets, ZERO_AREA_RTOL)
    for k in np.flatnonzero(zero & (reason == 0)):
        r0, r1 = instance_offsets[k], instance_offsets[k + 1]
        v0, v1 = ring_offsets[r0], ring_offsets[r1]
        # Net shoelace area 0 is also a bow-tie whose lobes cancel: only drop what covers no pixel.
        if not covers_pixels(vertices[v0:v1], ring_offsets[r0 : r1 + 1] - v0, image_sizes[img[k]]):
            _mark(reason, np.arange(n) == k, "zero_area")

    area = np.asarray(areas, np.float64)
    missing_area = ~np.isfinite(area)
    if missing_area.any():  # COCO files have areas: the shoelace only where one is missing
        with np.errstate(invalid="ignore", over="ignore"):
            area[missing_area] = instance_areas(
                *select_instances(vertices, ring_offsets, instance_offsets, missing_area)
            )

    for k in np.flatnonzero(reason):
        key = _VECTOR_REASONS[reason[k] - 1]
        detail = _vector_detail(key, anns[pos[k]].get("bbox"))
        bad(int(pos[k]), key, detail, int(ids[k]), anns[pos[k]].get("image_id"), int(img[k]))
    keep = reason == 0
    if not keep.any():
        return None
    if not keep.all():
        ring_keep = np.repeat(keep, nrings)
        vertices = vertices[np.repeat(ring_keep, rlens)]
        rlens = rlens[ring_keep]
    # Hundredths as int32 when that is exact (COCO's 2-decimal coordinates): half of float64.
    scaled = np.rint(vertices * VERTEX_SCALE)
    if np.all(np.abs(scaled) < 2**31 - 1) and np.array_equal(scaled / VERTEX_SCALE, vertices):
        stored = scaled.astype(np.int32)
    else:
        stored = np.ascontiguousarray(vertices)
    return {
        "pos": pos[keep],
        "img": img[keep],
        "labels": labels[keep],
        "annotation_ids": ids[keep],
        "bboxes": box[keep],
        "areas": area[keep],
        "nrings": nrings[keep],
        "ring_lens": rlens,
        "vertices": stored,
    }


def covers_pixels(vertices: np.ndarray, ring_offsets: np.ndarray, image_size: np.ndarray) -> bool:
    """Whether the rings' even-odd region holds a pixel centre of the image (one instance).

    Rasterised over the polygon's box within the image, at stride 1 while that box has at most
    :data:`_MAX_COVER_CELLS` pixels, coarser beyond (a hostile polygon may span a huge image).
    """
    if not np.isfinite(vertices).all():
        return False
    low = np.maximum(np.floor(vertices.min(axis=0)), 0)
    high = np.minimum(np.ceil(vertices.max(axis=0)), image_size[::-1])  # x, y
    if (high <= low).any():
        return False
    width, height = (high - low).astype(np.int64)
    stride = max(1, math.ceil(math.sqrt(width * height / _MAX_COVER_CELLS)))
    mask = rasterize_flat(vertices - low, ring_offsets, np.array([0, len(ring_offsets) - 1]),
                          (int(height), int(width)), stride)
    return bool(mask.any())


_VECTOR_REASONS = (
    "segmentation_invalid", "bbox_invalid", "bbox_non_positive", "polygon_non_finite",
    "polygon_out_of_bounds", "zero_area",
)


def _mark(reason: np.ndarray, where: np.ndarray, key: str) -> None:
    """Set ``key`` where nothing was found yet (the first problem found wins)."""
    reason[where & (reason == 0)] = _VECTOR_REASONS.index(key) + 1


def _vector_detail(key: str, bbox: Any) -> str:
    """The message for a problem found by the vectorised pass."""
    bbox = bbox.tolist() if isinstance(bbox, array) else bbox
    return {
        "bbox_invalid": f"bbox must be 4 finite numbers [x, y, width, height], got {bbox!r}",
        "bbox_non_positive": f"bbox width and height must be positive, got {bbox!r}",
        "polygon_non_finite": "polygon has a NaN or infinite coordinate",
        "polygon_out_of_bounds": (
            f"polygon has a coordinate more than {OUT_OF_BOUNDS_FACTOR} image sizes outside its image"
        ),
        "zero_area": "polygon has zero area",
        "segmentation_invalid": "polygon holds something other than numbers",
    }[key]
