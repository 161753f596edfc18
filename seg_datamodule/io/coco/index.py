"""COCO instance annotations as a compact, worker-safe index of flat numpy arrays.

:meth:`CocoIndex.build` reads a COCO-format annotation file once, checks every entry, and keeps
only flat numpy arrays (images, instances, polygon vertices with ring and instance offsets, crowd
RLE bytes). No per-annotation Python object survives, so DataLoader workers forked after setup
read the arrays without touching reference counts on millions of objects, and pages stay shared
(pytorch issue 13246; detectron2's ``DatasetFromList(serialize=True)`` solves the same problem).
The index pickles as a handful of buffers.

Reading the JSON
    ``json.load`` (what ``pycocotools.coco.COCO`` itself calls) with the cyclic GC paused, then one
    validating pass over the raw lists that frees each chunk of annotation dicts once it is turned
    into arrays. ``COCO()`` is not called in the build: its ``createIndex`` raises a bare
    ``KeyError`` on an annotation without ``image_id`` before any check could name it, silently
    keeps the last of two duplicate ids, and its id -> dict indexes (with the JSON: 3.6 GB at
    train2017 scale) would only be thrown away. ``pycocotools.mask`` does all RLE work, and the
    tests hold the index against ``COCO`` as the reference.

Labels
    Category ids are mapped to contiguous labels ``0..C-1`` in sorted id order
    (:attr:`CocoIndex.label_of_category`, :attr:`CocoIndex.class_names`).

Crowd regions (``iscrowd=1``)
    Never training targets. Each is kept as compressed RLE bytes (a crowd polygon is converted to
    RLE at build) and :meth:`CocoIndex.crowd_mask` decodes the union on demand with
    ``pycocotools.mask``, so a model can ignore those pixels. ``drop_crowd=True`` drops them.

Non-crowd RLE instances
    Converted to polygons at build by :func:`mask_to_rings`: the exact pixel-edge outline of the
    mask (vertices on integer pixel corners, holes joined to their outer ring by a doubled bridge
    edge so the even-odd fill cuts them out). Filling those rings at pixel centres, as the
    rasteriser does, reproduces the RLE mask bit for bit at the original resolution. Chosen over
    carrying bitmaps because everything downstream (mosaic, affine augmentation, clipping, the
    windowed rasteriser and the ``Sample`` format) speaks polygons only: one code path, exact
    masks, and no full-image bitmap per instance in memory. The cost is paid once, at build,
    and cached.

Cache
    The built arrays are saved as one uncompressed ``.npz`` in ``cache_dir`` (default
    ``coco_index/`` in :func:`~seg_datamodule.paths.cache_root`: ``$SEG_DATAMODULE_CACHE``, else
    ``$XDG_CACHE_HOME/seg_datamodule``, else ``~/.cache/seg_datamodule``; datasets are often
    read-only), named after the
    annotation file's stem and a hash of its absolute path. Inside, the key is the absolute path,
    the file's size and ``st_mtime_ns`` and the format version: a file that changed is rebuilt
    and the cache overwritten; a cache that fails to read (truncated, corrupt: the zip CRCs are
    checked) is rebuilt too. Writes are atomic (temporary file + ``os.replace``), so ranks that
    build at once do not tear it. The options ``drop_crowd``, ``drop_empty`` and
    ``verify_images`` are applied after loading, so they share one cache; ``on_bad_sample`` too
    (the cache records what was skipped, and ``"raise"`` raises the first recorded problem).
    Hashing the content instead would cost ~1 s per start on a 600 MB file.

Bad input and ``skip`` counts
    With ``on_bad_sample="raise"`` (default) :class:`BadAnnotationError` is raised for the first
    problem in the JSON (images before annotations, then in file order), naming the annotation
    file, the image id, the annotation id and the image's file name. With ``"skip"`` the entry is
    left out and counted under one reason of :data:`SKIP_REASONS` (an annotation with several
    problems counts once, under the first found); a summary is logged once per build and the
    counts are :attr:`CocoIndex.skip_counts`. ``image_*`` reasons count images, all others count
    annotations; an image left out takes its annotations with it, counted as
    ``annotation_of_skipped_image``, so ``num_instances + num_crowd + crowd_dropped + skipped
    annotations`` is exactly the number of annotations in the JSON (``drop_crowd`` /
    ``drop_empty`` are not skips: :attr:`CocoIndex.dropped_counts`). Malformed structure that
    cannot be skipped (not a JSON object, ``images`` / ``annotations`` / ``categories`` missing,
    a bad or duplicate category) always raises. Images found bad when read (missing, truncated,
    corrupt, wrong size) raise :class:`BadImageError`, which carries a reason key so a dataset in
    skip mode can count it in a :class:`SkipCounter` shared with its DataLoader workers;
    ``verify_images=True`` finds them at build instead.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import hashlib
import json
import logging
import math
import multiprocessing
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Literal, Mapping

import cv2
import numpy as np
from pycocotools import mask as mask_utils

from seg_datamodule.io.coco.errors import BadAnnotationError, format_skip_summary
from seg_datamodule.io.images import BadImageError, decode_image_with_size, reduced_size
from seg_datamodule.io.paths import cache_root, file_lock
from seg_datamodule.ops.ragged import offsets_from_lengths, ragged_index
from seg_datamodule.ops.raster import rasterize_flat
from seg_datamodule.structures import Polygons

__all__ = ["CocoIndex", "default_cache_dir", "mask_to_rings", "rle_counts_from_string"]

_log = logging.getLogger(__name__)

#: Bump when the cached arrays change meaning; older caches are then rebuilt.
CACHE_FORMAT_VERSION = 1

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_EXAMPLES = 3  # messages kept per reason, for the log and for "raise" on a cached index
_CHUNK = 131072  # annotations validated per vectorised pass (bounds the temporary memory)
_VERTEX_SCALE = 100  # COCO has 2 decimals: int32 hundredths store them exactly in half the bytes
_ZERO_AREA_RTOL = 1e-12  # |twice area| within this fraction of the shoelace terms is zero (rounding)


# --------------------------------------------------------------------------------------------
# RLE and polygon helpers (pure functions)


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


def _check_rle(seg: Mapping[str, Any], height: int, width: int) -> tuple[bytes | None, str, str]:
    """Validate an RLE segmentation against its image; return (compressed counts, reason, detail)."""
    size, counts = seg.get("size"), seg.get("counts")
    if not (isinstance(size, list) and len(size) == 2 and all(type(s) is int for s in size)):
        return None, "rle_invalid", f"RLE size must be [height, width], got {size!r}"
    if size != [height, width]:
        return None, "rle_size_mismatch", f"RLE size {size} but the image is {height}x{width} (HxW)"
    if isinstance(counts, list):
        runs = np.asarray(counts) if counts else np.zeros(0, np.int64)
        if runs.ndim != 1 or runs.dtype.kind not in "iu" or (runs < 0).any():
            return None, "rle_invalid", "RLE counts must be a list of non-negative integers"
        if int(runs.sum()) != height * width:
            total = int(runs.sum())
            return None, "rle_invalid", f"RLE counts sum to {total}, height * width is {height * width}"
        rle = mask_utils.frPyObjects({"size": [height, width], "counts": counts}, height, width)
        return rle["counts"], "", ""
    if isinstance(counts, (str, bytes)):
        try:
            runs_list = rle_counts_from_string(counts)
        except ValueError as err:
            return None, "rle_invalid", str(err)
        if any(r < 0 for r in runs_list) or sum(runs_list) != height * width:
            return None, "rle_invalid", (
                f"compressed RLE runs sum to {sum(runs_list)} (or are negative), height * width is "
                f"{height * width}"
            )
        return counts.encode("ascii") if isinstance(counts, str) else bytes(counts), "", ""
    return None, "rle_invalid", f"RLE counts must be a list or a string, got {type(counts).__name__}"


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


def _check_rings_python(seg: list[Any]) -> tuple[str, str] | None:
    """The polygon checks of the vectorised pass, ring by ring in Python (for crowd polygons)."""
    if not seg or all(isinstance(r, list) and not r for r in seg):
        return "segmentation_empty", "segmentation has no polygon coordinates"
    rings = []
    for k, ring in enumerate(seg):
        if not isinstance(ring, list):
            return "segmentation_invalid", f"polygon ring {k} is a {type(ring).__name__}, not a list"
        if len(ring) % 2:
            return "polygon_odd_coordinates", (
                f"polygon ring {k} has an odd number of coordinates ({len(ring)})"
            )
        if len(ring) < 6:
            return "polygon_too_few_points", (
                f"polygon ring {k} has {len(ring) // 2} points; at least 3 are needed"
            )
        if not all(type(c) in (int, float) for c in ring):
            return "segmentation_invalid", f"polygon ring {k} holds something other than numbers"
        xy = np.asarray(ring, np.float64).reshape(-1, 2)
        if not np.isfinite(xy).all():
            return "polygon_non_finite", f"polygon ring {k} has a NaN or infinite coordinate"
        rings.append(xy)
    lens = np.array([len(r) for r in rings], np.int64)
    if _is_zero_area(np.concatenate(rings), offsets_from_lengths(lens)[:-1], lens):
        return "zero_area", "polygon has zero area"
    return None


def _check_bbox_python(bbox: Any) -> tuple[str, str] | None:
    if not (isinstance(bbox, list) and len(bbox) == 4 and all(type(v) in (int, float) for v in bbox)):
        return "bbox_invalid", f"bbox must be 4 numbers [x, y, width, height], got {bbox!r}"
    if not all(math.isfinite(v) for v in bbox):
        return "bbox_invalid", f"bbox has a NaN or infinite value: {bbox!r}"
    if bbox[2] <= 0 or bbox[3] <= 0:
        return "bbox_non_positive", f"bbox width and height must be positive, got {bbox!r}"
    return None


# --------------------------------------------------------------------------------------------
# Building the tables from the JSON


class _Problems:
    """Counts problems by reason; remembers a few messages and the first problem in file order."""

    def __init__(self, ann_file: Path, on_bad_sample: str) -> None:
        self.ann_file = ann_file
        self.raise_now = on_bad_sample == "raise"
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}
        self.first: tuple[tuple[int, int], dict[str, Any]] | None = None

    def add(
        self,
        order: tuple[int, int],
        reason: str,
        detail: str,
        *,
        image_id: Any = None,
        annotation_id: Any = None,
        file_name: str | None = None,
        what: str = "annotation",
    ) -> None:
        where = [f"{self.ann_file}:"]
        if what == "annotation":
            where.append(
                f"annotation id {annotation_id!r}" if annotation_id is not None else f"annotation #{order[1]}"
            )
            where.append(f"(image id {image_id!r}, file {file_name or '?'}):")
        else:
            where.append(f"image id {image_id!r}" if image_id is not None else f"image #{order[1]}")
            where.append(f"(file {file_name or '?'}):")
        message = " ".join(where) + " " + detail
        self.counts[reason] += 1
        examples = self.examples.setdefault(reason, [])
        if len(examples) < _MAX_EXAMPLES:
            examples.append(message)
        if self.first is None or order < self.first[0]:
            ids = {
                "image_id": image_id if type(image_id) is int else None,
                "annotation_id": annotation_id if type(annotation_id) is int else None,
            }
            self.first = (order, {"message": message, "reason": reason, **ids})

    def checkpoint(self) -> None:
        """In raise mode, raise the first problem seen so far."""
        if self.raise_now and self.first is not None:
            raise _error_from_first(self.first[1], self.ann_file)


def _error_from_first(first: Mapping[str, Any], ann_file: Path | str) -> BadAnnotationError:
    return BadAnnotationError(
        first["message"],
        ann_file=ann_file,
        reason=first["reason"],
        image_id=first.get("image_id"),
        annotation_id=first.get("annotation_id"),
    )


def _load_json(ann_file: Path) -> Any:
    was_enabled = gc.isenabled()
    gc.disable()  # json.load builds millions of containers; generational GC passes are pure waste
    try:
        # Text mode, as COCO() does: in binary mode json.load holds the bytes *and* their
        # decoded copy while parsing (+600 MB at train2017 scale).
        with open(ann_file, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadAnnotationError(
            f"{ann_file}: not valid JSON: {err}", ann_file=ann_file, reason="not_json"
        ) from None
    finally:
        if was_enabled:
            gc.enable()


def _positive_int(value: Any) -> int | None:
    if type(value) is int and value > 0:
        return value
    if type(value) is float and value.is_integer() and value > 0:
        return int(value)
    return None


def _build_tables(ann_file: Path, on_bad_sample: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
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
    missing = [k for k in ("images", "annotations", "categories") if not isinstance(data.get(k), list)]
    if missing:
        raise BadAnnotationError(
            f"{ann_file}: not a COCO annotation file: {', '.join(repr(k) for k in missing)} "
            f"missing or not a list (keys present: {sorted(map(str, data))})",
            ann_file=ann_file,
            reason="not_coco",
        )
    problems = _Problems(ann_file, on_bad_sample)

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
    for pos, img in enumerate(data["images"]):
        if not isinstance(img, dict):
            problems.add((0, pos), "image_bad_entry", "is not a JSON object", what="image")
            continue
        iid, name = img.get("id"), img.get("file_name")
        shown_name = name if isinstance(name, str) else None
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
        if not shown_name or height is None or width is None:
            detail = (
                f"file_name must be a non-empty string, got {name!r}"
                if not shown_name
                else "height and width must be positive integers, got "
                f"{img.get('height')!r} x {img.get('width')!r}"
            )
            problems.add(
                (0, pos), "image_bad_entry", detail, image_id=iid, file_name=shown_name, what="image"
            )
            skipped_ids.add(iid)
            continue
        index_of[iid] = len(ids)
        ids.append(iid)
        heights.append(height)
        widths.append(width)
        names.append(name)
    problems.checkpoint()

    # 4. Annotations, chunk by chunk: cheap checks in the loop, numeric ones vectorised.
    anns = data["annotations"]
    seen: set[int] = set()
    chunks: list[dict[str, np.ndarray]] = []
    crowd: dict[str, list[Any]] = {k: [] for k in ("pos", "img", "label", "id", "bbox", "area", "rle")}
    for start in range(0, len(anns), _CHUNK):
        chunk = _scan_chunk(
            anns, start, min(start + _CHUNK, len(anns)), seen, index_of, skipped_ids, label_of,
            heights, widths, names, problems, crowd,
        )
        if chunk is not None:
            chunks.append(chunk)
        problems.checkpoint()
        # Free the chunk's dicts now: the arrays grow while the JSON shrinks (lower peak RSS).
        anns[start : start + _CHUNK] = [None] * (min(start + _CHUNK, len(anns)) - start)

    # 5. Assemble: instances sorted by image (stable: file order within an image).
    tables = _assemble(chunks, crowd, len(ids))
    tables["image_ids"] = np.asarray(ids, np.int64)
    tables["heights"] = np.asarray(heights, np.int64)
    tables["widths"] = np.asarray(widths, np.int64)
    encoded = [n.encode("utf-8") for n in names]
    tables["file_name_offsets"] = offsets_from_lengths(np.fromiter((len(b) for b in encoded), np.int64, len(encoded)))
    tables["file_name_bytes"] = np.frombuffer(b"".join(encoded), np.uint8).copy()
    tables["category_ids"] = np.asarray(category_ids, np.int64)
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
    problems: _Problems,
    crowd: dict[str, list[Any]],
) -> dict[str, np.ndarray] | None:
    """Scan annotations ``start:stop``; return the chunk's valid target instances as arrays."""
    rows: list[int] = []  # per kept annotation: pos, image index, label, id, rings, first coordinate
    boxes: list[Any] = []  # 4 per kept annotation
    areas: list[float] = []
    ring_lens: list[int] = []
    coords: list[Any] = []
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
        if type(bbox) is not list or len(bbox) != 4:
            detail = f"bbox must be 4 numbers [x, y, width, height], got {bbox!r}"
            bad(pos, "bbox_invalid", detail, aid, iid, ii)
            continue
        seg = ann.get("segmentation")
        area = ann.get("area")
        if type(area) is not float and type(area) is not int:
            area = nan
        iscrowd = ann.get("iscrowd", 0)
        if type(iscrowd) is not int or iscrowd not in (0, 1):
            bad(pos, "annotation_bad_entry", f"iscrowd must be 0 or 1, got {iscrowd!r}", aid, iid, ii)
            continue
        if iscrowd:
            _add_crowd(pos, seg, bbox, area, aid, iid, ii, label, heights[ii], widths[ii], bad, crowd)
            continue
        first = len(coords)
        if type(seg) is list:
            problem = None
            for k, ring in enumerate(seg):
                if type(ring) is not list:
                    detail = f"polygon ring {k} is a {type(ring).__name__}, not a list"
                    problem = ("segmentation_invalid", detail)
                    break
                n = len(ring)
                if n & 1:
                    detail = f"polygon ring {k} has an odd number of coordinates ({n})"
                    problem = ("polygon_odd_coordinates", detail)
                    break
                if n < 6:
                    detail = f"polygon ring {k} has {n // 2} points; at least 3 are needed"
                    problem = ("polygon_too_few_points", detail)
                    break
            if not seg or (problem is not None and all(type(r) is list and not r for r in seg)):
                problem = ("segmentation_empty", "segmentation has no polygon coordinates")
            if problem is not None:
                bad(pos, problem[0], problem[1], aid, iid, ii)
                continue
            for ring in seg:
                coords_extend(ring)
                ring_lens_append(len(ring) >> 1)
            nrings = len(seg)
        elif type(seg) is dict:
            # Non-crowd RLE: a target; converted to exact polygons (see the module docstring).
            compressed, reason, detail = _check_rle(seg, heights[ii], widths[ii])
            if compressed is None:
                bad(pos, reason, detail, aid, iid, ii)
                continue
            mask = mask_utils.decode({"size": [heights[ii], widths[ii]], "counts": compressed})
            rings = mask_to_rings(mask)
            if not rings:
                bad(pos, "zero_area", "RLE mask is empty", aid, iid, ii)
                continue
            for ring in rings:
                coords_extend(ring.ravel().tolist())
                ring_lens_append(len(ring))
            nrings = len(rings)
            if area != area:
                area = float(mask.sum())
        elif seg is None or seg == "":
            bad(pos, "segmentation_empty", "segmentation is missing", aid, iid, ii)
            continue
        else:
            detail = f"segmentation is a {type(seg).__name__}, not polygons or RLE"
            bad(pos, "segmentation_invalid", detail, aid, iid, ii)
            continue
        rows_extend((pos, ii, label, aid, nrings, first))
        boxes_extend(bbox)
        areas_append(area)
    if not rows:
        return None
    return _finish_chunk(anns, rows, boxes, areas, ring_lens, coords, bad)


