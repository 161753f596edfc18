"""``make_dataset``: a ``SegDataset`` from the flat augmentation keywords, so test call sites stay short.

``SegDataset`` takes its augmentation as one :class:`~seg_datamodule.data.config.options.AugmentOptions`
whose geometry fixes the canvas size; what to do with a bad image is the index's
``on_bad_sample``, so it is not a keyword here either (build the index with it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from seg_datamodule.data.samples.dataset import ImageIndex, SegDataset
from seg_datamodule.data.config.options import AugmentOptions
from seg_datamodule.transforms.layouts.mosaic import MosaicAffine
from seg_datamodule.transforms.layouts.lsj import LargeScaleJitter


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

    Copy ``k`` of an image is its file, byte for byte, under a new name and id (``id + k * 10**7``),
    with its annotations under new ids (``id + k * 10**8``): every annotation stays genuine, the
    same object on the same real pixels. (Not mirrored: Ultralytics fills polygons with pixel
    centres at integers, so a mirrored copy would move its masks by a pixel against ours, and the
    parity tests measure real COCO files.)

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
                shutil.copyfile(src / split / img["file_name"], dst / split / new["file_name"])
                images.append(new)
            annotations += [{**ann, "id": ann["id"] + k * 10**8, "image_id": ann["image_id"] + k * 10**7}
                            for ann in data["annotations"]]
        (dst / "annotations").mkdir(exist_ok=True)
        (dst / "annotations" / ann_file.name).write_text(json.dumps({**data, "images": images,
                                                                      "annotations": annotations}))
    return dst
