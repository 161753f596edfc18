"""A small synthetic COCO-format dataset, drawn on the fly, for the demo and the tests.

No network and no shipped binaries: each image is a textured, noisy background with a few
coloured shapes of four categories, painted with :func:`cv2.fillPoly` from the very polygons that
go into the annotation JSON, so pixels and annotations agree. The set exercises what real COCO
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
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import cv2
import numpy as np
from pycocotools import mask as mask_utils

from seg_datamodule.io.paths import cache_root, file_lock
from seg_datamodule.ops.affine import apply_affine, invert_affine
from seg_datamodule.ops.geometry import ring_areas
from seg_datamodule.ops.ragged import offsets_from_lengths
from seg_datamodule.ops.raster import rasterize_flat
from seg_datamodule.ops.rle import uncompressed_rle
from seg_datamodule.structures import Polygons

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

#: COCO-style categories with deliberately non-contiguous ids.
DEMO_CATEGORIES: tuple[dict[str, Any], ...] = (
    {"id": 1, "name": "disc", "supercategory": "shape"},
    {"id": 3, "name": "square", "supercategory": "shape"},
    {"id": 7, "name": "triangle", "supercategory": "shape"},
    {"id": 12, "name": "star", "supercategory": "shape"},
)

# Base RGB colour per category id; each instance jitters it a little.
_CATEGORY_COLORS: dict[int, tuple[int, int, int]] = {
    1: (215, 55, 45),
    3: (55, 165, 65),
    7: (50, 85, 215),
    12: (230, 195, 40),
}

_SPLIT_CODES = {"train": 0, "val": 1}
_FIRST_IMAGE_ID = {"train": 1, "val": 10001}
_EMPTY_EVERY = 16  # image index i with i % 16 == 15 has no annotation
_MARGIN = 8  # px kept free between the boxes of two shapes (and crowd regions)


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


@dataclass(frozen=True)
class DemoInstance:
    """One annotated object of a scene.

    Attributes:
        category_id (int): COCO category id (one of :data:`DEMO_CATEGORIES`).
        rings (tuple[ndarray[K, 2] float64, ...]): polygon rings in image pixels (pixel k covers
            ``[k, k + 1)``); empty for a crowd region.
        iscrowd (bool): a crowd region, stored as RLE.
        crowd_mask (ndarray[H, W] bool | None): the painted pixels of a crowd region.
        color (tuple[int, int, int]): the RGB fill colour.
    """

    category_id: int
    rings: tuple[np.ndarray, ...]
    iscrowd: bool
    crowd_mask: np.ndarray | None
    color: tuple[int, int, int]


@dataclass(frozen=True)
class DemoScene:
    """A drawn image with its instances.

    Attributes:
        image (ndarray[H, W, 3] uint8): RGB pixels (before JPEG compression).
        instances (tuple[DemoInstance, ...]): the annotated objects.
        instance_map (ndarray[H, W] int32): ``n + 1`` where instance ``n`` was painted, 0 elsewhere.
    """

    image: np.ndarray
    instances: tuple[DemoInstance, ...]
    instance_map: np.ndarray


# --------------------------------------------------------------------------------------------
# Geometry
# --------------------------------------------------------------------------------------------


def _shape_polygon(rng: np.random.Generator, category_id: int, diameter: float) -> np.ndarray:
    """Vertices (float64[K, 2]) of one shape of ``category_id`` centred on (0, 0)."""
    r = diameter / 2.0
    theta = rng.uniform(0.0, 2.0 * math.pi)
    if category_id == 1:  # ellipse
        t = np.linspace(0.0, 2.0 * math.pi, 40, endpoint=False)
        pts = np.stack([r * np.cos(t), r * rng.uniform(0.6, 1.0) * np.sin(t)], axis=1)
    elif category_id == 3:  # rectangle
        a = rng.uniform(0.45, 1.0)
        half = np.array([1.0, a]) * r / math.hypot(1.0, a)
        pts = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], np.float64) * half
    elif category_id == 7:  # triangle, angles jittered around equilateral
        t = np.array([0.0, 2.0, 4.0]) * math.pi / 3.0 + rng.uniform(-0.35, 0.35, size=3)
        pts = r * np.stack([np.cos(t), np.sin(t)], axis=1)
    elif category_id == 12:  # five-pointed star (not convex)
        t = np.arange(10) * math.pi / 5.0
        radius = np.where(np.arange(10) % 2 == 0, r, r * rng.uniform(0.4, 0.55))
        pts = np.stack([radius * np.cos(t), radius * np.sin(t)], axis=1)
    else:
        raise ValueError(f"unknown demo category id {category_id!r}")
    c, s = math.cos(theta), math.sin(theta)
    return pts @ np.array([[c, s], [-s, c]])


def _clip_half_plane(poly: np.ndarray, normal: np.ndarray, offset: float) -> np.ndarray:
    """The part of ``poly`` (float64[K, 2]) where ``p @ normal <= offset``; float64[M, 2], M maybe 0.

    Turns ``normal`` onto +x, cuts with the package's exact rectangle clip, and turns back.
    """
    length = float(np.hypot(*normal))
    c, s = normal / length
    turn = np.array([[c, s, 0.0], [-s, c, 0.0]])
    inf = np.inf
    cut = Polygons(apply_affine(poly, turn), np.array([0, len(poly)]), np.array([0, 1]))
    cut = cut.clip((-inf, -inf, offset / length, inf))
    return apply_affine(cut.vertices, invert_affine(turn))


def _polygon_area(poly: np.ndarray) -> float:
    """Absolute shoelace area of float64[K, 2]."""
    return float(abs(ring_areas(poly, np.array([0, len(poly)]))[0]))


def _polygon_mask(rings: list[np.ndarray] | tuple[np.ndarray, ...], canvas_size: tuple[int, int]) -> np.ndarray:
    """Pixels (bool[H, W]) whose centre ``(k + 0.5)`` lies in the union of ``rings``.

    The package's exact rasteriser at stride 1, so painted pixels are exactly those
    ``annToMask`` and the training targets sample as inside.
    """
    offsets = offsets_from_lengths([len(r) for r in rings])
    return rasterize_flat(np.concatenate(rings), offsets, np.array([0, len(rings)]), canvas_size, stride=1)[0]


def _boxes_overlap(a: np.ndarray, b: np.ndarray, margin: float) -> bool:
    return not (
        a[2] + margin <= b[0] or b[2] + margin <= a[0] or a[3] + margin <= b[1] or b[3] + margin <= a[1]
    )


def _place(
    rng: np.random.Generator,
    extent: np.ndarray,
    canvas_size: tuple[int, int],
    taken: list[np.ndarray],
    tries: int = 40,
) -> np.ndarray | None:
    """A translation (float64[2]) putting a shape of ``extent`` (xyxy about 0) free of ``taken``."""
    h, w = canvas_size
    lo = -extent[:2] + 2.0
    hi = np.array([w, h], np.float64) - extent[2:] - 2.0
    if np.any(hi <= lo):
        return None
    for _ in range(tries):
        t = rng.uniform(lo, hi)
        box = np.concatenate([extent[:2] + t, extent[2:] + t])
        if not any(_boxes_overlap(box, other, _MARGIN) for other in taken):
            taken.append(box)
            return t
    return None


def _jitter_color(rng: np.random.Generator, base: tuple[int, int, int]) -> tuple[int, int, int]:
    c = np.clip(np.array(base) + rng.integers(-25, 26, size=3), 0, 255)
    return int(c[0]), int(c[1]), int(c[2])


def _background(rng: np.random.Generator, canvas_size: tuple[int, int]) -> np.ndarray:
    """Muted low-frequency colour texture plus unannotated clutter lines, uint8[H, W, 3]."""
    h, w = canvas_size
    coarse = rng.uniform(0.0, 1.0, size=(h // 48 + 2, w // 48 + 2, 3)).astype(np.float32)
    smooth = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC)
    gray = smooth.mean(axis=2, keepdims=True)
    # Low saturation keeps the background apart from the saturated shape colours.
    img = 70.0 + 100.0 * (0.75 * gray + 0.25 * smooth)
    img = np.clip(img, 0, 255).astype(np.uint8)
    for _ in range(int(rng.integers(3, 9))):
        p = rng.uniform([0, 0], [w, h], size=(2, 2)).astype(np.int32)
        tone = int(rng.integers(40, 200))
        cv2.line(img, tuple(map(int, p[0])), tuple(map(int, p[1])), (tone, tone, tone), int(rng.integers(1, 4)))
    return img


# --------------------------------------------------------------------------------------------
# Scene
# --------------------------------------------------------------------------------------------


def draw_scene(
    rng: np.random.Generator,
    canvas_size: tuple[int, int],
    *,
    num_shapes: tuple[int, int] = (2, 6),
    shape_size: tuple[int, int] = (30, 200),
    split_prob: float = 0.25,
    crowd_prob: float = 0.3,
) -> DemoScene:
    """Draw one image and its instances.

    Shapes are placed with disjoint (margin-padded) boxes, so the only occlusions are the
    unannotated bars that split a shape into two rings; the bar stays inside the shape's box.

    Args:
        rng: the only source of randomness.
        canvas_size: (H, W) of the image.
        num_shapes: inclusive range of shapes to try to place (fewer when they do not fit).
        shape_size: inclusive range of a shape's diameter in pixels (drawn log-uniform, capped at
            60% of the shorter side).
        split_prob: chance that a shape is split in two by a bar (a two-ring instance).
        crowd_prob: chance that the image holds one crowd region (a cluster of small discs).

    Returns:
        The :class:`DemoScene`; ``image`` is RGB uint8[H, W, 3].
    """
    h, w = canvas_size
    image = _background(rng, canvas_size)
    instance_map = np.zeros((h, w), np.int32)
    instances: list[DemoInstance] = []
    taken: list[np.ndarray] = []
    category_ids = [c["id"] for c in DEMO_CATEGORIES]
    max_d = max(float(shape_size[0]), min(float(shape_size[1]), 0.6 * min(h, w)))

    # 1. Crowd region first, so it gets a place: 8-20 small discs of one category.
    if rng.uniform() < crowd_prob:
        side = min(float(rng.uniform(50, 110)), 0.4 * min(h, w))
        t = _place(rng, np.array([0.0, 0.0, side, side]), canvas_size, taken)
        if t is not None:
            cid = int(rng.choice(category_ids))
            color = _jitter_color(rng, _CATEGORY_COLORS[cid])
            discs = []
            for _ in range(int(rng.integers(8, 21))):
                r = float(rng.uniform(4, 9))
                centre = t + rng.uniform(r, side - r, size=2)
                discs.append(_shape_polygon(rng, 1, 2 * r) + centre)
            mask = _polygon_mask(discs, canvas_size)
            image[mask] = color
            instance_map[mask] = len(instances) + 1
            instances.append(DemoInstance(cid, (), True, mask, color))

    # 2. Shapes, each possibly split by an occluding bar.
    for _ in range(int(rng.integers(num_shapes[0], num_shapes[1] + 1))):
        cid = int(rng.choice(category_ids))
        diameter = math.exp(rng.uniform(math.log(shape_size[0]), math.log(max_d)))
        poly = _shape_polygon(rng, cid, diameter)
        extent = np.concatenate([poly.min(axis=0), poly.max(axis=0)])
        t = _place(rng, extent, canvas_size, taken)
        if t is None:
            continue
        poly = poly + t
        rings = [poly]
        bar: np.ndarray | None = None
        if rng.uniform() < split_prob:
            angle = rng.uniform(0.0, math.pi)
            normal = np.array([math.cos(angle), math.sin(angle)])
            centre = poly.mean(axis=0) + rng.uniform(-0.1, 0.1, size=2) * diameter
            offset = float(centre @ normal)
            half = max(2.0, 0.06 * diameter)
            parts = [
                _clip_half_plane(poly, normal, offset - half),
                _clip_half_plane(poly, -normal, -(offset + half)),
            ]
            parts = [p for p in parts if len(p) >= 3 and _polygon_area(p) >= 20.0]
            if parts:
                rings = parts
                # The bar: the band clipped to the shape's box grown by 3 px (inside the margin).
                x0, y0 = poly.min(axis=0) - 3.0
                x1, y1 = poly.max(axis=0) + 3.0
                box = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float64)
                bar = _clip_half_plane(box, normal, offset + half)
                bar = _clip_half_plane(bar, -normal, -(offset - half))
        # Round as the JSON stores them, then paint those very coordinates.
        rings = [np.round(r, 2) for r in rings]
        color = _jitter_color(rng, _CATEGORY_COLORS[cid])
        mask = _polygon_mask(rings, canvas_size)
        image[mask] = color
        instance_map[mask] = len(instances) + 1
        if bar is not None and len(bar) >= 3:
            # The bar fills the gap between the two rings (and overhangs the shape a little).
            tone = int(rng.integers(20, 60))
            # Only outside the rings: their boundary pixels stay the annotated colour.
            image[_polygon_mask([bar], canvas_size) & ~mask] = (tone, tone, tone)
        instances.append(DemoInstance(cid, tuple(rings), False, None, color))

    # 3. Sensor noise over everything (after painting, so shapes are not flat either).
    noisy = image.astype(np.int16) + rng.normal(0.0, 6.0, size=image.shape).round().astype(np.int16)
    image = np.clip(noisy, 0, 255).astype(np.uint8)
    return DemoScene(image, tuple(instances), instance_map)


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
