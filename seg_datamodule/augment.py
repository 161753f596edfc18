"""Augmentation parameters and their random draws: thin classes over :mod:`seg_datamodule.mosaic`.

Each class holds parameters (checked in ``__init__``) and draws randomness from a
``numpy.random.Generator`` passed in; the geometry itself lives in pure functions. The global
random affine of a training sample is one ``2 x 3`` matrix composed with each tile's placement,
so pixels are resampled once and polygons go through the same matrices (see
:mod:`seg_datamodule.mosaic`); the horizontal flip then mirrors the output (pixels and vertices,
exactly, no resample).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import albumentations as A
import cv2
import numpy as np

from seg_datamodule._checks import check_int, check_number
from seg_datamodule.geometry import compose_affine, make_affine
from seg_datamodule.mosaic import TilePlan, letterbox_layout, mosaic_layout, snap_for_resize

__all__ = [
    "AlbumentationsTransform",
    "GlobalDraw",
    "Letterbox",
    "MosaicAffine",
    "RandomAffine",
    "RandomFlipLR",
    "RandomHSV",
    "hsv_jitter",
    "load_transforms",
]


# Per mosaic tile (top-left, top-right, bottom-left, bottom-right), the image edge that touches
# the centre, per axis: 1 for the far edge (W or H), 0 for edge 0.
_MOSAIC_ANCHORS = np.array([[1, 1], [0, 1], [1, 0], [0, 0]])


class RandomAffine:
    """YOLO random affine: rotation, isotropic scale, shear and translation about the centre.

    Args:
        degrees (float): rotation drawn uniformly in ``[-degrees, degrees]``.
        translate (float): translation drawn uniformly in ``[-translate, translate]`` times the
            output width (x) and height (y).
        scale (tuple[float, float]): scale drawn uniformly in ``[scale[0], scale[1]]``.
        shear (float): shear angles (x and y) drawn uniformly in ``[-shear, shear]`` degrees.

    Raises:
        TypeError: a parameter is not a number (or ``scale`` not a pair).
        ValueError: a parameter is negative or not finite, ``scale`` is not ``0 < lo <= hi``, or
            ``shear >= 90``.
    """

    def __init__(
        self,
        degrees: float = 0.0,
        translate: float = 0.1,
        scale: tuple[float, float] = (0.5, 1.5),
        shear: float = 0.0,
    ) -> None:
        self.degrees = check_number("degrees", degrees)
        self.translate = check_number("translate", translate)
        self.shear = check_number("shear", shear)
        if self.shear >= 90:
            raise ValueError(f"shear must be below 90 degrees, got {shear!r}")
        if not isinstance(scale, Sequence) or len(scale) != 2:
            raise TypeError(f"scale must be a pair (low, high), got {scale!r}")
        lo, hi = (check_number("scale", s) for s in scale)
        if not 0 < lo <= hi:
            raise ValueError(f"scale must satisfy 0 < low <= high, got {scale!r}")
        self.scale = (lo, hi)

    def __repr__(self) -> str:
        return (
            f"RandomAffine(degrees={self.degrees}, translate={self.translate}, "
            f"scale={self.scale}, shear={self.shear})"
        )

    def sample(
        self,
        rng: np.random.Generator,
        canvas_size: tuple[int, int],
        output_size: tuple[int, int],
    ) -> np.ndarray:
        """Draw one affine mapping the canvas centre near the output centre.

        Always draws six numbers (angle, scale, two shears, two translations), whatever the
        parameters, so changing one parameter does not shift the others' draws.

        Args:
            rng (numpy.random.Generator): the sample's generator.
            canvas_size (tuple[int, int]): (H, W) of the canvas the tiles are placed on.
            output_size (tuple[int, int]): (H, W) of the output.

        Returns:
            ndarray[2, 3] float64: canvas pixels -> output pixels.
        """
        u = rng.random(6)
        angle = (2 * u[0] - 1) * self.degrees
        scale = self.scale[0] + u[1] * (self.scale[1] - self.scale[0])
        shear = ((2 * u[2] - 1) * self.shear, (2 * u[3] - 1) * self.shear)
        translate = (
            (2 * u[4] - 1) * self.translate * output_size[1],
            (2 * u[5] - 1) * self.translate * output_size[0],
        )
        return make_affine(
            center=(canvas_size[1] / 2.0, canvas_size[0] / 2.0),
            output_center=(output_size[1] / 2.0, output_size[0] / 2.0),
            angle=angle,
            scale=scale,
            shear=shear,
            translate=translate,
        )


class RandomFlipLR:
    """Horizontal flip with probability ``p``: the output canvas mirrored, ``x -> W - x``.

    Mirroring pixel ``k`` onto ``W - 1 - k`` and vertices with ``x -> W - x`` (continuous pixels)
    is exact for both, and costs one copy, not a resample.

    Args:
        p (float): probability of flipping.

    Raises:
        ValueError: ``p`` is not in ``[0, 1]``.
    """

    def __init__(self, p: float = 0.5) -> None:
        self.p = check_number("p", p, 0.0, 1.0)

    def __repr__(self) -> str:
        return f"RandomFlipLR(p={self.p})"

    @staticmethod
    def matrix(width: float) -> np.ndarray:
        """The flip of a canvas ``width`` wide as an affine, ``float64 (2, 3)``."""
        return np.array([[-1.0, 0.0, float(width)], [0.0, 1.0, 0.0]])

    def sample(self, rng: np.random.Generator) -> bool:
        """Draw whether to flip (one number from ``rng``)."""
        return bool(rng.random() < self.p)


@dataclass(frozen=True)
class GlobalDraw:
    """The random part of one training sample's geometry.

    Attributes:
        center (tuple[float, float] | None): mosaic centre on the ``2s x 2s`` canvas; ``None``
            for a single letterboxed image.
        matrix (ndarray[2, 3] float64): canvas pixels -> output pixels (the random affine; for a
            mosaic it puts the centre on an integer output point, see :meth:`MosaicAffine.draw`).
        flip (bool): mirror the output horizontally.
    """

    center: tuple[float, float] | None
    matrix: np.ndarray
    flip: bool = False


class Letterbox:
    """Fit one image in an ``s x s`` canvas, keeping its aspect ratio, centred (fill 114).

    Args:
        image_size (int): ``s``.

    Raises:
        TypeError, ValueError: ``image_size`` is not a positive int.
    """

    def __init__(self, image_size: int = 640) -> None:
        self.image_size = check_int("image_size", image_size, 1)

    def __repr__(self) -> str:
        return f"Letterbox(image_size={self.image_size})"

    def plan(
        self, image_size_hw: tuple[int, int], matrix: np.ndarray | None = None
    ) -> tuple[TilePlan, float, tuple[float, float]]:
        """Letterbox placement, optionally followed by a canvas -> output affine.

        Args:
            image_size_hw (tuple[int, int]): (H, W) of the original image.
            matrix (ndarray[2, 3] | None): applied after the letterbox (training's random
                affine); ``None`` for plain letterboxing (validation).

        Returns:
            (plan with one tile, letterbox scale, letterbox pad (left, top)).
        """
        s = self.image_size
        placement, region, scale, pad = letterbox_layout(image_size_hw, (s, s))
        if matrix is not None:
            placement = compose_affine(matrix, placement)
        return TilePlan(placement[None], region[None], (s, s)), scale, pad


class MosaicAffine:
    """YOLO 4-image mosaic (or one letterboxed image), random affine and flip, drawn together.

    The mosaic centre is drawn in the middle half of a ``2s x 2s`` canvas; the four images are
    scaled to long side ``s`` and placed around it; the affine maps the canvas centre to the
    output centre (``s x s``). Without mosaic the image is letterboxed on an ``s x s`` canvas and
    the same affine applies (as Ultralytics does once ``close_mosaic`` switches mosaic off).

    Args:
        image_size (int): ``s``, the output side.
        degrees, translate, scale, shear: see :class:`RandomAffine`.
        flip_lr (float): probability of a horizontal flip.

    Raises:
        TypeError, ValueError: a parameter is out of range (see :class:`RandomAffine`).
    """

    def __init__(
        self,
        image_size: int = 640,
        degrees: float = 0.0,
        translate: float = 0.1,
        scale: tuple[float, float] = (0.5, 1.5),
        shear: float = 0.0,
        flip_lr: float = 0.5,
    ) -> None:
        self.image_size = check_int("image_size", image_size, 1)
        self.affine = RandomAffine(degrees=degrees, translate=translate, scale=scale, shear=shear)
        self.flip = RandomFlipLR(flip_lr)
        self.letterbox = Letterbox(image_size)

    def __repr__(self) -> str:
        return f"MosaicAffine(image_size={self.image_size}, {self.affine!r}, {self.flip!r})"

    def draw_indices(self, rng: np.random.Generator, first: int, num_images: int) -> np.ndarray:
        """The mosaic's four image indices: ``first`` and three uniform draws over the index.

        Returns:
            ndarray[4] int64.
        """
        others = rng.integers(0, num_images, size=3)
        return np.concatenate([[int(first)], others]).astype(np.int64)

    def draw(self, rng: np.random.Generator, mosaic: bool) -> GlobalDraw:
        """Draw the centre (mosaic only), the affine and the flip, in that order.

        For a mosaic the affine's translation is moved (by under half a pixel) so the centre
        lands on an integer output point: there the four tiles meet, and
        :func:`~seg_datamodule.mosaic.snap_for_resize` can then keep their seams exact.
        """
        s = self.image_size
        center = None
        if mosaic:
            c = rng.uniform(0.5 * s, 1.5 * s, size=2)
            center = (float(c[0]), float(c[1]))
        canvas = (2 * s, 2 * s) if mosaic else (s, s)
        affine = self.affine.sample(rng, canvas, (s, s))
        if center is not None:
            landed = affine[:, :2] @ np.asarray(center) + affine[:, 2]
            affine[:, 2] += np.round(landed) - landed
        return GlobalDraw(center=center, matrix=affine, flip=self.flip.sample(rng))

    def plan(self, draw: GlobalDraw, image_sizes: np.ndarray, snap: bool = True) -> TilePlan:
        """Tile plan for the drawn geometry and the tiles' original sizes (flip not included).

        Args:
            draw (GlobalDraw): from :meth:`draw`.
            image_sizes (ndarray[K, 2] int): (H, W) per tile; K = 4 for a mosaic, 1 otherwise.
            snap (bool): let axis-aligned tiles be rendered by ``cv2.resize`` (see
                :func:`~seg_datamodule.mosaic.snap_for_resize`); False keeps the designed
                matrices exactly.

        Returns:
            TilePlan: original pixels -> output pixels per tile, and the visible regions.

        Raises:
            ValueError: K does not match the draw (4 with a centre, 1 without).
        """
        sizes = np.asarray(image_sizes)
        s = self.image_size
        if draw.center is None:
            if sizes.shape != (1, 2):
                raise ValueError(f"a single-image draw needs image_sizes (1, 2), got {sizes.shape}")
            plan = self.letterbox.plan(tuple(sizes[0]), draw.matrix)[0]
            return snap_for_resize(plan, sizes, np.full((1, 2), -1)) if snap else plan
        placements, regions = mosaic_layout(sizes, draw.center, s)
        matrices = np.stack([compose_affine(draw.matrix, p) for p in placements])
        plan = TilePlan(matrices, regions, (s, s))
        return snap_for_resize(plan, sizes, _MOSAIC_ANCHORS) if snap else plan


def hsv_jitter(image: np.ndarray, gains: np.ndarray) -> np.ndarray:
    """YOLO's HSV jitter: shift hue, scale saturation and value, with lookup tables.

    Args:
        image (ndarray[H, W, 3] uint8): RGB image.
        gains (ndarray[3] float): hue shift as a fraction of the hue circle, and saturation and
            value gains minus one (``0`` changes nothing), as Ultralytics' ``RandomHSV`` draws them.

    Returns:
        ndarray[H, W, 3] uint8: the jittered RGB image (a new array).
    """
    hsv = cv2.cvtColor(image, cv2.COLOR_RGB2HSV)
    x = np.arange(256, dtype=np.float64)
    lut = np.empty((1, 256, 3), np.uint8)
    lut[0, :, 0] = ((x + gains[0] * 180) % 180).astype(np.uint8)
    lut[0, :, 1] = np.clip(x * (gains[1] + 1), 0, 255).astype(np.uint8)
    lut[0, :, 2] = np.clip(x * (gains[2] + 1), 0, 255).astype(np.uint8)
    lut[0, 0, 1] = 0  # keep pure greys grey (Ultralytics 8.3.79)
    # One 3-channel lookup in place: half the cost of split / 3 x LUT / merge.
    cv2.LUT(hsv, lut, dst=hsv)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB, dst=hsv)


class RandomHSV(A.ImageOnlyTransform):
    """Ultralytics' HSV gain jitter as an albumentations transform, for a YOLO recipe.

    Draws ``uniform(-1, 1, 3) * (hgain, sgain, vgain)`` and applies :func:`hsv_jitter`. Lookup
    tables make it about three times as fast as ``A.HueSaturationValue`` at 640 x 640 (1.3 vs
    4.3 ms here), and it matches the recipe's ``hsv_h / hsv_s / hsv_v`` exactly.

    Args:
        hgain (float): hue shift range, fraction of the hue circle (YOLO ``hsv_h``, 0.015).
        sgain (float): saturation gain range (YOLO ``hsv_s``, 0.7).
        vgain (float): value gain range (YOLO ``hsv_v``, 0.4).
        p (float): probability.
    """

    def __init__(self, hgain: float = 0.015, sgain: float = 0.7, vgain: float = 0.4, p: float = 1.0) -> None:
        super().__init__(p=p)
        self.hgain = check_number("hgain", hgain)
        self.sgain = check_number("sgain", sgain)
        self.vgain = check_number("vgain", vgain)

    def get_params(self) -> dict[str, np.ndarray]:
        """Draw the three gains from the pipeline's generator."""
        return {"gains": self.random_generator.uniform(-1, 1, 3) * (self.hgain, self.sgain, self.vgain)}

    def apply(self, img: np.ndarray, gains: np.ndarray, **params: object) -> np.ndarray:
        """:func:`hsv_jitter` on 3-channel uint8 images; anything else passes unchanged."""
        if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
            return img
        return hsv_jitter(img, gains)

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        """Arguments ``A.save`` records (``p`` is added by albumentations)."""
        return ("hgain", "sgain", "vgain")


