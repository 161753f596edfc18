"""Read a COCO annotation file and check every entry into flat tables (the cold build).

``json.load`` (what ``pycocotools.coco.COCO`` itself calls) with the cyclic GC paused, then one
validating pass over the raw lists that frees each chunk of annotation dicts once it is turned
into arrays. ``COCO()`` is not called: its ``createIndex`` raises a bare ``KeyError`` on an
annotation without ``image_id`` before any check could name it, silently keeps the last of two
duplicate ids, and its id -> dict indexes (with the JSON: 3.6 GB at train2017 scale) would only
be thrown away.

Category ids are mapped to contiguous labels ``0..C-1`` in sorted id order. Images are checked
here; annotations are scanned chunk by chunk in :mod:`seg_datamodule.io.coco.scan` (ids, image,
category, structure of the segmentation) and their numbers checked in
:mod:`seg_datamodule.io.coco.instances`. LVIS files
take the same path: an image's path may come from ``coco_url``, a missing ``iscrowd`` is 0, and
``neg_category_ids`` / ``not_exhaustive_category_ids`` become per-image label lists (see
:mod:`seg_datamodule.io.coco.lvis_fields`).
"""

from __future__ import annotations

import gc
import json
from array import array
from pathlib import Path
from typing import Any

import numpy as np

from seg_datamodule.io.coco.errors import BadAnnotationError, ProblemLog
from seg_datamodule.io.coco.lvis_fields import federated_labels, image_file_name
from seg_datamodule.io.coco.scan import INT64_MAX, INT64_MIN, ChunkScanner, KeptImages, packed_numbers
from seg_datamodule.io.coco.tables import assemble, box_only_chunk
from seg_datamodule.io.images.decode import MAX_IMAGE_PIXELS
from seg_datamodule.ops.ragged import offsets_from_lengths

__all__ = ["build_tables"]

_CHUNK = 131072  # annotations validated per vectorised pass (bounds the temporary memory)


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
                packed = packed_numbers(ring)
                if packed is not None:
                    seg[k] = packed
    bbox = obj.get("bbox")
    if type(bbox) is list and len(bbox) == 4:
        packed = packed_numbers(bbox)
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
        if type(cid) is not int or not INT64_MIN <= cid <= INT64_MAX or not isinstance(name, str):
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
        if type(iid) is not int or not INT64_MIN <= iid <= INT64_MAX:
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
    scanner = ChunkScanner(KeptImages(index_of, skipped_ids, heights, widths, names), label_of, problems)
    chunks: list[dict[str, np.ndarray]] = []
    for start in range(0, len(anns), _CHUNK):
        chunk = scanner.scan(anns, start, min(start + _CHUNK, len(anns)))
        if chunk is not None:
            chunks.append(chunk)
        problems.checkpoint()
        # Free the chunk's dicts now: the arrays grow while the JSON shrinks (lower peak RSS).
        anns[start : start + _CHUNK] = [None] * (min(start + _CHUNK, len(anns)) - start)

    # 5. Assemble: instances sorted by image (stable: file order within an image; box-only
    # annotations, instances without a ring, after an image's polygons).
    if scanner.box_only:
        chunks.append(box_only_chunk(scanner.box_only))
    tables = assemble(chunks, scanner.crowd, len(ids))
    tables["image_ids"] = np.asarray(ids, np.int64)
    tables["heights"] = np.asarray(heights, np.int64)
    tables["widths"] = np.asarray(widths, np.int64)
    encoded = [n.encode("utf-8") for n in names]
    tables["file_name_offsets"] = offsets_from_lengths(np.fromiter((len(b) for b in encoded), np.int64, len(encoded)))
    tables["file_name_bytes"] = np.frombuffer(b"".join(encoded), np.uint8).copy()
    tables["category_ids"] = np.asarray(category_ids, np.int64)
    tables["orientations"] = np.ones(len(ids), np.uint8)  # COCO sizes refer to the stored pixels
    for key, lists in (("neg", neg_labels), ("not_exhaustive", not_exhaustive_labels)):
        tables[f"{key}_label_offsets"] = offsets_from_lengths(np.fromiter(map(len, lists), np.int64, len(lists)))
        tables[f"{key}_labels"] = np.fromiter((k for labels in lists for k in labels), np.int64)
    meta = {
        "class_names": [names_of[c] for c in category_ids],
        "skip_counts": dict(problems.counts),
        "skip_examples": problems.examples,
        "first_problem": None if problems.first is None else problems.first[1],
        "skipped_image_ids": sorted(problems.images),
    }
    return tables, meta
