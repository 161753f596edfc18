"""The index's tables: their names, assembling them, and selecting images or dropping crowd regions on them.

An index is a dict of flat numpy arrays (:data:`TABLE_KEYS`); per image the target instances,
their rings and vertices, and the crowd regions with their RLE bytes are contiguous ragged
segments (see :mod:`seg_datamodule.ops.ragged`). The functions here return new tables and never
modify their input; :func:`check_tables` says whether tables read from disk are consistent.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from pycocotools import mask as mask_utils

from seg_datamodule.io.coco.instances import VERTEX_SCALE, CrowdRegion
from seg_datamodule.io.images.decode import MAX_IMAGE_PIXELS
from seg_datamodule.io.paths import file_name_problem
from seg_datamodule.ops.ragged import offsets_from_lengths, ragged_index
from seg_datamodule.structures import Polygons

__all__ = [
    "FEDERATED_TABLES", "TABLE_KEYS", "assemble", "box_only_chunk", "box_only_mask", "category_presence", "check_tables", "crowd_mask", "crowd_rles",
    "image_polygons", "select_images", "tables_equal", "without_box_only", "without_crowd",
]

#: Every array of an index (also what the cache stores).
TABLE_KEYS = (
    "image_ids", "heights", "widths", "file_name_bytes", "file_name_offsets", "instance_offsets",
    "crowd_offsets", "labels", "annotation_ids", "bboxes", "areas", "instance_ring_offsets",
    "ring_offsets", "vertices", "vertex_scale", "crowd_labels", "crowd_annotation_ids",
    "crowd_bboxes", "crowd_areas", "crowd_rle_offsets", "crowd_rle_bytes", "category_ids",
    # LVIS's federated lists per image, as contiguous labels (empty for COCO files).
    "neg_label_offsets", "neg_labels", "not_exhaustive_label_offsets", "not_exhaustive_labels",
    # Per image, the EXIF orientation applied when decoding (1: as stored, always for COCO files,
    # whose sizes refer to the stored pixels; see seg_datamodule.io.images.exif).
    "orientations",
)

#: The per-image label lists: (offsets key, labels key).
FEDERATED_TABLES = (("neg_label_offsets", "neg_labels"), ("not_exhaustive_label_offsets", "not_exhaustive_labels"))


def assemble(
    chunks: list[dict[str, np.ndarray]], crowd: list[CrowdRegion], num_images: int
) -> dict[str, np.ndarray]:
    """Concatenate chunks and sort instances by image (file order within an image).

    Args:
        chunks: what :func:`~seg_datamodule.io.coco.instances.finish_chunk` returned, in file order.
        crowd: the crowd regions kept, in file order.
        num_images: I.

    Returns:
        the instance and crowd tables of the index (everything but the image and category ones).
    """
    if chunks:
        cat = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0] if k != "vertices"}
        if all(c["vertices"].dtype == np.int32 for c in chunks):
            vertices = np.concatenate([c["vertices"] for c in chunks])
            scale = VERTEX_SCALE
        else:
            parts = [c["vertices"] / VERTEX_SCALE if c["vertices"].dtype == np.int32 else c["vertices"]
                     for c in chunks]
            vertices, scale = np.concatenate(parts), 0
    else:
        cat = {
            "img": np.zeros(0, np.int64), "labels": np.zeros(0, np.int64),
            "annotation_ids": np.zeros(0, np.int64), "bboxes": np.zeros((0, 4)), "areas": np.zeros(0),
            "nrings": np.zeros(0, np.int64), "ring_lens": np.zeros(0, np.int64),
        }
        vertices, scale = np.zeros((0, 2), np.int32), VERTEX_SCALE
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
    # Crowd regions: few, assembled from tuples.
    c_img, c_label, c_id, c_bbox, c_area, c_rle = zip(*crowd) if crowd else ((),) * 6
    c_order = np.argsort(np.asarray(c_img, np.int64), kind="stable")
    rles = [c_rle[k] for k in c_order]
    tables.update(
        crowd_offsets=offsets_from_lengths(np.bincount(np.asarray(c_img, np.int64), minlength=num_images)),
        crowd_labels=np.asarray(c_label, np.int64)[c_order],
        crowd_annotation_ids=np.asarray(c_id, np.int64)[c_order],
        crowd_bboxes=np.asarray(c_bbox, np.float64).reshape(-1, 4)[c_order],
        crowd_areas=np.asarray(c_area, np.float64)[c_order],
        crowd_rle_offsets=offsets_from_lengths(np.fromiter((len(r) for r in rles), np.int64, len(rles))),
        crowd_rle_bytes=np.frombuffer(b"".join(rles), np.uint8).copy(),
    )
    return tables


def select_images(tables: Mapping[str, np.ndarray], keep: np.ndarray) -> dict[str, np.ndarray]:
    """The tables restricted to the images where ``keep`` is True (with their instances and crowd).

    Args:
        tables: an index's tables.
        keep (ndarray[I] bool): images to keep.

    Returns:
        new tables.
    """
    t = tables
    keep = np.asarray(keep, bool)
    images = np.flatnonzero(keep)
    new = {k: t[k][images] for k in ("image_ids", "heights", "widths", "orientations")}
    names, new["file_name_offsets"] = _gather(t["file_name_offsets"], images)
    new["file_name_bytes"] = t["file_name_bytes"][names]
    # Target instances, their rings and vertices.
    inst, new["instance_offsets"] = _gather(t["instance_offsets"], images)
    for k in ("labels", "annotation_ids", "bboxes", "areas"):
        new[k] = t[k][inst]
    rings, new["instance_ring_offsets"] = _gather(t["instance_ring_offsets"], inst)
    vertices, new["ring_offsets"] = _gather(t["ring_offsets"], rings)
    new["vertices"] = t["vertices"][vertices]
    # Crowd regions.
    crowd, new["crowd_offsets"] = _gather(t["crowd_offsets"], images)
    for k in ("crowd_labels", "crowd_annotation_ids", "crowd_bboxes", "crowd_areas"):
        new[k] = t[k][crowd]
    rle, new["crowd_rle_offsets"] = _gather(t["crowd_rle_offsets"], crowd)
    new["crowd_rle_bytes"] = t["crowd_rle_bytes"][rle]
    for offsets_key, labels_key in FEDERATED_TABLES:
        picked, new[offsets_key] = _gather(t[offsets_key], images)
        new[labels_key] = t[labels_key][picked]
    new["vertex_scale"] = t["vertex_scale"]
    new["category_ids"] = t["category_ids"]
    return new


def without_crowd(tables: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tables with every crowd region removed."""
    t = dict(tables)
    t.update(
        crowd_offsets=np.zeros(len(t["image_ids"]) + 1, np.int64),
        crowd_labels=np.zeros(0, np.int64),
        crowd_annotation_ids=np.zeros(0, np.int64),
        crowd_bboxes=np.zeros((0, 4)),
        crowd_areas=np.zeros(0),
        crowd_rle_offsets=np.zeros(1, np.int64),
        crowd_rle_bytes=np.zeros(0, np.uint8),
    )
    return t


