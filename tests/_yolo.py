"""Ultralytics YOLO-seg datasets made by the tests from COCO files (coco-mini), and the COCO JSON of the same polygons.

:func:`write_yolo_split` writes one split in Ultralytics' layout (``images/<split>/`` linking the
COCO images, ``labels/<split>/*.txt``): one line per non-crowd polygon annotation, its first ring
(a label line is one polygon), the class being the category's position among the sorted ids, each
coordinate ``repr(x / W)``. :func:`coco_of_yolo_split` is the COCO JSON carrying exactly the
polygons a reader of those lines gets (``float(text) * W`` in float64), with the ids the YOLO index
gives (image id = the file stem, annotation ids counted from 1 in index order), so the two sources
can be compared bit for bit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np


def write_yolo_split(coco_json: Path, image_dir: Path, root: Path, split: str, *, limit: int | None = None) -> list[str]:
    """Write ``root/images/<split>`` (links) and ``root/labels/<split>``; returns the category names.

    Args:
        coco_json: a COCO instances file.
        image_dir: its images.
        root: the dataset root.
        split: the folder name under ``images/`` and ``labels/``.
        limit: only the first ``limit`` images (sorted by file name).
    """
    data = json.loads(Path(coco_json).read_text())
    category_ids = sorted(c["id"] for c in data["categories"])
    label_of = {c: k for k, c in enumerate(category_ids)}
    names = {c["id"]: c["name"] for c in data["categories"]}
    images = sorted(data["images"], key=lambda im: im["file_name"])[:limit]
    lines: dict[int, list[str]] = {im["id"]: [] for im in images}
    sizes = {im["id"]: (im["width"], im["height"]) for im in images}
    for ann in data["annotations"]:
        if ann["image_id"] not in lines or ann.get("iscrowd") or not isinstance(ann["segmentation"], list):
            continue
        w, h = sizes[ann["image_id"]]
        ring = np.asarray(ann["segmentation"][0], np.float64).reshape(-1, 2) / [w, h]
        lines[ann["image_id"]].append(" ".join([str(label_of[ann["category_id"]]), *map(repr, ring.ravel().tolist())]))
    (root / "images" / split).mkdir(parents=True, exist_ok=True)
    (root / "labels" / split).mkdir(parents=True, exist_ok=True)
    for im in images:
        link = root / "images" / split / im["file_name"]
        if not link.exists():
            link.symlink_to((Path(image_dir) / im["file_name"]).resolve())
        (root / "labels" / split / (Path(im["file_name"]).stem + ".txt")).write_text("\n".join(lines[im["id"]]) + "\n")
    return [names[c] for c in category_ids]


def write_data_yaml(root: Path, names: list[str], **splits: str) -> Path:
    """``root/data.yaml`` naming ``splits`` (``train="images/train2017"``, ...) and ``names`` as a dict."""
    text = [f"path: {root}"] + [f"{k}: {v}" for k, v in splits.items()] + ["names:"]
    text += [f"  {k}: {json.dumps(name)}" for k, name in enumerate(names)]
    path = root / "data.yaml"
    path.write_text("\n".join(text) + "\n")
    return path


def coco_of_yolo_split(root: Path, split: str, names: list[str]) -> dict[str, Any]:
    """The COCO JSON of a split :func:`write_yolo_split` wrote: the same float64 polygons and ids."""
    import cv2

    images, annotations = [], []
    next_id = 1
    for image in sorted((root / "images" / split).iterdir(), key=lambda p: str(p)):
        height, width = cv2.imread(str(image), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION).shape[:2]
        images.append({"id": int(image.stem), "file_name": image.name, "height": height, "width": width})
        label = root / "labels" / split / (image.stem + ".txt")
        for line in label.read_text().split("\n") if label.exists() else []:
            if not line.strip():
                continue
            cls, *coords = line.split()
            xy = np.asarray([float(c) for c in coords], np.float64).reshape(-1, 2) * [width, height]
            box = [*xy.min(0).tolist(), *(xy.max(0) - xy.min(0)).tolist()]
            annotations.append({"id": next_id, "image_id": int(image.stem), "category_id": int(cls),
                                "segmentation": [xy.ravel().tolist()], "bbox": box, "area": 1.0, "iscrowd": 0})
            next_id += 1
    return {"images": images, "annotations": annotations,
            "categories": [{"id": k, "name": n} for k, n in enumerate(names)]}


def make_yolo_root(coco_mini: Path, root: Path) -> Path:
    """coco-mini as an Ultralytics dataset: ``root/data.yaml`` with train (train2017) and val (val2017)."""
    names = []
    for split in ("train2017", "val2017"):
        names = write_yolo_split(coco_mini / "annotations" / f"instances_{split}.json", coco_mini / split, root, split)
    return write_data_yaml(root, names, train="images/train2017", val="images/val2017")


def rotate_with_exif(src: Path, dst: Path, orientation: int) -> None:
    """Store ``src``'s pixels turned back so that EXIF ``orientation`` shows them as ``src`` (a phone's JPEG)."""
    from PIL import Image

    undo = {6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270, 3: Image.Transpose.ROTATE_180}[orientation]
    exif = Image.Exif()
    exif[0x0112] = orientation
    with Image.open(src) as image:
        stored = image.transpose(undo)
    if dst.exists() or dst.is_symlink():
        os.unlink(dst)
    stored.save(dst, "JPEG", quality=95, exif=exif.tobytes())
