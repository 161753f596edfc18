"""Drawing the demo's scenes: coloured shapes on a textured background, pixels from the polygons.

Each scene is a textured, noisy background with a few shapes of four categories with
non-contiguous ids (discs, squares, triangles, stars; convex and not), some split in two by an
unannotated bar (multi-ring instances), and crowd regions. Shapes are painted with the package's
exact rasteriser at stride 1 from the very polygons the annotations carry, so a pixel is painted
exactly when its centre is inside, as ``annToMask`` and the training targets sample it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from seg_datamodule.ops.affine import apply_affine, invert_affine
from seg_datamodule.ops.geometry import ring_areas
from seg_datamodule.ops.ragged import offsets_from_lengths
from seg_datamodule.ops.raster import rasterize_flat
from seg_datamodule.structures import Polygons

__all__ = ["DEMO_CATEGORIES", "DemoInstance", "DemoScene", "draw_scene"]

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

_MARGIN = 8  # px kept free between the boxes of two shapes (and crowd regions)


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