def box_only_chunk(rows: Sequence[Sequence[float]]) -> dict[str, np.ndarray]:
    """Box-only annotations as a chunk for :func:`assemble`: instances without a ring.

    Args:
        rows: per annotation ``(image index, label, annotation id, x, y, width, height, area)``
            (a NaN area becomes ``width * height``).

    Returns:
        the chunk's arrays (``img``, ``labels``, ``annotation_ids``, ``bboxes``, ``areas``,
        ``nrings`` all 0, no ring or vertex).
    """
    table = np.asarray(rows, np.float64).reshape(-1, 8)
    area = table[:, 7]
    return {
        "pos": np.zeros(len(table), np.int64), "img": table[:, 0].astype(np.int64), "labels": table[:, 1].astype(np.int64),
        # Ids beyond 2**53 are not exact in float64: take them from the rows themselves.
        "annotation_ids": np.array([int(r[2]) for r in rows], np.int64).reshape(-1),
        "bboxes": table[:, 3:7].copy(), "areas": np.where(np.isfinite(area), area, table[:, 5] * table[:, 6]),
        "nrings": np.zeros(len(table), np.int64), "ring_lens": np.zeros(0, np.int64),
        "vertices": np.zeros((0, 2), np.int32),
    }


def box_only_mask(tables: Mapping[str, np.ndarray]) -> np.ndarray:
    """(ndarray[N] bool) which instances are box-only (a box, no ring)."""
    return np.diff(tables["instance_ring_offsets"]) == 0