def load_transforms(transforms: A.BaseCompose | str | Path | None) -> A.BaseCompose | None:
    """Resolve the ``transforms`` argument: a ``Compose``, a file ``A.load`` reads, or ``None``.

    Args:
        transforms: an albumentations ``BaseCompose``; a path to a JSON or YAML file written by
            ``A.save`` (YAML when it ends in ``.yaml`` or ``.yml``); or ``None``.

    Returns:
        The ``BaseCompose``, or ``None``.

    Raises:
        TypeError: ``transforms`` is of another type, or the file holds no ``BaseCompose``.
        FileNotFoundError: the file does not exist.
    """
    if transforms is None or isinstance(transforms, A.BaseCompose):
        return transforms
    if isinstance(transforms, (str, Path)):
        path = Path(transforms)
        if not path.is_file():
            raise FileNotFoundError(f"transforms file {str(path)!r} does not exist")
        fmt = "yaml" if path.suffix.lower() in (".yaml", ".yml") else "json"
        loaded = A.load(str(path), data_format=fmt)
        if not isinstance(loaded, A.BaseCompose):
            raise TypeError(
                f"transforms file {str(path)!r} holds a {type(loaded).__name__}, expected a Compose"
            )
        return loaded
    raise TypeError(
        "transforms must be an albumentations BaseCompose, a path to a file A.load reads, or "
        f"None; got {type(transforms).__name__}"
    )


