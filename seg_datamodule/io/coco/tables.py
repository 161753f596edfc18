"""The index's tables: their names, and selecting images or dropping crowd regions on them.

An index is a dict of flat numpy arrays (:data:`TABLE_KEYS`); per image the target instances,
their rings and vertices, and the crowd regions with their RLE bytes are contiguous ragged
segments (see :mod:`seg_datamodule.ops.ragged`). The functions here return new tables and never
modify their input.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from seg_datamodule.ops.ragged import offsets_from_lengths, ragged_index
from seg_datamodule.structures import Polygons

__all__ = ["TABLE_KEYS", "crowd_rles", "image_polygons", "select_images", "without_crowd"]

#: Every array of an index (also what the cache stores).
TABLE_KEYS = (
    "image_ids", "heights", "widths", "file_name_bytes", "file_name_offsets", "instance_offsets",
    "crowd_offsets", "labels", "annotation_ids", "bboxes", "areas", "instance_ring_offsets",
    "ring_offsets", "vertices", "vertex_scale", "crowd_labels", "crowd_annotation_ids",
    "crowd_bboxes", "crowd_areas", "crowd_rle_offsets", "crowd_rle_bytes", "category_ids",
)


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

