"""``make_dataset``: a ``SegDataset`` from the flat augmentation keywords, so test call sites stay short.

``SegDataset`` takes its augmentation as one :class:`~seg_datamodule.data.options.AugmentOptions`
whose geometry fixes the canvas size; what to do with a bad image is the index's
``on_bad_sample``, so it is not a keyword here either (build the index with it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from seg_datamodule.data.dataset import ImageIndex, SegDataset
from seg_datamodule.data.options import AugmentOptions
from seg_datamodule.transforms.augment import MosaicAffine
from seg_datamodule.transforms.lsj import LargeScaleJitter


def augment_options(
    image_size: int | None = None, *, geometry: MosaicAffine | LargeScaleJitter | None = None, **fields: Any
) -> AugmentOptions:
    """``AugmentOptions(geometry, **fields)``; without ``geometry``, YOLO's ``MosaicAffine(image_size)``.

    Args:
        image_size: the canvas side (default: the geometry's, else 640).
        geometry: the geometry, whose ``image_size`` must then be ``image_size`` when both are given.
        **fields: the other :class:`AugmentOptions` fields (``mosaic``, ``transforms``, ``hsv``, ...).
    """
    if geometry is None:
        geometry = MosaicAffine(image_size=640 if image_size is None else image_size)
    elif image_size is not None and image_size != geometry.image_size:
        raise ValueError(f"image_size {image_size} differs from geometry.image_size {geometry.image_size}")
    return AugmentOptions(geometry, **fields)


def make_dataset(
    index: ImageIndex,
    image_size: int | None = None,
    *,
    geometry: MosaicAffine | LargeScaleJitter | None = None,
    train: bool = True,
    seed: int = 0,
    cache_images: int = 0,
    max_epochs: int | None = None,
    max_retries: int = 10,
    **augment: Any,
) -> SegDataset:
    """``SegDataset(index, augment_options(image_size, geometry=geometry, **augment), ...)``."""
    return SegDataset(index, augment_options(image_size, geometry=geometry, **augment), train=train, seed=seed,
                      cache_images=cache_images, max_epochs=max_epochs, max_retries=max_retries)


def tile_coco_root(src: Path, dst: Path, copies: int) -> Path:
    """A COCO root of ``copies`` copies of every image of ``src`` (``annotations/``, ``*2017/``).

    Copy ``k`` of an image is its file under a new name and id (``id + k * 10**7``), with its
    annotations under new ids (``id + k * 10**8``); odd copies are mirrored left-right (pixels,
    polygons, boxes and crowd RLE), so a mosaic of copies is not four identical tiles. Every
    annotation stays genuine: the same object on the same real pixels.

    Args:
        src: a COCO root with ``annotations/instances_{split}.json`` and ``{split}/`` image folders.
        dst: an empty folder to write the tiled root into.
        copies: copies of each image (1 keeps the source's ids and files).

    Returns:
        ``dst``.
    """
    for ann_file in sorted((src / "annotations").glob("instances_*.json")):
        split = ann_file.stem.removeprefix("instances_")
        data = json.loads(ann_file.read_text())
        (dst / split).mkdir(parents=True)
        images, annotations = [], []
        for k in range(copies):
            for img in data["images"]:
                new = {**img, "id": img["id"] + k * 10**7, "file_name": f"{img['id'] + k * 10**7:012d}.jpg"}
                if k % 2:
                    pixels = cv2.imread(str(src / split / img["file_name"]), cv2.IMREAD_UNCHANGED)
                    cv2.imwrite(str(dst / split / new["file_name"]), np.ascontiguousarray(pixels[:, ::-1]),
                                [cv2.IMWRITE_JPEG_QUALITY, 95])
                else:  # the file's own bytes
                    shutil.copyfile(src / split / img["file_name"], dst / split / new["file_name"])
                images.append(new)
            for ann in data["annotations"]:
                width = next(i["width"] for i in data["images"] if i["id"] == ann["image_id"])
                new = {**ann, "id": ann["id"] + k * 10**8, "image_id": ann["image_id"] + k * 10**7}
                if k % 2:
                    new.update(_mirrored(ann, width))
                annotations.append(new)
        (dst / "annotations").mkdir(exist_ok=True)
        (dst / "annotations" / ann_file.name).write_text(json.dumps({**data, "images": images,
                                                                      "annotations": annotations}))
    return dst


def _mirrored(ann: dict, width: int) -> dict:
    """The ``segmentation`` and ``bbox`` of ``ann`` mirrored left-right on an image ``width`` wide."""
    x, y, w, h = ann["bbox"]
    seg = ann["segmentation"]
    if isinstance(seg, list):
        seg = [[width - v if i % 2 == 0 else v for i, v in enumerate(ring)] for ring in seg]
    else:  # uncompressed RLE, column-major: mirroring reverses the order of the columns
        height = seg["size"][0]
        mask = np.repeat(np.arange(len(seg["counts"])) % 2, seg["counts"]).astype(np.uint8)
        mask = mask.reshape(width, height)[::-1].ravel()
        edges = np.flatnonzero(np.diff(mask)) + 1
        runs = np.diff(np.concatenate([[0], edges, [mask.size]]))
        counts = ([0] if mask[0] else []) + runs.tolist()
        seg = {"size": seg["size"], "counts": counts}
    return {"segmentation": seg, "bbox": [width - x - w, y, w, h]}