def _add_crowd(
    pos: int, seg: Any, bbox: list[Any], area: float, aid: int, iid: int, ii: int,
    label: int, height: int, width: int, bad: Any, crowd: dict[str, list[Any]],
) -> None:
    """Check one crowd annotation and keep it as compressed RLE."""
    problem = _check_bbox_python(bbox)
    compressed = None
    if problem is None:
        if isinstance(seg, dict):
            compressed, reason, detail = _check_rle(seg, height, width)
            problem = None if compressed is not None else (reason, detail)
        elif isinstance(seg, list):
            problem = _check_rings_python(seg)
            if problem is None:
                rles = mask_utils.frPyObjects(seg, height, width)
                compressed = mask_utils.merge(rles, intersect=0)["counts"]
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
        bad(pos, problem[0], problem[1], aid, iid, ii)
        return
    values = (pos, ii, label, aid, bbox, area, compressed)
    for key, value in zip(("pos", "img", "label", "id", "bbox", "area", "rle"), values):
        crowd[key].append(value)


def _finish_chunk(
    anns: list[Any],
    rows: list[int],
    boxes: list[Any],
    areas: list[float],
    ring_lens: list[int],
    coords: list[Any],
    bad: Any,
) -> dict[str, np.ndarray] | None:
    """Vectorised checks of a chunk's target instances; drop and report the bad ones."""
    table = np.array(rows, np.int64).reshape(-1, 6)
    pos, img, labels, ids, nrings, first = table.T
    n = len(table)
    reason = np.zeros(n, np.int8)  # 0 ok, else 1 + index into _VECTOR_REASONS
    details: dict[int, str] = {}
    rlens = np.asarray(ring_lens, np.int64)

    # Coordinates: one conversion; a non-number sends the chunk through the per-annotation path.
    try:
        flat = np.array(coords)
    except (ValueError, TypeError):  # a nested list inside a ring
        flat = np.zeros((0, 0), object)
    if flat.dtype.kind not in "fiu" or flat.ndim != 1:
        flat = _numeric_fallback(coords, first, reason, details)
    flat = flat.astype(np.float64, copy=False)

    # Boxes.
    try:
        box = np.array(boxes)
        if box.dtype.kind not in "fiu" or box.ndim != 1:
            raise ValueError
        box = box.astype(np.float64, copy=False).reshape(n, 4)
    except (ValueError, TypeError):
        box = np.full((n, 4), np.nan)
        for k in range(n):
            values = boxes[4 * k : 4 * k + 4]
            if all(type(v) in (int, float) for v in values):
                box[k] = values
    finite_box = np.isfinite(box).all(axis=1)
    _mark(reason, ~finite_box, "bbox_invalid")
    _mark(reason, finite_box & ((box[:, 2] <= 0) | (box[:, 3] <= 0)), "bbox_non_positive")

    # Polygons: non-finite coordinates, then zero area (shoelace, summed over rings).
    vertices = flat.reshape(-1, 2)
    ring_starts = offsets_from_lengths(rlens)[:-1]
    ann_ring_starts = offsets_from_lengths(nrings)[:-1]
    ann_non_finite = np.zeros(n, bool)
    if not np.isfinite(flat).all():
        bad_vertex = ~np.isfinite(vertices).all(axis=1)
        ring_bad = np.logical_or.reduceat(bad_vertex, ring_starts)
        ann_non_finite = np.logical_or.reduceat(ring_bad, ann_ring_starts)
        _mark(reason, ann_non_finite, "polygon_non_finite")
    area2 = _twice_areas(vertices, ring_starts, rlens, ann_ring_starts)
    with np.errstate(invalid="ignore"):
        suspects = np.flatnonzero(~ann_non_finite & ~(area2 > 1e-6))
    for k in suspects:  # tiny: decide with a tolerance relative to the shoelace terms
        r0, r1 = ann_ring_starts[k], ann_ring_starts[k] + nrings[k]
        v0, v1 = ring_starts[r0], ring_starts[r1 - 1] + rlens[r1 - 1]
        ring_vertices, ring_offsets = vertices[v0:v1], ring_starts[r0:r1] - v0
        # Net shoelace area 0 is also a bow-tie whose lobes cancel: only drop what covers no pixel.
        if _is_zero_area(ring_vertices, ring_offsets, rlens[r0:r1]) and not _covers_pixels(
            ring_vertices, np.append(ring_offsets, v1 - v0)
        ):
            _mark(reason, np.arange(n) == k, "zero_area")

    area = np.asarray(areas, np.float64)
    missing_area = ~np.isfinite(area)
    area[missing_area] = area2[missing_area] / 2

    for k in np.flatnonzero(reason):
        key = _VECTOR_REASONS[reason[k] - 1]
        detail = details.get(int(k)) or _vector_detail(key, boxes[4 * k : 4 * k + 4])
        bad(int(pos[k]), key, detail, int(ids[k]), anns[pos[k]].get("image_id"), int(img[k]))
    keep = reason == 0
    if not keep.any():
        return None
    if not keep.all():
        ring_keep = np.repeat(keep, nrings)
        vertices = vertices[np.repeat(ring_keep, rlens)]
        rlens = rlens[ring_keep]
    # Hundredths as int32 when that is exact (COCO's 2-decimal coordinates): half of float64.
    scaled = np.rint(vertices * _VERTEX_SCALE)
    if np.all(np.abs(scaled) < 2**31 - 1) and np.array_equal(scaled / _VERTEX_SCALE, vertices):
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


