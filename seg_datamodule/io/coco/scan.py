"""Scan annotation entries chunk by chunk: the per-entry checks of the build's Python loop.

Each annotation is checked here for what a loop checks cheaply (its id, image, category, the
structure of its bbox and segmentation, ``iscrowd``); one with a box and no segmentation is
kept apart (:attr:`ChunkScanner.box_only`, stored as an instance without a ring); a target polygon is packed into flat
buffers (:class:`~seg_datamodule.io.coco.instances.ChunkRows`) whose numbers
:func:`~seg_datamodule.io.coco.instances.finish_chunk` then checks vectorised. Crowd regions are
checked one by one (:func:`~seg_datamodule.io.coco.instances.check_crowd`; they are few) and
kept as :class:`~seg_datamodule.io.coco.instances.CrowdRegion`.
"""

from __future__ import annotations

import math
from array import array
from typing import Any, NamedTuple

import numpy as np

from seg_datamodule.io.coco.errors import ProblemLog
from seg_datamodule.io.coco.instances import ChunkRows, CrowdRegion, check_bbox, check_crowd, finish_chunk, rle_rings

__all__ = ["INT64_MAX", "INT64_MIN", "ChunkScanner", "KeptImages", "packed_numbers"]

#: The range of a JSON id the index stores (int64).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_NUMBER_TYPES = {int, float}
_NAN_BOX = array("d", [math.nan] * 4)  # a bbox that is not 4 numbers: bbox_invalid in the vector pass
_ONES = array("d", [1.0])  # placeholder coordinates of a polygon that is not numbers


def packed_numbers(values: list[Any]) -> array | None:
    """``values`` as ``array('d')`` when every one is an int or a float (a bool is neither), else None."""
    if not set(map(type, values)) <= _NUMBER_TYPES:
        return None
    try:
        return array("d", values)
    except (TypeError, OverflowError):  # a string, None, a nested list, an int beyond float
        return None


class KeptImages(NamedTuple):
    """The image entries kept, as the annotation checks look them up.

    Attributes:
        index_of: COCO image id -> image index.
        skipped_ids: ids of the image entries that were skipped.
        heights: H per image index.
        widths: W per image index.
        file_names: file name per image index.
    """

    index_of: dict[int, int]
    skipped_ids: set[int]
    heights: list[int]
    widths: list[int]
    file_names: list[str]


