"""Read a COCO annotation file and check every entry into flat tables (the cold build).

``json.load`` (what ``pycocotools.coco.COCO`` itself calls) with the cyclic GC paused, then one
validating pass over the raw lists that frees each chunk of annotation dicts once it is turned
into arrays. ``COCO()`` is not called: its ``createIndex`` raises a bare ``KeyError`` on an
annotation without ``image_id`` before any check could name it, silently keeps the last of two
duplicate ids, and its id -> dict indexes (with the JSON: 3.6 GB at train2017 scale) would only
be thrown away.

Category ids are mapped to contiguous labels ``0..C-1`` in sorted id order. Images are checked
here; annotations are scanned here (ids, image, category, structure of the segmentation) and
their numbers checked chunk by chunk in :mod:`seg_datamodule.io.coco.instances`. LVIS files
take the same path: an image's path may come from ``coco_url``, a missing ``iscrowd`` is 0, and
``neg_category_ids`` / ``not_exhaustive_category_ids`` become per-image label lists (see
:mod:`seg_datamodule.io.coco.lvis_fields`).
"""

from __future__ import annotations

import gc
import json
import math
from array import array
from pathlib import Path
from typing import Any

import numpy as np

from seg_datamodule.io.coco.errors import BadAnnotationError, ProblemLog
from seg_datamodule.io.images import MAX_IMAGE_PIXELS
from seg_datamodule.io.coco.lvis_fields import federated_labels, image_file_name
from seg_datamodule.io.coco.instances import add_crowd, assemble, finish_chunk, rle_rings
from seg_datamodule.ops.ragged import offsets_from_lengths