def _twice_areas(
    vertices: np.ndarray, ring_starts: np.ndarray, ring_lens: np.ndarray, ann_ring_starts: np.ndarray
) -> np.ndarray:
    """Per annotation, the sum over its rings of |twice the ring's signed (shoelace) area|."""
    if len(ann_ring_starts) == 0:
        return np.zeros(0)
    x, y = vertices[:, 0].copy(), vertices[:, 1].copy()
    with np.errstate(invalid="ignore", over="ignore"):
        terms = np.empty_like(x)
        terms[:-1] = x[:-1] * y[1:] - x[1:] * y[:-1]  # across ring ends too; fixed below
        last = ring_starts + ring_lens - 1
        terms[last] = x[last] * y[ring_starts] - x[ring_starts] * y[last]  # closing edges
        ring_area2 = np.abs(np.add.reduceat(terms, ring_starts))
        return np.add.reduceat(ring_area2, ann_ring_starts)


def _covers_pixels(vertices: np.ndarray, ring_offsets: np.ndarray) -> bool:
    """Whether the rings' even-odd region holds any pixel centre (one instance, stride 1)."""
    if not np.isfinite(vertices).all():
        return False
    low = np.floor(vertices.min(axis=0))
    size = np.ceil(vertices.max(axis=0) - low).astype(np.int64) + 1
    mask = rasterize_flat(vertices - low, ring_offsets, np.array([0, len(ring_offsets) - 1]),
                          (int(size[1]), int(size[0])), 1)
    return bool(mask.any())