class ChunkScanner:
    """Scans a file's annotations chunk by chunk against its kept images and categories.

    Holds what lives across chunks: the annotation ids seen, the crowd regions kept (in file
    order) and the problem log every bad annotation is reported to.

    Args:
        images: the image entries kept.
        label_of: COCO category id -> contiguous label.
        problems: where problems are reported.
    """

    def __init__(self, images: KeptImages, label_of: dict[int, int], problems: ProblemLog) -> None:
        self.images = images
        self.label_of = label_of
        self.problems = problems
        self.image_sizes = np.array([images.heights, images.widths], np.int64).T.reshape(-1, 2)  # (H, W)
        self.seen: set[int] = set()
        self.crowd: list[CrowdRegion] = []
        # Annotations with a valid box and no segmentation: (image index, label, id, x, y, w, h, area).
        self.box_only: list[tuple[int, int, int, float, float, float, float, float]] = []

    def scan(self, anns: list[Any], start: int, stop: int) -> dict[str, np.ndarray] | None:
        """Scan annotations ``start:stop``; return the chunk's valid target instances as arrays."""
        # rows: per kept annotation pos, image index, label, id, rings, first coordinate; boxes: 4
        # per kept annotation; non_numbers: rows whose polygon holds something other than numbers.
        packed = ChunkRows(rows=[], boxes=array("d"), areas=[], ring_lens=[], coords=array("d"), non_numbers=[])
        rows, boxes, areas, ring_lens, coords, non_numbers = packed
        rows_extend, boxes_extend, areas_append = rows.extend, boxes.extend, areas.append
        ring_lens_append, coords_extend = ring_lens.append, coords.extend
        index_of, skipped_ids, heights, widths, names = self.images
        index_get, label_get, seen_add = index_of.get, self.label_of.get, self.seen.add
        seen, crowd_append, problems = self.seen, self.crowd.append, self.problems
        nan = math.nan

        def bad(pos: int, reason: str, detail: str, aid: Any, iid: Any, ii: int | None) -> None:
            if ii is None and type(iid) is int:
                ii = index_get(iid)
            name = None if ii is None else names[ii]
            problems.add((1, pos), reason, detail, image_id=iid, annotation_id=aid, file_name=name)

        for pos in range(start, stop):
            ann = anns[pos]
            if type(ann) is not dict:
                bad(pos, "annotation_bad_entry", "is not a JSON object", None, None, None)
                continue
            aid = ann.get("id")
            iid = ann.get("image_id")
            if type(aid) is not int or not INT64_MIN <= aid <= INT64_MAX:
                bad(pos, "annotation_bad_entry", f"id must be a 64-bit integer, got {aid!r}", None, iid, None)
                continue
            if aid in seen:
                bad(pos, "annotation_duplicate_id", "an earlier annotation has the same id", aid, iid, None)
                continue
            seen_add(aid)
            ii = index_get(iid) if type(iid) is int else None
            if ii is None:
                if type(iid) is int and iid in skipped_ids:
                    bad(pos, "annotation_of_skipped_image", "its image entry was skipped", aid, iid, None)
                else:
                    detail = f"image_id {iid!r} is not the id of any image"
                    bad(pos, "annotation_unknown_image_id", detail, aid, iid, None)
                continue
            cid = ann.get("category_id")
            label = label_get(cid) if type(cid) is int else None
            if label is None:
                detail = f"category_id {cid!r} is not the id of any category"
                bad(pos, "annotation_unknown_category_id", detail, aid, iid, ii)
                continue
            bbox = ann.get("bbox")
            if (type(bbox) is not array and type(bbox) is not list) or len(bbox) != 4:
                detail = f"bbox must be 4 numbers [x, y, width, height], got {bbox!r}"
                bad(pos, "bbox_invalid", detail, aid, iid, ii)
                continue
            seg = ann.get("segmentation")
            area = ann.get("area")
            if type(area) is not float and type(area) is not int:
                if type(area) is bool:
                    bad(pos, "annotation_bad_entry", f"area must be a number, got {area!r}", aid, iid, ii)
                    continue
                area = nan
            iscrowd = ann.get("iscrowd", 0)
            if type(iscrowd) is not int or iscrowd not in (0, 1):
                bad(pos, "annotation_bad_entry", f"iscrowd must be 0 or 1, got {iscrowd!r}", aid, iid, ii)
                continue
            if iscrowd:
                checked = check_crowd(seg, bbox, area, heights[ii], widths[ii])
                if isinstance(checked[0], str):
                    bad(pos, checked[0], checked[1], aid, iid, ii)
                else:
                    crowd_append(CrowdRegion(ii, label, aid, bbox, checked[1], checked[0]))
                continue
            if seg is None or seg == "" or (type(seg) is list and not seg):
                # A box without a mask (mixed detection and segmentation data) is not a bad
                # entry: once its box is checked, it is kept apart (box_only: drop or keep).
                problem = check_bbox(bbox)
                if problem is None:
                    self.box_only.append((ii, label, aid, *map(float, bbox), area))
                else:
                    bad(pos, problem[0], problem[1], aid, iid, ii)
                continue
            first = len(coords)
            if type(seg) is list:
                problem, packed_rings = None, []
                for k, ring in enumerate(seg):
                    n = len(ring) if type(ring) is array or type(ring) is list else -1
                    if n < 0:
                        detail = f"polygon ring {k} is a {type(ring).__name__}, not a list"
                        problem = ("segmentation_invalid", detail)
                        break
                    if n & 1:
                        detail = f"polygon ring {k} has an odd number of coordinates ({n})"
                        problem = ("polygon_odd_coordinates", detail)
                        break
                    if n < 6:
                        detail = f"polygon ring {k} has {n // 2} points; at least 3 are needed"
                        problem = ("polygon_too_few_points", detail)
                        break
                    # A list the loader did not pack holds something other than numbers (or the
                    # JSON came from elsewhere): pack it here, or mark the annotation.
                    packed_rings.append(ring if type(ring) is array else packed_numbers(ring))
                if problem is not None and all(type(r) is list and not r for r in seg):
                    problem = ("segmentation_empty", "segmentation has no polygon coordinates")
                if problem is not None:
                    bad(pos, problem[0], problem[1], aid, iid, ii)
                    continue
                if None in packed_rings:  # reported by the vector pass, to keep the order of checks
                    non_numbers.append(len(areas))
                for ring, raw in zip(packed_rings, seg):
                    coords_extend(_ONES * len(raw) if ring is None else ring)
                    ring_lens_append(len(raw) >> 1)
                nrings = len(seg)
            elif type(seg) is dict:
                # Non-crowd RLE: a target, converted to exact polygons (see instances.py).
                converted = rle_rings(seg, heights[ii], widths[ii])
                if isinstance(converted[0], str):
                    bad(pos, converted[0], converted[1], aid, iid, ii)
                    continue
                rings, mask_area = converted
                for ring in rings:
                    coords.frombytes(np.ascontiguousarray(ring, np.float64).tobytes())
                    ring_lens_append(len(ring))
                nrings = len(rings)
                if area != area:
                    area = mask_area
            else:
                detail = f"segmentation is a {type(seg).__name__}, not polygons or RLE"
                bad(pos, "segmentation_invalid", detail, aid, iid, ii)
                continue
            rows_extend((pos, ii, label, aid, nrings, first))
            boxes_extend(bbox if type(bbox) is array else (packed_numbers(bbox) or _NAN_BOX))
            areas_append(area)
        if not rows:
            return None
        return finish_chunk(anns, packed, self.image_sizes, bad)