__all__ = ["build_tables"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_CHUNK = 131072  # annotations validated per vectorised pass (bounds the temporary memory)
_NUMBER_TYPES = {int, float}
_NAN_BOX = array("d", [math.nan] * 4)  # a bbox that is not 4 numbers: bbox_invalid in the vector pass
_ONES = array("d", [1.0])  # placeholder coordinates of a polygon that is not numbers


def _load_json(ann_file: Path) -> Any:
    """The parsed JSON, with polygon rings and bboxes packed as ``array('d')`` while parsing.

    A parsed coordinate costs 32 bytes (a float object and its list slot), packed 8: packing
    each annotation as the parser finishes it (``object_hook``) keeps train2017's ~30M
    coordinates from ever existing as objects all at once (peak RSS -40%, parse time +3%).
    Only lists of ints and floats are packed; anything else stays as it is, for the checks.
    """
    was_enabled = gc.isenabled()
    gc.disable()  # json.load builds millions of containers; generational GC passes are pure waste
    try:
        # Text mode, as COCO() does: bytes would be held *and* decoded while parsing (+600 MB).
        with open(ann_file, encoding="utf-8") as f:
            text = f.read()
        # JSON booleans are the one thing array("d") would take for numbers: without a "true"
        # or "false" anywhere in the file, the type check per ring is skipped.
        may_hold_bools = "true" in text or "false" in text
        return json.loads(text, object_hook=_pack_numbers_checked if may_hold_bools else _pack_numbers)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadAnnotationError(
            f"{ann_file}: not valid JSON: {err}", ann_file=ann_file, reason="not_json"
        ) from None
    finally:
        if was_enabled:
            gc.enable()


def _numbers(values: list[Any]) -> array | None:
    """``values`` as ``array('d')`` when every one is an int or a float (a bool is neither), else None."""
    if not set(map(type, values)) <= _NUMBER_TYPES:
        return None
    try:
        return array("d", values)
    except (TypeError, OverflowError):  # a string, None, a nested list, an int beyond float
        return None


def _pack_numbers(obj: dict[str, Any]) -> dict[str, Any]:
    """``object_hook``: pack an annotation's non-empty polygon rings and its bbox (see :func:`_load_json`).

    For files without a boolean: ``array("d")`` itself refuses strings, None and nested lists.
    """
    seg = obj.get("segmentation")
    if seg.__class__ is list:
        for k, ring in enumerate(seg):
            if ring.__class__ is list and ring:
                try:
                    seg[k] = array("d", ring)
                except (TypeError, OverflowError):
                    pass
    bbox = obj.get("bbox")
    if bbox.__class__ is list and len(bbox) == 4:
        try:
            obj["bbox"] = array("d", bbox)
        except (TypeError, OverflowError):
            pass
    return obj


def _pack_numbers_checked(obj: dict[str, Any]) -> dict[str, Any]:
    """:func:`_pack_numbers` for files that hold booleans: lists holding one stay lists."""
    seg = obj.get("segmentation")
    if type(seg) is list:
        for k, ring in enumerate(seg):
            if type(ring) is list and ring:
                packed = _numbers(ring)
                if packed is not None:
                    seg[k] = packed
    bbox = obj.get("bbox")
    if type(bbox) is list and len(bbox) == 4:
        packed = _numbers(bbox)
        if packed is not None:
            obj["bbox"] = packed
    return obj


def _positive_int(value: Any) -> int | None:
    if type(value) is int and value > 0:
        return value
    if type(value) is float and value.is_integer() and value > 0:
        return int(value)
    return None


def build_tables(ann_file: Path, on_bad_sample: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read and check the JSON; return (arrays, metadata) of the unfiltered index."""
    data = _load_json(ann_file)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _tables_from_json(data, ann_file, on_bad_sample)
    finally:
        del data
        if was_enabled:
            gc.enable()


def _tables_from_json(
    data: Any, ann_file: Path, on_bad_sample: str
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    # 1. Structure: what cannot be skipped.
    if not isinstance(data, dict):
        raise BadAnnotationError(
            f"{ann_file}: not a COCO annotation file: the top level is a {type(data).__name__}, "
            "not an object",
            ann_file=ann_file,
            reason="not_coco",
        )
    # An image-info file (COCO test-dev's ``image_info_test-dev2017.json``) has no
    # ``annotations`` key at all: it indexes as images without instances.
    data.setdefault("annotations", [])
    missing = [k for k in ("images", "annotations", "categories") if not isinstance(data.get(k), list)]
    if missing:
        raise BadAnnotationError(
            f"{ann_file}: not a COCO annotation file: {', '.join(repr(k) for k in missing)} "
            f"missing or not a list (keys present: {sorted(map(str, data))})",
            ann_file=ann_file,
            reason="not_coco",
        )
    problems = ProblemLog(ann_file, on_bad_sample)

    # 2. Categories -> contiguous labels in sorted id order.
    names_of: dict[int, str] = {}
    for pos, cat in enumerate(data["categories"]):
        cid = cat.get("id") if isinstance(cat, dict) else None
        name = cat.get("name") if isinstance(cat, dict) else None
        if type(cid) is not int or not _INT64_MIN <= cid <= _INT64_MAX or not isinstance(name, str):
            raise BadAnnotationError(
                f"{ann_file}: category #{pos} needs an integer 'id' and a string 'name', got {cat!r}",
                ann_file=ann_file,
                reason="bad_category",
            )
        if cid in names_of:
            raise BadAnnotationError(
                f"{ann_file}: category id {cid} appears twice ({names_of[cid]!r} and {name!r})",
                ann_file=ann_file,
                reason="duplicate_category_id",
            )
        names_of[cid] = name
    category_ids = sorted(names_of)
    label_of = {cid: k for k, cid in enumerate(category_ids)}

    # 3. Images, in file order; the first entry of an id decides.
    index_of: dict[int, int] = {}
    taken: dict[int, str] = {}
    skipped_ids: set[int] = set()
    ids: list[int] = []
    heights: list[int] = []
    widths: list[int] = []
    names: list[str] = []
    neg_labels: list[list[int]] = []
    not_exhaustive_labels: list[list[int]] = []
    for pos, img in enumerate(data["images"]):
        if not isinstance(img, dict):
            problems.add((0, pos), "image_bad_entry", "is not a JSON object", what="image")
            continue
        iid = img.get("id")
        # LVIS v1 has no file_name: the path then comes from coco_url (see lvis_fields).
        name, shown_name, name_problem = image_file_name(img)
        if type(iid) is not int or not _INT64_MIN <= iid <= _INT64_MAX:
            problems.add(
                (0, pos), "image_bad_entry", f"id must be a 64-bit integer, got {iid!r}",
                file_name=shown_name, what="image",
            )
            continue
        if iid in taken:
            problems.add(
                (0, pos), "image_duplicate_id", f"id already used by the entry for {taken[iid]}",
                image_id=iid, file_name=shown_name, what="image",
            )
            continue
        taken[iid] = shown_name or "?"
        height, width = _positive_int(img.get("height")), _positive_int(img.get("width"))
        reason, detail = "image_bad_entry", None
        federated = federated_labels(img, label_of)
        if name_problem is not None:
            reason, detail = name_problem
        elif height is None or width is None:
            detail = f"height and width must be positive integers, got {img.get('height')!r} x {img.get('width')!r}"
        elif height * width > MAX_IMAGE_PIXELS:
            detail = f"{height}x{width} (HxW) is over {MAX_IMAGE_PIXELS} pixels, more than OpenCV decodes"
        elif isinstance(federated, str):
            detail = federated
        if detail is not None:
            problems.add((0, pos), reason, detail, image_id=iid, file_name=shown_name, what="image")
            skipped_ids.add(iid)
            continue
        index_of[iid] = len(ids)
        ids.append(iid)
        heights.append(height)
        widths.append(width)
        names.append(name)
        neg_labels.append(federated[0])
        not_exhaustive_labels.append(federated[1])
    problems.checkpoint()

    # 4. Annotations, chunk by chunk: cheap checks in the loop, numeric ones vectorised.
    anns = data["annotations"]
    image_sizes = np.array([heights, widths], np.int64).T.reshape(-1, 2)  # (H, W) per image
    seen: set[int] = set()
    chunks: list[dict[str, np.ndarray]] = []
    crowd: dict[str, list[Any]] = {k: [] for k in ("pos", "img", "label", "id", "bbox", "area", "rle")}
    for start in range(0, len(anns), _CHUNK):
        chunk = _scan_chunk(
            anns, start, min(start + _CHUNK, len(anns)), seen, index_of, skipped_ids, label_of,
            heights, widths, names, image_sizes, problems, crowd,
        )
        if chunk is not None:
            chunks.append(chunk)
        problems.checkpoint()
        # Free the chunk's dicts now: the arrays grow while the JSON shrinks (lower peak RSS).
        anns[start : start + _CHUNK] = [None] * (min(start + _CHUNK, len(anns)) - start)

    # 5. Assemble: instances sorted by image (stable: file order within an image).
    tables = assemble(chunks, crowd, len(ids))
    tables["image_ids"] = np.asarray(ids, np.int64)
    tables["heights"] = np.asarray(heights, np.int64)
    tables["widths"] = np.asarray(widths, np.int64)
    encoded = [n.encode("utf-8") for n in names]
    tables["file_name_offsets"] = offsets_from_lengths(np.fromiter((len(b) for b in encoded), np.int64, len(encoded)))
    tables["file_name_bytes"] = np.frombuffer(b"".join(encoded), np.uint8).copy()
    tables["category_ids"] = np.asarray(category_ids, np.int64)
    for key, lists in (("neg", neg_labels), ("not_exhaustive", not_exhaustive_labels)):
        tables[f"{key}_label_offsets"] = offsets_from_lengths(np.fromiter(map(len, lists), np.int64, len(lists)))
        tables[f"{key}_labels"] = np.fromiter((k for labels in lists for k in labels), np.int64)
    meta = {
        "class_names": [names_of[c] for c in category_ids],
        "skip_counts": dict(problems.counts),
        "skip_examples": problems.examples,
        "first_problem": None if problems.first is None else problems.first[1],
    }
    return tables, meta


def _scan_chunk(
    anns: list[Any],
    start: int,
    stop: int,
    seen: set[int],
    index_of: dict[int, int],
    skipped_ids: set[int],
    label_of: dict[int, int],
    heights: list[int],
    widths: list[int],
    names: list[str],
    image_sizes: np.ndarray,
    problems: ProblemLog,
    crowd: dict[str, list[Any]],
) -> dict[str, np.ndarray] | None:
    """Scan annotations ``start:stop``; return the chunk's valid target instances as arrays."""
    rows: list[int] = []  # per kept annotation: pos, image index, label, id, rings, first coordinate
    boxes = array("d")  # 4 per kept annotation
    areas: list[float] = []
    ring_lens: list[int] = []
    coords = array("d")
    non_numbers: list[int] = []  # rows whose polygon holds something other than numbers
    rows_extend, boxes_extend, areas_append = rows.extend, boxes.extend, areas.append
    ring_lens_append, coords_extend = ring_lens.append, coords.extend
    index_get, label_get, seen_add = index_of.get, label_of.get, seen.add
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
        if type(aid) is not int or not _INT64_MIN <= aid <= _INT64_MAX:
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
            add_crowd(pos, seg, bbox, area, aid, iid, ii, label, heights[ii], widths[ii], bad, crowd)
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
                packed_rings.append(ring if type(ring) is array else _numbers(ring))
            if not seg or (problem is not None and all(type(r) is list and not r for r in seg)):
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
        elif seg is None or seg == "":
            bad(pos, "segmentation_empty", "segmentation is missing", aid, iid, ii)
            continue
        else:
            detail = f"segmentation is a {type(seg).__name__}, not polygons or RLE"
            bad(pos, "segmentation_invalid", detail, aid, iid, ii)
            continue
        rows_extend((pos, ii, label, aid, nrings, first))
        boxes_extend(bbox if type(bbox) is array else (_numbers(bbox) or _NAN_BOX))
        areas_append(area)
    if not rows:
        return None
    return finish_chunk(anns, rows, boxes, areas, ring_lens, coords, non_numbers, image_sizes, bad)