def _is_zero_area(vertices: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> bool:
    total, scale = 0.0, 0.0
    for s, m in zip(starts, lens):
        x, y = vertices[s : s + m, 0], vertices[s : s + m, 1]
        a, b = x * np.roll(y, -1), np.roll(x, -1) * y
        total += abs(float((a - b).sum()))
        scale += float(np.abs(a).sum() + np.abs(b).sum())
    return total <= _ZERO_AREA_RTOL * scale


_VECTOR_REASONS = (
    "segmentation_invalid", "bbox_invalid", "bbox_non_positive", "polygon_non_finite", "zero_area"
)


def _mark(reason: np.ndarray, where: np.ndarray, key: str) -> None:
    """Set ``key`` where nothing was found yet (the first problem found wins)."""
    reason[where & (reason == 0)] = _VECTOR_REASONS.index(key) + 1


def _vector_detail(key: str, bbox: Any) -> str:
    return {
        "bbox_invalid": f"bbox must be 4 finite numbers [x, y, width, height], got {bbox!r}",
        "bbox_non_positive": f"bbox width and height must be positive, got {bbox!r}",
        "polygon_non_finite": "polygon has a NaN or infinite coordinate",
        "zero_area": "polygon has zero area",
        "segmentation_invalid": "polygon holds something other than numbers",
    }[key]


def _numeric_fallback(
    coords: list[Any], first: np.ndarray, reason: np.ndarray, details: dict[int, str]
) -> np.ndarray:
    """Find the annotations whose coordinates are not numbers; fill theirs with a placeholder."""
    ends = list(first[1:]) + [len(coords)]
    out = np.zeros(len(coords), np.float64)
    for k, (s, e) in enumerate(zip(first, ends)):
        values = coords[s:e]
        if all(type(v) is float or (type(v) is int and abs(v) < 2**53) for v in values):
            out[s:e] = values
        else:
            out[s:e] = 1.0  # placeholder; the annotation is reported and dropped
            _mark(reason, np.arange(len(reason)) == k, "segmentation_invalid")
            details[k] = "polygon holds something other than numbers"
    return out


def _assemble(
    chunks: list[dict[str, np.ndarray]], crowd: dict[str, list[Any]], num_images: int
) -> dict[str, np.ndarray]:
    """Concatenate chunks and sort instances by image (file order within an image)."""
    if chunks:
        cat = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0] if k != "vertices"}
        if all(c["vertices"].dtype == np.int32 for c in chunks):
            vertices = np.concatenate([c["vertices"] for c in chunks])
            scale = _VERTEX_SCALE
        else:
            parts = [c["vertices"] / _VERTEX_SCALE if c["vertices"].dtype == np.int32 else c["vertices"]
                     for c in chunks]
            vertices, scale = np.concatenate(parts), 0
    else:
        cat = {
            "img": np.zeros(0, np.int64), "labels": np.zeros(0, np.int64),
            "annotation_ids": np.zeros(0, np.int64), "bboxes": np.zeros((0, 4)), "areas": np.zeros(0),
            "nrings": np.zeros(0, np.int64), "ring_lens": np.zeros(0, np.int64),
        }
        vertices, scale = np.zeros((0, 2), np.int32), _VERTEX_SCALE
    img, nrings, ring_lens = cat["img"], cat["nrings"], cat["ring_lens"]
    order = np.argsort(img, kind="stable")
    if np.any(order != np.arange(len(order))):
        ring_idx = ragged_index(offsets_from_lengths(nrings)[:-1][order], nrings[order])
        vertex_idx = ragged_index(offsets_from_lengths(ring_lens)[:-1][ring_idx], ring_lens[ring_idx])
        vertices = vertices[vertex_idx]
        ring_lens = ring_lens[ring_idx]
        nrings = nrings[order]
        img = img[order]
        cat = {k: v[order] for k, v in cat.items() if k not in ("img", "nrings", "ring_lens")}
    tables = {
        "instance_offsets": offsets_from_lengths(np.bincount(img, minlength=num_images)),
        "labels": cat["labels"],
        "annotation_ids": cat["annotation_ids"],
        "bboxes": cat["bboxes"].reshape(-1, 4),
        "areas": cat["areas"],
        "instance_ring_offsets": offsets_from_lengths(nrings),
        "ring_offsets": offsets_from_lengths(ring_lens),
        "vertices": vertices.reshape(-1, 2),
        "vertex_scale": np.asarray(scale, np.int64),
    }
    # Crowd regions: few, assembled from lists.
    c_img = np.asarray(crowd["img"], np.int64)
    c_order = np.argsort(c_img, kind="stable")
    rles = [crowd["rle"][k] for k in c_order]
    tables.update(
        crowd_offsets=offsets_from_lengths(np.bincount(c_img, minlength=num_images)),
        crowd_labels=np.asarray(crowd["label"], np.int64)[c_order],
        crowd_annotation_ids=np.asarray(crowd["id"], np.int64)[c_order],
        crowd_bboxes=np.asarray(crowd["bbox"], np.float64).reshape(-1, 4)[c_order],
        crowd_areas=np.asarray(crowd["area"], np.float64)[c_order],
        crowd_rle_offsets=offsets_from_lengths(np.fromiter((len(r) for r in rles), np.int64, len(rles))),
        crowd_rle_bytes=np.frombuffer(b"".join(rles), np.uint8).copy(),
    )
    return tables