def without_box_only(tables: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
    """The tables without their box-only instances (a box and no ring), and how many there were.

    Box-only annotations are stored as instances without a ring, so one cache serves
    ``box_only: keep`` and ``drop``; dropping them removes no ring or vertex.

    Returns:
        (new tables, the number of box-only instances removed).
    """
    t = tables
    nrings = np.diff(t["instance_ring_offsets"])
    keep = ~box_only_mask(t)
    if keep.all():
        return dict(t), 0
    per_image = np.diff(t["instance_offsets"])
    owner = np.repeat(np.arange(len(per_image), dtype=np.int64), per_image)
    new = dict(t)
    new["instance_offsets"] = offsets_from_lengths(np.bincount(owner[keep], minlength=len(per_image)))
    for k in ("labels", "annotation_ids", "bboxes", "areas"):
        new[k] = t[k][keep]
    new["instance_ring_offsets"] = offsets_from_lengths(nrings[keep])
    return new, int((~keep).sum())


def image_polygons(tables: Mapping[str, np.ndarray], i: int) -> Polygons:
    """The target instances of image ``i`` as new float64 arrays (``Polygons.empty()`` if none)."""
    t = tables
    a, b = int(t["instance_offsets"][i]), int(t["instance_offsets"][i + 1])
    if a == b:
        return Polygons.empty()
    r0, r1 = int(t["instance_ring_offsets"][a]), int(t["instance_ring_offsets"][b])
    v0, v1 = int(t["ring_offsets"][r0]), int(t["ring_offsets"][r1])
    stored = t["vertices"][v0:v1]
    scale = int(t["vertex_scale"])
    vertices = stored / scale if scale else stored.astype(np.float64)
    return Polygons(vertices, t["ring_offsets"][r0 : r1 + 1] - v0, t["instance_ring_offsets"][a : b + 1] - r0)


def crowd_rles(tables: Mapping[str, np.ndarray], i: int) -> list[dict[str, Any]]:
    """Image ``i``'s crowd regions as pycocotools RLE objects (compressed counts)."""
    t = tables
    a, b = int(t["crowd_offsets"][i]), int(t["crowd_offsets"][i + 1])
    size = [int(t["heights"][i]), int(t["widths"][i])]
    off, raw = t["crowd_rle_offsets"], t["crowd_rle_bytes"]
    return [{"size": size, "counts": raw[off[k] : off[k + 1]].tobytes()} for k in range(a, b)]


def crowd_mask(tables: Mapping[str, np.ndarray], i: int) -> np.ndarray | None:
    """Union of image ``i``'s crowd regions (ndarray[H, W] bool), or None when it has none."""
    rles = crowd_rles(tables, i)
    if not rles:
        return None
    # Each decoded and or-ed: pycocotools' merge would encode the union, which on an image of
    # 2^24 pixels or more can overflow its encoder (see seg_datamodule.ops.rle).
    mask = np.zeros((int(tables["heights"][i]), int(tables["widths"][i])), bool)
    for rle in rles:
        mask |= mask_utils.decode(rle).astype(bool)
    return mask


def category_presence(tables: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every (image, label) pair with a target instance or a crowd region, sorted, each once."""
    t = tables
    images = np.arange(len(t["image_ids"]), dtype=np.int64)
    owner = np.concatenate([np.repeat(images, np.diff(t["instance_offsets"])),
                            np.repeat(images, np.diff(t["crowd_offsets"]))])
    labels = np.concatenate([t["labels"], t["crowd_labels"]]).astype(np.int64)
    num_classes = max(int(t["category_ids"].shape[0]), 1)
    pairs = np.unique(owner * num_classes + labels)
    return pairs // num_classes, pairs % num_classes


def tables_equal(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    """Whether two indexes' tables hold the same arrays, dtypes included."""
    return all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in TABLE_KEYS)


def check_tables(tables: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> str | None:
    """What is inconsistent in an index's tables and metadata (as read from a cache), or None.

    Checks the metadata's keys and types, every array's dtype and shape, that every offsets
    array starts at 0, never decreases and ends at the length of what it indexes, that labels
    lie in ``0..C-1``, rings have at least 3 vertices, orientations are EXIF's 1..8, image sizes
    are positive and file names are safe UTF-8 (see :func:`~seg_datamodule.io.paths.file_name_problem`).

    Args:
        tables: the arrays, by :data:`TABLE_KEYS`.
        meta: ``class_names``, ``skip_counts``, ``skip_examples``, ``first_problem``, and the
            optional ``dropped_counts`` and ``source_counts`` (counts, like ``skip_counts``).

    Returns:
        the first problem found, as a phrase, or None.
    """
    names = meta.get("class_names")
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        return "class_names missing or not a list of strings"
    examples = meta.get("skip_examples", {})
    for key in ("skip_counts", "dropped_counts", "source_counts"):
        value = meta.get(key, {})
        if not (isinstance(value, dict) and all(type(v) is int and v >= 0 for v in value.values())):
            return f"{key} not a dict of counts"
    if not (isinstance(examples, dict) and all(
        isinstance(v, list) and all(isinstance(m, str) for m in v) for v in examples.values()
    )):
        return "skip_examples not a dict of message lists"
    first = meta.get("first_problem")
    if first is not None and not (
        isinstance(first, dict) and isinstance(first.get("message"), str) and isinstance(first.get("reason"), str)
    ):
        return "first_problem not a recorded problem"
    t = tables
    kinds = {"file_name_bytes": "u", "crowd_rle_bytes": "u", "bboxes": "f", "areas": "f",
             "crowd_bboxes": "f", "crowd_areas": "f", "vertices": "if", "orientations": "u"}
    for key in TABLE_KEYS:
        if key not in t:
            return f"{key} missing"
        if t[key].dtype.kind not in kinds.get(key, "i") or t[key].dtype.hasobject:
            return f"{key} has dtype {t[key].dtype}"
    num_images, num_classes = len(t["image_ids"]), len(t["category_ids"])
    n, k = len(t["labels"]), len(t["crowd_labels"])
    shapes = {
        "image_ids": (num_images,), "heights": (num_images,), "widths": (num_images,), "orientations": (num_images,),
        "category_ids": (len(names),), "vertex_scale": (), "annotation_ids": (n,), "areas": (n,),
        "bboxes": (n, 4), "crowd_annotation_ids": (k,), "crowd_areas": (k,), "crowd_bboxes": (k, 4),
        "vertices": (len(t["vertices"]), 2),
    }
    for key, shape in shapes.items():
        if t[key].shape != shape:
            return f"{key} has shape {t[key].shape}, expected {shape}"
    ragged = (  # offsets, number of segments, what they index
        ("file_name_offsets", num_images, "file_name_bytes"), ("instance_offsets", num_images, "labels"),
        ("crowd_offsets", num_images, "crowd_labels"), ("instance_ring_offsets", n, "ring_offsets"),
        ("ring_offsets", None, "vertices"), ("crowd_rle_offsets", k, "crowd_rle_bytes"),
        *((offsets_key, num_images, labels_key) for offsets_key, labels_key in FEDERATED_TABLES),
    )
    for key, segments, target in ragged:
        off, end = t[key], len(t[target]) - (1 if target == "ring_offsets" else 0)
        if off.ndim != 1 or (segments is not None and len(off) != segments + 1):
            return f"{key} has shape {off.shape}"
        if len(off) == 0 or off[0] != 0 or off[-1] != end or (np.diff(off) < 0).any():
            return f"{key} does not run from 0 to {end} without decreasing"
    if (np.diff(t["ring_offsets"]) < 3).any():
        return "a ring has fewer than 3 vertices"
    if int(t["vertex_scale"]) not in (0, 100) or (int(t["vertex_scale"]) == 0) != (t["vertices"].dtype.kind == "f"):
        return f"vertex_scale {t['vertex_scale']} does not match vertices of dtype {t['vertices'].dtype}"
    for key in ("labels", "crowd_labels", *(labels_key for _, labels_key in FEDERATED_TABLES)):
        if len(t[key]) and not (0 <= t[key].min() and t[key].max() < num_classes):
            return f"{key} outside 0..{num_classes - 1}"
    if len(t["orientations"]) and not ((t["orientations"] >= 1) & (t["orientations"] <= 8)).all():
        return "an orientation is not an EXIF orientation 1..8"
    heights, widths = t["heights"], t["widths"]
    if len(heights) and (
        (heights < 1).any() or (widths < 1).any() or (heights > MAX_IMAGE_PIXELS).any()
        or (widths > MAX_IMAGE_PIXELS).any() or (heights * widths > MAX_IMAGE_PIXELS).any()
    ):
        return "an image size is not positive or too large"
    return _check_file_names(t["file_name_bytes"], t["file_name_offsets"])


def _check_file_names(raw: np.ndarray, offsets: np.ndarray) -> str | None:
    """Whether every file name is non-empty safe UTF-8; vectorised, names with '..' one by one."""
    if len(offsets) < 2:
        return None
    if (np.diff(offsets) < 1).any():
        return "a file name is empty"
    if (raw == 0).any() or (raw[offsets[:-1]] == ord("/")).any():
        return "a file name is absolute or has a NUL byte"
    blob = raw.tobytes()
    try:
        blob.decode("utf-8")
    except UnicodeDecodeError:
        return "file names are not UTF-8"
    dots = np.flatnonzero((raw[:-1] == ord(".")) & (raw[1:] == ord(".")))
    for i in np.unique(np.searchsorted(offsets, dots, side="right") - 1):
        try:
            problem = file_name_problem(blob[offsets[i] : offsets[i + 1]].decode("utf-8"))
        except UnicodeDecodeError:
            problem = "is not UTF-8"
        if problem is not None:
            return f"file name of image {i} {problem}"
    return None


def _gather(offsets: np.ndarray, segments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The elements of the chosen segments, and the offsets of those segments once gathered.

    Args:
        offsets (ndarray[K + 1] int64): segment boundaries.
        segments (ndarray[M] int64): the segments to keep, in order.

    Returns:
        element indices (int64[sum of their lengths]) and new offsets (int64[M + 1]).
    """
    lengths = np.diff(offsets)[segments]
    return ragged_index(offsets[segments], lengths), offsets_from_lengths(lengths)
