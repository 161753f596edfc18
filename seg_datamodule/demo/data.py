"""A small synthetic COCO-format dataset, drawn on the fly, for the demo and the tests.

No network and no shipped binaries: each image is a textured, noisy background with a few
coloured shapes of four categories (:mod:`~seg_datamodule.demo.scene`), painted from the very
polygons that go into the annotation JSON, so pixels and annotations agree. The set exercises what real COCO
has and a toy set usually lacks:

* non-contiguous category ids (1, 3, 7, 12), so the id -> index mapping is tested;
* images of varied, mostly non-square sizes (each side drawn in ``image_size``);
* shapes of varied sizes (``shape_size``, 30-200 px by default), convex and not (stars);
* multi-ring instances: an unannotated bar occludes a shape and splits it in two;
* crowd regions (``iscrowd=1``, uncompressed RLE ``{"counts": [...], "size": [h, w]}``);
* a few images without any annotation (every 16th image).

Layout written by :func:`generate_demo_dataset` (the coco-mini layout, so configs carry over)::

    root/annotations/instances_train2017.json    root/train2017/*.jpg
    root/annotations/instances_val2017.json      root/val2017/*.jpg
    root/COMPLETE                                 written last: the generation spec

:func:`ensure_demo_dataset` generates it once into a cache folder, atomically, and reuses it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import cv2
import numpy as np
from pycocotools import mask as mask_utils

from seg_datamodule.demo.scene import DEMO_CATEGORIES, DemoInstance, DemoScene, draw_scene
from seg_datamodule.io.paths import cache_root, file_lock
from seg_datamodule.ops.rle import uncompressed_rle

__all__ = [
    "DEMO_CATEGORIES",
    "DemoInstance",
    "DemoPaths",
    "DemoScene",
    "default_demo_root",
    "draw_demo_image",
    "draw_scene",
    "ensure_demo_dataset",
    "generate_demo_dataset",
]

#: Bump when the generator's output changes; the cache folder is named after it.
DEMO_VERSION = 3

_SPLIT_CODES = {"train": 0, "val": 1}
_FIRST_IMAGE_ID = {"train": 1, "val": 10001}
_EMPTY_EVERY = 16  # image index i with i % 16 == 15 has no annotation


class DemoPaths(NamedTuple):
    """Where a generated demo dataset lives.

    Attributes:
        root (Path): the dataset folder.
        train_ann (Path): COCO annotation JSON of the train split.
        train_images (Path): folder of the train JPEGs.
        val_ann (Path): COCO annotation JSON of the val split.
        val_images (Path): folder of the val JPEGs.
    """

    root: Path
    train_ann: Path
    train_images: Path
    val_ann: Path
    val_images: Path


# --------------------------------------------------------------------------------------------
# COCO JSON
# --------------------------------------------------------------------------------------------


def _r2(x: float) -> float:
    return round(float(x), 2)


def _annotations(scene: DemoScene, image_id: int, first_ann_id: int) -> list[dict[str, Any]]:
    """COCO annotation dicts of a scene; area and crowd bbox computed by pycocotools."""
    h, w = scene.instance_map.shape
    anns = []
    for n, inst in enumerate(scene.instances):
        if inst.iscrowd:
            assert inst.crowd_mask is not None
            segmentation: Any = uncompressed_rle(inst.crowd_mask)
            rle = mask_utils.frPyObjects(segmentation, h, w)
            bbox = [_r2(v) for v in mask_utils.toBbox(rle)]
        else:
            segmentation = [[_r2(v) for v in ring.ravel()] for ring in inst.rings]
            rle = mask_utils.merge(mask_utils.frPyObjects(segmentation, h, w))
            pts = np.concatenate(inst.rings)
            x0, y0 = pts.min(axis=0)
            x1, y1 = pts.max(axis=0)
            bbox = [_r2(x0), _r2(y0), _r2(x1 - x0), _r2(y1 - y0)]
        anns.append(
            {
                "id": first_ann_id + n,
                "image_id": image_id,
                "category_id": inst.category_id,
                "segmentation": segmentation,
                "area": float(mask_utils.area(rle)),
                "bbox": bbox,
                "iscrowd": int(inst.iscrowd),
            }
        )
    return anns


def draw_demo_image(
    index: int, *, split: str = "train", seed: int = 0, image_size: tuple[int, int] = (320, 480)
) -> DemoScene:
    """The scene of image ``index`` of a split, exactly as :func:`generate_demo_dataset` draws it.

    Each image has its own random stream, seeded by ``(seed, split, index)``, so an image does
    not change when the split size does, and a test can redraw any one image.

    Args:
        index: position of the image in its split (0-based).
        split: ``"train"`` or ``"val"``.
        seed: the generation seed.
        image_size: (min, max) of each side, drawn independently for H and W.

    Returns:
        The :class:`DemoScene`; every 16th image (``index % 16 == 15``) has no instance.
    """
    if split not in _SPLIT_CODES:
        raise ValueError(f"split must be one of {sorted(_SPLIT_CODES)}, got {split!r}")
    rng = np.random.default_rng([seed, _SPLIT_CODES[split], index])
    h = int(rng.integers(image_size[0], image_size[1] + 1))
    w = int(rng.integers(image_size[0], image_size[1] + 1))
    if index % _EMPTY_EVERY == _EMPTY_EVERY - 1:
        return draw_scene(rng, (h, w), num_shapes=(0, 0), crowd_prob=0.0)
    return draw_scene(rng, (h, w))


def _write_split(
    root: Path, split: str, num_images: int, first_image_id: int, image_size: tuple[int, int], seed: int
) -> None:
    image_dir = root / f"{split}2017"
    image_dir.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    ann_id = first_image_id * 100  # disjoint annotation ids per split
    for i in range(num_images):
        scene = draw_demo_image(i, split=split, seed=seed, image_size=image_size)
        h, w = scene.instance_map.shape
        image_id = first_image_id + i
        file_name = f"{image_id:012d}.jpg"
        bgr = cv2.cvtColor(scene.image, cv2.COLOR_RGB2BGR)
        if not cv2.imwrite(str(image_dir / file_name), bgr, [cv2.IMWRITE_JPEG_QUALITY, 90]):
            raise OSError(f"could not write {image_dir / file_name}")
        images.append({"id": image_id, "file_name": file_name, "height": h, "width": w, "license": 1})
        anns = _annotations(scene, image_id, ann_id)
        ann_id += len(anns)
        annotations.extend(anns)
    coco = {
        "info": {
            "description": "seg-datamodule synthetic demo dataset",
            "version": str(DEMO_VERSION),
            "year": 2025,
            "contributor": "seg-datamodule",
            "date_created": "generated",
        },
        "licenses": [{"id": 1, "name": "CC0 1.0", "url": "https://creativecommons.org/publicdomain/zero/1.0/"}],
        "images": images,
        "annotations": annotations,
        "categories": [dict(c) for c in DEMO_CATEGORIES],
    }
    ann_dir = root / "annotations"
    ann_dir.mkdir(parents=True, exist_ok=True)
    (ann_dir / f"instances_{split}2017.json").write_text(json.dumps(coco, separators=(",", ":")))


def _paths(root: Path) -> DemoPaths:
    return DemoPaths(
        root=root,
        train_ann=root / "annotations" / "instances_train2017.json",
        train_images=root / "train2017",
        val_ann=root / "annotations" / "instances_val2017.json",
        val_images=root / "val2017",
    )


def _spec(num_train: int, num_val: int, image_size: tuple[int, int], seed: int) -> dict[str, Any]:
    return {
        "version": DEMO_VERSION,
        "num_train": num_train,
        "num_val": num_val,
        "image_size": list(image_size),
        "seed": seed,
    }


def generate_demo_dataset(
    root: str | Path,
    *,
    num_train: int = 48,
    num_val: int = 16,
    image_size: tuple[int, int] = (320, 480),
    seed: int = 0,
) -> DemoPaths:
    """Draw the demo dataset into ``root`` (created; existing files of the layout overwritten).

    Deterministic: the same arguments give byte-identical JSON and JPEGs (with the same OpenCV
    build). Train image ids start at 1, val at 10001.

    Args:
        root: the dataset folder.
        num_train: number of train images.
        num_val: number of val images.
        image_size: (min, max) of each image side in pixels, drawn independently for H and W.
        seed: the generation seed.

    Returns:
        The :class:`DemoPaths` of the dataset.

    Raises:
        ValueError: a count is negative or ``image_size`` is not ``0 < min <= max``.
    """
    for name, value in (("num_train", num_train), ("num_val", num_val)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if len(image_size) != 2 or not 0 < image_size[0] <= image_size[1]:
        raise ValueError(f"image_size must be (min, max) with 0 < min <= max, got {image_size!r}")
    image_size = (int(image_size[0]), int(image_size[1]))
    root = Path(root)
    _write_split(root, "train", num_train, _FIRST_IMAGE_ID["train"], image_size, seed)
    _write_split(root, "val", num_val, _FIRST_IMAGE_ID["val"], image_size, seed)
    spec = _spec(num_train, num_val, image_size, seed)
    (root / "COMPLETE").write_text(json.dumps(spec, sort_keys=True))
    return _paths(root)


def _is_complete(root: Path, spec: dict[str, Any]) -> bool:
    """The marker matches ``spec`` and every file of the layout is there."""
    try:
        if json.loads((root / "COMPLETE").read_text()) != spec:
            return False
    except (OSError, ValueError):
        return False
    paths = _paths(root)
    if not (paths.train_ann.is_file() and paths.val_ann.is_file()):
        return False
    for folder, n, first in (
        (paths.train_images, spec["num_train"], _FIRST_IMAGE_ID["train"]),
        (paths.val_images, spec["num_val"], _FIRST_IMAGE_ID["val"]),
    ):
        if not all((folder / f"{first + i:012d}.jpg").is_file() for i in range(n)):
            return False
    return True


def default_demo_root() -> Path:
    """Where :func:`ensure_demo_dataset` keeps the dataset when no folder is given.

    ``demo-v<N>`` in :func:`~seg_datamodule.io.paths.cache_root` (``$SEG_DATAMODULE_CACHE``, else
    ``$XDG_CACHE_HOME/seg_datamodule``, else ``~/.cache/seg_datamodule``).
    """
    return cache_root() / f"demo-v{DEMO_VERSION}"


def ensure_demo_dataset(cache_dir: str | Path | None = None) -> DemoPaths:
    """The default demo dataset, generated on first use and reused afterwards.

    Safe when several processes (DDP ranks, dataloader workers) race: generation runs under a
    file lock into a temporary sibling folder that is renamed into place only when complete, so
    no process ever sees a half-written dataset, and one left incomplete (a killed run, a deleted
    file) is regenerated.

    Args:
        cache_dir: the dataset folder; ``None`` means :func:`default_demo_root`.

    Returns:
        The :class:`DemoPaths` of the complete dataset.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_demo_root()
    spec = _spec(48, 16, (320, 480), 0)
    if _is_complete(root, spec):
        return _paths(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(root.parent / f".{root.name}.lock"):
        if _is_complete(root, spec):  # another process finished while we waited
            return _paths(root)
        tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it 0700; a shared cache should stay readable
            generate_demo_dataset(tmp)
            if root.exists():
                # Incomplete or stale: move it aside atomically, then delete it.
                trash = Path(tempfile.mkdtemp(prefix=f".{root.name}.old-", dir=root.parent))
                os.replace(root, trash / "old")
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(tmp, root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return _paths(root)