# --------------------------------------------------------------------------------------------
# Cache


def default_cache_dir() -> Path:
    """Where indexes are cached when ``cache_dir`` is None: ``cache_root() / "coco_index"``."""
    return cache_root() / "coco_index"


def _cache_key(ann_file: Path) -> dict[str, Any]:
    st = ann_file.stat()
    return {
        "version": CACHE_FORMAT_VERSION, "ann_file": str(ann_file), "size": st.st_size,
        # A copy that keeps the old mtime (cp -p, rsync -a) still changes ctime and the inode.
        "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino,
    }


def _cache_path(cache_dir: Path, ann_file: Path) -> Path:
    digest = hashlib.sha256(str(ann_file).encode("utf-8")).hexdigest()[:16]
    return cache_dir / f"{ann_file.stem}-{digest}.npz"


_TABLE_KEYS = (
    "image_ids", "heights", "widths", "file_name_bytes", "file_name_offsets", "instance_offsets",
    "crowd_offsets", "labels", "annotation_ids", "bboxes", "areas", "instance_ring_offsets",
    "ring_offsets", "vertices", "vertex_scale", "crowd_labels", "crowd_annotation_ids",
    "crowd_bboxes", "crowd_areas", "crowd_rle_offsets", "crowd_rle_bytes", "category_ids",
)