def _is_geometric(transform: object) -> bool:
    if isinstance(transform, A.BaseCompose):
        return any(_is_geometric(t) for t in transform.transforms)
    return isinstance(transform, A.DualTransform)


# albumentations 2.0.8 scales keypoints as ``x * s`` in these, which is off by ``0.5 * (s - 1)``
# px for the pixel-centre keypoints the polygons travel as; resizing belongs to ``image_size``.
_RESIZING = tuple(
    getattr(A, name)
    for name in ("Resize", "RandomScale", "LongestMaxSize", "SmallestMaxSize", "RandomSizedCrop",
                 "RandomResizedCrop", "RandomSizedBBoxSafeCrop", "CropAndPad")
    if hasattr(A, name)
)


def _resizing_steps(transform: object) -> list[str]:
    if isinstance(transform, A.BaseCompose):
        return [name for t in transform.transforms for name in _resizing_steps(t)]
    return [type(transform).__name__] if isinstance(transform, _RESIZING) else []


class AlbumentationsTransform:
    """Per-sample albumentations pipeline, seeded from the sample's generator.

    Pixel-only pipelines (all ``ImageOnlyTransform``: colour, blur, noise, ...) see the image
    alone. A pipeline with geometric (``DualTransform``) steps also carries the polygon vertices
    as keypoints (``remove_invisible=False``, so none is lost and the rings keep their vertex
    counts) and the crowd mask; the caller then clips the polygons to the image again. Vertices
    go in as ``x - 0.5`` because albumentations' keypoints use pixel-centre coordinates (its
    horizontal flip maps ``x`` to ``W - 1 - x``); they come back ``+ 0.5``. Only affine steps keep
    polygon edges straight; with elastic or grid distortions the vertices move correctly but the
    edges between them are approximations.

    Randomness: albumentations 2.0.8 seeds each ``Compose`` once, so forked DataLoader workers
    would share one stream; here every call resets the pipeline's generators from the sample's
    own generator, so draws depend on the sample, not on the worker that builds it.

    Args:
        transforms: see :func:`load_transforms`.

    Raises:
        TypeError, FileNotFoundError: see :func:`load_transforms`.
    """

    def __init__(self, transforms: A.BaseCompose | str | Path | None) -> None:
        self.transforms = load_transforms(transforms)
        resizing = _resizing_steps(self.transforms) if self.transforms is not None else []
        if resizing:
            raise ValueError(
                f"transforms must not resize ({', '.join(resizing)}): albumentations moves keypoints "
                "by half a pixel per unit of scale there, so polygons would drift off the pixels; "
                "the output size is image_size and the scale range is scale"
            )
        self.geometric = self.transforms is not None and _is_geometric(self.transforms)
        self._runner: A.BaseCompose | None = self.transforms
        if self.geometric:
            self._runner = A.Compose(
                [self.transforms],
                keypoint_params=A.KeypointParams(format="xy", remove_invisible=False),
            )

    def __repr__(self) -> str:
        return f"AlbumentationsTransform({self.transforms!r})"

    def __bool__(self) -> bool:
        return self._runner is not None

    def __call__(
        self,
        rng: np.random.Generator,
        image: np.ndarray,
        vertices: np.ndarray | None = None,
        crowd_mask: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Apply the pipeline once.

        Args:
            rng (numpy.random.Generator): the sample's generator (two numbers are drawn).
            image (ndarray[H, W, 3] uint8): RGB image.
            vertices (ndarray[V, 2] float64 | None): polygon vertices in image pixels.
            crowd_mask (ndarray[H, W] uint8 | None): crowd regions.

        Returns:
            (image (ndarray[H', W', 3] uint8), vertices (float64[V, 2], same order) or None,
            crowd mask (uint8[H', W']) or None). Pixel-only pipelines return ``vertices`` and
            ``crowd_mask`` unchanged.
        """
        if self._runner is None:
            return image, vertices, crowd_mask
        seeds = rng.integers(0, 2**63, size=2)
        self._runner.set_random_state(np.random.default_rng(seeds[0]), random.Random(int(seeds[1])))
        if not self.geometric:
            return self._runner(image=image)["image"], vertices, crowd_mask
        data: dict[str, np.ndarray] = {"image": image}
        v = np.zeros((0, 2)) if vertices is None else vertices
        data["keypoints"] = (v - 0.5).astype(np.float32)
        if crowd_mask is not None:
            data["mask"] = crowd_mask
        out = self._runner(**data)
        kp = np.asarray(out["keypoints"], dtype=np.float64).reshape(-1, 2) + 0.5
        if len(kp) != len(v):  # pragma: no cover - guarded by remove_invisible=False
            raise RuntimeError(f"albumentations returned {len(kp)} keypoints for {len(v)} vertices")
        return out["image"], (None if vertices is None else kp), out.get("mask", crowd_mask)
