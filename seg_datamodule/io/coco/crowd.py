"""Crowd regions that are really objects: the CVAT trap, named, and ``crowd_as_instances``.

COCO marks a region of many objects (a crowd) ``iscrowd=1``; every COCO trainer, this one
included, ignores such regions in the loss (``ignore_masks``) and evaluation matches nothing to
them. Some annotation tools export every mask that way: CVAT's COCO export writes each mask as
RLE with ``iscrowd: 1``. Trained on such a file, a model learns from no mask at all, and only a
count in the end-of-fit report hints at it. So:

* :func:`crowd_trap_message`: when most of a file's annotations are crowd regions, the warning
  that names the file, the share and the fix (``CocoIndex.build`` warns it once per file);
* :func:`crowd_to_instances`: ``crowd_as_instances: true`` turns every crowd region into a target
  instance, converted to exact polygons by :func:`~seg_datamodule.ops.rle.mask_to_rings` as
  non-crowd RLE is (filling the rings at pixel centres gives the RLE mask back bit for bit), with
  its label, annotation id, box and area. Applied on the loaded tables, so one cache serves both
  settings; the conversion is paid at each build (about a millisecond per region);
* :func:`crowd_as_instances_dict`: the same choice for the evaluation's ground truth, so a
  validation or test split read with ``crowd_as_instances`` scores the regions as instances.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping

import numpy as np
from pycocotools import mask as mask_utils

from seg_datamodule.io.coco.instances import VERTEX_SCALE
from seg_datamodule.io.coco.tables import assemble
from seg_datamodule.ops.rle import mask_to_rings

__all__ = ["CROWD_TRAP_SHARE", "CrowdShareWarning", "crowd_as_instances_dict", "crowd_to_instances", "crowd_trap_message", "warn_crowd_trap"]

#: Above this share of crowd regions among a file's annotations, the file is probably such an export.
CROWD_TRAP_SHARE = 0.5

_warned: set[str] = set()  # the files warned about in this process


class CrowdShareWarning(UserWarning):
    """Most annotations of a file are crowd regions, which are never trained on."""


def crowd_trap_message(ann_file: str, instances: int, crowd: int) -> str | None:
    """The warning for a file whose annotations are mostly crowd regions, or None.

    Args:
        ann_file: the annotation file, named in the message.
        instances: its target (non-crowd) instances kept.
        crowd: its crowd regions (kept or dropped by ``drop_crowd``).

    Returns:
        the message when ``crowd`` is more than :data:`CROWD_TRAP_SHARE` of all of them, else None.
    """
    total = instances + crowd
    if total == 0 or crowd <= CROWD_TRAP_SHARE * total:
        return None
    return (
        f"{ann_file}: {crowd} of {total} annotations ({crowd / total:.0%}) are crowd regions (iscrowd=1), which are "
        "only ignored, never trained on or scored; annotation tools such as CVAT export every mask that way. If they "
        "are objects, set crowd_as_instances: true (COCOSegDataModule(crowd_as_instances=True), "
        "seg-datamodule convert --crowd-as-instances) to train on them as instances"
    )


def warn_crowd_trap(ann_file: str, instances: int, crowd: int) -> bool:
    """Warn :func:`crowd_trap_message` once per file and process; whether this call warned."""
    message = crowd_trap_message(ann_file, instances, crowd)
    if message is None or ann_file in _warned:
        return False
    _warned.add(ann_file)
    warnings.warn(message, CrowdShareWarning, stacklevel=3)
    return True


def crowd_as_instances_dict(data: dict[str, Any]) -> dict[str, Any]:
    """A COCO instances dict with every crowd region an instance (``iscrowd: 0``, its RLE mask kept).

    ``pycocotools`` scores an ``iscrowd: 0`` annotation given as RLE by its mask, as it does a
    polygon, so these are scored as the instances ``crowd_as_instances`` trains on.

    Args:
        data: the parsed JSON (not modified).

    Returns:
        a new dict, or ``data`` itself when it has no crowd region.
    """
    annotations = data.get("annotations") or []
    if not any(isinstance(a, dict) and a.get("iscrowd") for a in annotations):
        return data
    return {**data, "annotations": [{**a, "iscrowd": 0} if isinstance(a, dict) and a.get("iscrowd") else a
                                    for a in annotations]}


def crowd_to_instances(tables: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
    """The tables with every crowd region turned into a target instance of its image.

    Each image keeps its own target instances first, then its former crowd regions in file order.

    Args:
        tables: an index's tables (see :mod:`~seg_datamodule.io.coco.tables`).

    Returns:
        (new tables without crowd regions, how many regions were converted).
    """
    t = tables
    crowd = int(t["crowd_labels"].shape[0])
    if crowd == 0:
        return dict(t), 0
    num_images = int(t["image_ids"].shape[0])
    owner = np.repeat(np.arange(num_images, dtype=np.int64), np.diff(t["crowd_offsets"]))
    rle_off, rle_bytes = t["crowd_rle_offsets"], t["crowd_rle_bytes"]
    rings: list[np.ndarray] = []
    nrings = np.zeros(crowd, np.int64)
    for k in range(crowd):
        i = int(owner[k])
        rle = {"size": [int(t["heights"][i]), int(t["widths"][i])],
               "counts": rle_bytes[rle_off[k] : rle_off[k + 1]].tobytes()}
        # The index refused crowd regions without a pixel: each gives one ring or more.
        region = mask_to_rings(mask_utils.decode(rle).astype(bool))
        rings.extend(region)
        nrings[k] = len(region)
    vertices = np.concatenate(rings) if rings else np.zeros((0, 2))
    # Pixel corners: exact in hundredths while they fit int32 (the index's usual storage).
    if vertices.size and np.abs(vertices).max() * VERTEX_SCALE >= 2**31 - 1:
        converted_vertices = vertices
    else:
        converted_vertices = np.rint(vertices * VERTEX_SCALE).astype(np.int32)
    own = {
        "img": np.repeat(np.arange(num_images, dtype=np.int64), np.diff(t["instance_offsets"])),
        "labels": t["labels"], "annotation_ids": t["annotation_ids"], "bboxes": t["bboxes"], "areas": t["areas"],
        "nrings": np.diff(t["instance_ring_offsets"]), "ring_lens": np.diff(t["ring_offsets"]),
        "vertices": t["vertices"] if int(t["vertex_scale"]) else np.asarray(t["vertices"], np.float64),
    }
    converted = {
        "img": owner, "labels": t["crowd_labels"], "annotation_ids": t["crowd_annotation_ids"],
        "bboxes": t["crowd_bboxes"], "areas": t["crowd_areas"], "nrings": nrings,
        "ring_lens": np.array([len(r) for r in rings], np.int64), "vertices": converted_vertices,
    }
    new = dict(t)
    new.update(assemble([own, converted], [], num_images))
    return new, crowd