def _read_cache(path: Path, key: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The cached tables, or None when absent, stale or unreadable (then it is rebuilt)."""
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as f, np.load(f, allow_pickle=False) as npz:
            meta = json.loads(npz["meta"].tobytes().decode("utf-8"))
            if meta.get("key") != dict(key):
                _log.info("index cache %s is stale (annotation file changed); rebuilding", path)
                return None
            tables = {k: npz[k] for k in _TABLE_KEYS}
    except Exception as err:  # noqa: BLE001 - any failure to read means: rebuild
        _log.warning("index cache %s is unreadable (%s: %s); rebuilding", path, type(err).__name__, err)
        return None
    return tables, meta


def _write_cache(path: Path, tables: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> bool:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                blob = np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8)
                np.savez(f, meta=blob, **{k: tables[k] for k in _TABLE_KEYS})
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as err:
        _log.warning("cannot write the index cache %s (%s); continuing without it", path, err)
        return False
    return True


# --------------------------------------------------------------------------------------------
# The index


class CocoIndex:
    """Flat numpy arrays of one COCO split: images, target instances as polygons, crowd RLE.

    Build it with :meth:`build`. Per image ``i`` (``0 <= i < len(index)``) the target instances
    are contiguous, in file order; crowd regions are kept apart. Everything is a numpy array or
    a small container (class names, counts), so the index pickles cheaply and forked workers
    share its pages.

    Attributes:
        ann_file (Path): the annotation file.
        image_root (Path): folder the images' ``file_name`` are relative to.
        from_cache (bool): whether :meth:`build` loaded the arrays from the cache.
        cache_path (Path | None): the cache file used or written, None without a cache.
        dropped_counts (dict[str, int]): what the options left out, not counted as skips:
            ``"crowd_dropped"`` (crowd annotations, by ``drop_crowd`` or with an image dropped
            by ``drop_empty``) and ``"image_empty_dropped"`` (images, by ``drop_empty``). Merged
            with :attr:`skip_counts` it accounts for every JSON entry not delivered.
    """

    def __init__(
        self,
        tables: Mapping[str, np.ndarray],
        meta: Mapping[str, Any],
        *,
        ann_file: str | os.PathLike[str],
        image_root: str | os.PathLike[str],
    ) -> None:
        missing = [k for k in _TABLE_KEYS if k not in tables]
        if missing:
            raise ValueError(f"tables lack {missing}")
        self._t = {k: np.asarray(tables[k]) for k in _TABLE_KEYS}
        self.ann_file = Path(ann_file)
        self.image_root = Path(image_root)
        self._class_names = list(meta["class_names"])
        self._skip_counts = {str(k): int(v) for k, v in meta.get("skip_counts", {}).items() if v}
        self._skip_examples = {str(k): list(v) for k, v in meta.get("skip_examples", {}).items()}
        self._first_problem = meta.get("first_problem")
        self.dropped_counts = {"crowd_dropped": 0, "image_empty_dropped": 0}
        self.from_cache = False
        self.cache_path: Path | None = None

    # -- building ----------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        ann_file: str | os.PathLike[str],
        image_root: str | os.PathLike[str],
        *,
        on_bad_sample: Literal["raise", "skip"] = "raise",
        drop_crowd: bool = False,
        drop_empty: bool = False,
        verify_images: bool = False,
        cache_dir: str | os.PathLike[str] | None = None,
        use_cache: bool = True,
    ) -> "CocoIndex":
        """Build the index of a COCO annotation file, or load it from the cache.

        Reads only the annotation file (and the cache), never the images, unless
        ``verify_images`` is set.

        Args:
            ann_file: COCO instances JSON.
            image_root: folder holding the images named by ``file_name``.
            on_bad_sample: ``"raise"`` fails on the first problem with a message naming the file
                and ids; ``"skip"`` leaves bad entries out, counts them by reason
                (:attr:`skip_counts`) and logs a summary once.
            drop_crowd: leave crowd (``iscrowd=1``) regions out; :meth:`crowd_mask` then
                returns None.
            drop_empty: leave out images without a target instance (kept as negatives by
                default). Applied after ``drop_crowd``; crowd-only images count as empty.
            verify_images: decode every image now (threads) and check its size against the
                JSON; bad images raise, or in skip mode are left out and counted.
            cache_dir: folder of the cache (see the module docstring); None: :func:`default_cache_dir`.
            use_cache: read and write the cache at all.

        Returns:
            the index.

        Raises:
            ValueError: ``on_bad_sample`` is neither ``"raise"`` nor ``"skip"``.
            TypeError: a flag is not a bool.
            FileNotFoundError: ``ann_file`` does not exist.
            BadAnnotationError: a problem in the JSON (always for structural problems; in
                ``"raise"`` mode for every problem).
            BadImageError: ``verify_images`` in ``"raise"`` mode found a bad image.
        """
        if on_bad_sample not in ("raise", "skip"):
            raise ValueError(f"on_bad_sample must be 'raise' or 'skip', got {on_bad_sample!r}")
        for name, value in (("drop_crowd", drop_crowd), ("drop_empty", drop_empty),
                            ("verify_images", verify_images), ("use_cache", use_cache)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
        ann_path = Path(ann_file).absolute()
        if not ann_path.is_file():
            raise FileNotFoundError(f"annotation file {ann_path} does not exist")

        # 1. Cached arrays, or a build from the JSON (then cached).
        loaded, cache_path, key = None, None, None
        if use_cache:
            key = _cache_key(ann_path)
            folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
            cache_path = _cache_path(folder, ann_path)
            loaded = _read_cache(cache_path, key)
        if loaded is None and cache_path is not None:
            # DDP ranks (and the CLI, which reads num_classes in every rank) start together: one
            # builds, the others wait and read its cache instead of each parsing the JSON.
            with file_lock(cache_path.with_name(cache_path.name + ".lock")):
                loaded = _read_cache(cache_path, key)
                if loaded is None:
                    tables, meta = _build_tables(ann_path, on_bad_sample)
                    meta = {**meta, "key": key}
                    if not _write_cache(cache_path, tables, meta):
                        cache_path = None
            from_cache = loaded is not None
        elif loaded is None:
            tables, meta = _build_tables(ann_path, on_bad_sample)
            from_cache = False
        else:
            from_cache = True
        if loaded is not None:
            tables, meta = loaded
        index = cls(tables, meta, ann_file=ann_path, image_root=image_root)
        index.from_cache, index.cache_path = from_cache, cache_path

        # 2. A cache built in skip mode records its problems; raise mode raises the first.
        if on_bad_sample == "raise" and index._first_problem is not None:
            raise _error_from_first(index._first_problem, ann_path)

        # 3. Options applied on the loaded arrays, so one cache serves them all.
        if verify_images:
            index = index._verified(on_bad_sample)
        if drop_crowd:
            index = index._without_crowd()
        if drop_empty:
            index = index._select(index.instance_counts > 0, count_empty=True)
        if index._skip_counts:
            example = next(iter(index._skip_examples.values()), [""])[0]
            _log.warning("%s: %s; e.g. %s", ann_path, format_skip_summary(index._skip_counts), example)
        return index

    def _replace(self, tables: Mapping[str, np.ndarray]) -> "CocoIndex":
        new = CocoIndex.__new__(CocoIndex)
        new.__dict__.update(self.__dict__)
        new._t = dict(tables)
        new._skip_counts = dict(self._skip_counts)
        new._skip_examples = {k: list(v) for k, v in self._skip_examples.items()}
        new.dropped_counts = dict(self.dropped_counts)
        return new

    def _select(self, keep: np.ndarray, *, count_empty: bool = False) -> "CocoIndex":
        """The index restricted to the images where ``keep`` (bool[I]) is True."""
        t = self._t
        keep = np.asarray(keep, bool)
        images = np.flatnonzero(keep)
        new = {k: t[k][images] for k in ("image_ids", "heights", "widths")}
        name_off = t["file_name_offsets"]
        name_lens = np.diff(name_off)[images]
        new["file_name_bytes"] = t["file_name_bytes"][ragged_index(name_off[images], name_lens)]
        new["file_name_offsets"] = offsets_from_lengths(name_lens)
        # Target instances, their rings and vertices.
        inst_off = t["instance_offsets"]
        per_image = np.diff(inst_off)[images]
        inst = ragged_index(inst_off[images], per_image)
        new["instance_offsets"] = offsets_from_lengths(per_image)
        for k in ("labels", "annotation_ids", "bboxes", "areas"):
            new[k] = t[k][inst]
        ring_off = t["instance_ring_offsets"]
        nrings = np.diff(ring_off)[inst]
        rings = ragged_index(ring_off[inst], nrings)
        new["instance_ring_offsets"] = offsets_from_lengths(nrings)
        vert_off = t["ring_offsets"]
        rlens = np.diff(vert_off)[rings]
        new["ring_offsets"] = offsets_from_lengths(rlens)
        new["vertices"] = t["vertices"][ragged_index(vert_off[rings], rlens)]
        # Crowd regions.
        crowd_off = t["crowd_offsets"]
        crowd_per_image = np.diff(crowd_off)[images]
        crowd = ragged_index(crowd_off[images], crowd_per_image)
        new["crowd_offsets"] = offsets_from_lengths(crowd_per_image)
        for k in ("crowd_labels", "crowd_annotation_ids", "crowd_bboxes", "crowd_areas"):
            new[k] = t[k][crowd]
        rle_off = t["crowd_rle_offsets"]
        rle_lens = np.diff(rle_off)[crowd]
        new["crowd_rle_bytes"] = t["crowd_rle_bytes"][ragged_index(rle_off[crowd], rle_lens)]
        new["crowd_rle_offsets"] = offsets_from_lengths(rle_lens)
        new["vertex_scale"] = t["vertex_scale"]
        new["category_ids"] = t["category_ids"]
        out = self._replace(new)
        if count_empty:
            out.dropped_counts["image_empty_dropped"] += int((~keep).sum())
            out.dropped_counts["crowd_dropped"] += int(np.diff(crowd_off)[~keep].sum())
        return out

    def _without_crowd(self) -> "CocoIndex":
        t = dict(self._t)
        dropped = len(t["crowd_annotation_ids"])
        t.update(
            crowd_offsets=np.zeros(self.num_images + 1, np.int64),
            crowd_labels=np.zeros(0, np.int64),
            crowd_annotation_ids=np.zeros(0, np.int64),
            crowd_bboxes=np.zeros((0, 4)),
            crowd_areas=np.zeros(0),
            crowd_rle_offsets=np.zeros(1, np.int64),
            crowd_rle_bytes=np.zeros(0, np.uint8),
        )
        out = self._replace(t)
        out.dropped_counts["crowd_dropped"] += dropped
        return out

    def _verified(self, on_bad_sample: str) -> "CocoIndex":
        """Decode every image; raise on the first bad one, or leave the bad ones out."""

        def check(i: int) -> BadImageError | None:
            try:
                self.load_image(i)
            except BadImageError as err:
                return err
            return None

        workers = min(8, os.cpu_count() or 1)
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            errors = list(pool.map(check, range(self.num_images)))
        bad = [e for e in errors if e is not None]
        if not bad:
            return self
        if on_bad_sample == "raise":
            raise bad[0]
        keep = np.array([e is None for e in errors], bool)
        out = self._select(keep)
        counts = Counter(out._skip_counts)
        for err in bad:
            reason = err.reason or "image_corrupt"
            counts[reason] += 1
            examples = out._skip_examples.setdefault(reason, [])
            if len(examples) < _MAX_EXAMPLES:
                examples.append(str(err))
        counts["annotation_of_skipped_image"] += int(
            self.instance_counts[~keep].sum() + self.crowd_counts[~keep].sum()
        )
        out._skip_counts = {k: v for k, v in counts.items() if v}
        return out

    # -- sizes and metadata ------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._t["image_ids"].shape[0])

    @property
    def num_images(self) -> int:
        """I, the number of images."""
        return len(self)

    @property
    def num_instances(self) -> int:
        """N, the number of target (non-crowd) instances over all images."""
        return int(self._t["labels"].shape[0])

    @property
    def num_crowd(self) -> int:
        """K, the number of crowd regions kept."""
        return int(self._t["crowd_labels"].shape[0])

    @property
    def num_classes(self) -> int:
        """C, the number of categories."""
        return int(self._t["category_ids"].shape[0])

    @property
    def image_ids(self) -> np.ndarray:
        """(ndarray[I] int64) COCO image ids, in file order (read-only view)."""
        return _readonly(self._t["image_ids"])

    @property
    def heights(self) -> np.ndarray:
        """(ndarray[I] int64) image heights from the JSON."""
        return _readonly(self._t["heights"])

    @property
    def widths(self) -> np.ndarray:
        """(ndarray[I] int64) image widths from the JSON."""
        return _readonly(self._t["widths"])

    @property
    def instance_counts(self) -> np.ndarray:
        """(ndarray[I] int64) number of target instances per image."""
        return np.diff(self._t["instance_offsets"])

    @property
    def crowd_counts(self) -> np.ndarray:
        """(ndarray[I] int64) number of crowd regions per image."""
        return np.diff(self._t["crowd_offsets"])

    @property
    def category_ids(self) -> np.ndarray:
        """(ndarray[C] int64) COCO category ids, sorted; label ``k`` is ``category_ids[k]``."""
        return _readonly(self._t["category_ids"])

    @property
    def class_names(self) -> list[str]:
        """Category names by label."""
        return list(self._class_names)

    @property
    def label_of_category(self) -> dict[int, int]:
        """COCO category id -> contiguous label ``0..C-1``."""
        return {int(c): k for k, c in enumerate(self._t["category_ids"])}

    @property
    def skip_counts(self) -> dict[str, int]:
        """Reason -> count of what was skipped at build in skip mode; see :data:`SKIP_REASONS`."""
        return dict(self._skip_counts)

    @property
    def skip_examples(self) -> dict[str, list[str]]:
        """Reason -> the first few messages, naming files and ids."""
        return {k: list(v) for k, v in self._skip_examples.items()}

    def skip_summary(self) -> str:
        """One line of what was skipped (:func:`format_skip_summary`)."""
        return format_skip_summary(self._skip_counts)

    def summary(self) -> str:
        """One line: images, instances, crowd regions, what was skipped and dropped."""
        dropped = ", ".join(f"{k} {v}" for k, v in self.dropped_counts.items() if v)
        return (
            f"{self.ann_file.name}: {self.num_images} images, {self.num_instances} instances, "
            f"{self.num_crowd} crowd regions, {self.num_classes} classes; {self.skip_summary()}"
            + (f"; dropped {dropped}" if dropped else "")
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays."""
        return int(sum(a.nbytes for a in self._t.values()))

    def __repr__(self) -> str:
        return f"CocoIndex({self.summary()}, {self.nbytes / 2**20:.1f} MiB)"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CocoIndex):
            return NotImplemented
        return (
            self.ann_file == other.ann_file
            and self.image_root == other.image_root
            and self._class_names == other._class_names
            and self._skip_counts == other._skip_counts
            and self.dropped_counts == other.dropped_counts
            and all(
                self._t[k].dtype == other._t[k].dtype and np.array_equal(self._t[k], other._t[k])
                for k in _TABLE_KEYS
            )
        )

    __hash__ = None  # type: ignore[assignment]

    # -- per image ---------------------------------------------------------------------------

    def _check_index(self, i: int) -> int:
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            raise TypeError(f"image index must be an int, got {type(i).__name__}")
        if not 0 <= i < len(self):
            raise IndexError(f"image index {i} out of range for {len(self)} images")
        return int(i)

    def file_name(self, i: int) -> str:
        """The ``file_name`` of image ``i`` as in the JSON."""
        i = self._check_index(i)
        off = self._t["file_name_offsets"]
        return self._t["file_name_bytes"][off[i] : off[i + 1]].tobytes().decode("utf-8")

    def file_path(self, i: int) -> Path:
        """``image_root / file_name`` of image ``i``."""
        return self.image_root / self.file_name(i)

    def image_size(self, i: int) -> tuple[int, int]:
        """(H, W) of image ``i`` from the JSON."""
        i = self._check_index(i)
        return int(self._t["heights"][i]), int(self._t["widths"][i])

    def index_of_image_id(self, image_id: int) -> int:
        """Image index of a COCO image id.

        Raises:
            KeyError: no image has that id.
        """
        ids = self._t["image_ids"]
        hits = np.flatnonzero(ids == image_id)
        if hits.size == 0:
            raise KeyError(f"no image with id {image_id} in {self.ann_file}")
        return int(hits[0])

    def polygons(self, i: int) -> Polygons:
        """The target (non-crowd) instances of image ``i``, in original image pixels.

        Returns:
            Polygons: N instances in the order of :meth:`labels` and :meth:`annotation_ids`;
            new arrays (safe to modify). No instance: ``Polygons.empty()``.
        """
        i = self._check_index(i)
        t = self._t
        a, b = int(t["instance_offsets"][i]), int(t["instance_offsets"][i + 1])
        if a == b:
            return Polygons.empty()
        r0, r1 = int(t["instance_ring_offsets"][a]), int(t["instance_ring_offsets"][b])
        v0, v1 = int(t["ring_offsets"][r0]), int(t["ring_offsets"][r1])
        stored = t["vertices"][v0:v1]
        scale = int(t["vertex_scale"])
        vertices = stored / scale if scale else stored.astype(np.float64)
        return Polygons(vertices, t["ring_offsets"][r0 : r1 + 1] - v0, t["instance_ring_offsets"][a : b + 1] - r0)

    def labels(self, i: int) -> np.ndarray:
        """(ndarray[N] int64) contiguous labels of image ``i``'s target instances (a copy)."""
        return self._per_instance("labels", i)

    def annotation_ids(self, i: int) -> np.ndarray:
        """(ndarray[N] int64) COCO annotation ids of image ``i``'s target instances (a copy)."""
        return self._per_instance("annotation_ids", i)

    def _per_instance(self, key: str, i: int) -> np.ndarray:
        i = self._check_index(i)
        off = self._t["instance_offsets"]
        return self._t[key][off[i] : off[i + 1]].copy()

    def bboxes(self, i: int) -> np.ndarray:
        """(ndarray[N, 4] float64) the JSON's ``[x, y, w, h]`` boxes of image ``i``'s target instances."""
        return self._per_instance("bboxes", i)

    def crowd_annotation_ids(self, i: int) -> np.ndarray:
        """(ndarray[K_i] int64) annotation ids of image ``i``'s crowd regions."""
        i = self._check_index(i)
        off = self._t["crowd_offsets"]
        return self._t["crowd_annotation_ids"][off[i] : off[i + 1]].copy()

    def crowd_mask(self, i: int) -> np.ndarray | None:
        """Union of image ``i``'s crowd regions, decoded from RLE with pycocotools.

        Returns:
            ndarray[H, W] bool at the JSON's size, or None when the image has no crowd region
            (or they were dropped).
        """
        i = self._check_index(i)
        t = self._t
        a, b = int(t["crowd_offsets"][i]), int(t["crowd_offsets"][i + 1])
        if a == b:
            return None
        size = [int(t["heights"][i]), int(t["widths"][i])]
        off, raw = t["crowd_rle_offsets"], t["crowd_rle_bytes"]
        rles = [{"size": size, "counts": raw[off[k] : off[k + 1]].tobytes()} for k in range(a, b)]
        merged = rles[0] if len(rles) == 1 else mask_utils.merge(rles, intersect=0)
        return np.ascontiguousarray(mask_utils.decode(merged), dtype=bool)

    def load_image(self, i: int, reduce: int = 1, *, check_size: bool = True) -> np.ndarray:
        """Decode image ``i`` to RGB ``uint8`` (see :func:`seg_datamodule.images.decode_image`).

        Args:
            i: image index.
            reduce: one of ``(1, 2, 4, 8)``; the result is ``(ceil(H / reduce), ceil(W / reduce))``
                for the JSON's ``(H, W)``, decoded at reduced scale by libjpeg for JPEGs.
            check_size: raise when the file's stored size is not the JSON's (checked exactly at
                any ``reduce``: the stored size is read from the file header).

        Returns:
            ndarray[h, w, 3] uint8 RGB.

        Raises:
            BadImageError: missing, unreadable, truncated, corrupt or wrongly sized file; the
                message names the file, the image id and the annotation file, and the error
                carries ``reason``, ``image_id`` and ``image_index``.
        """
        i = self._check_index(i)
        path = self.file_path(i)
        image_id = int(self._t["image_ids"][i])
        where = f"{self.ann_file}: image id {image_id}"
        try:
            image, stored = decode_image_with_size(path, reduce=reduce)
        except BadImageError as err:
            raise BadImageError(
                f"{where}: {err}", path=path, reason=err.reason, image_id=image_id, image_index=i
            ) from None
        expected = self.image_size(i)
        if check_size and stored != expected:
            raise BadImageError(
                f"{where}: image file {path} is {stored[0]}x{stored[1]} (HxW) but the annotation "
                f"file says {expected[0]}x{expected[1]}; its annotations would be misplaced",
                path=path,
                reason="image_size_mismatch",
                image_id=image_id,
                image_index=i,
            )
        if check_size:
            assert image.shape[:2] == reduced_size(expected, reduce)
        return image


def _readonly(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view

