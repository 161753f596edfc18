"""The mosaic and letterbox layouts, and the random affine of a training sample: thin classes over the tile plans.

Each class holds parameters (checked in ``__init__``) and draws randomness from a
``numpy.random.Generator`` passed in; the geometry itself lives in pure functions. The global
random affine of a training sample is one ``2 x 3`` matrix composed with each tile's placement,
so pixels are resampled once and polygons go through the same matrices (see
:mod:`seg_datamodule.transforms.kernels.plan`); the flips (:mod:`seg_datamodule.transforms.geometric.flips`)
then mirror the output (pixels and vertices, exactly, no resample).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from seg_datamodule.ops.affine import compose_affine, make_affine
from seg_datamodule.ops.checks import check_int, check_number
from seg_datamodule.transforms.geometric.flips import RandomFlipLR
from seg_datamodule.transforms.kernels.plan import TilePlan, letterbox_layout, mosaic_layout, snap_for_resize
from seg_datamodule.transforms.steps import Layout, step_arguments

__all__ = ["GlobalDraw", "Letterbox", "MosaicAffine", "RandomAffine"]


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


@dataclass(frozen=True)
class GlobalDraw:
    """The random part of one training sample's placement (the flip is its own step's draw).

    Attributes:
        center (tuple[float, float] | None): mosaic centre on the ``2s x 2s`` canvas; ``None``
            for a single letterboxed image.
        matrix (ndarray[2, 3] float64): canvas pixels -> output pixels (the random affine; for a
            mosaic it puts the centre on an integer output point, see :meth:`MosaicAffine.draw`).
    """

    center: tuple[float, float] | None
    matrix: np.ndarray


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


class MosaicAffine(Layout):
    """YOLO 4-image mosaic (or one letterboxed image) and random affine, drawn together.

    The mosaic centre is drawn in the middle half of a ``2s x 2s`` canvas; the four images are
    scaled to long side ``s`` and placed around it; the affine maps the canvas centre to the
    output centre (``s x s``). Without mosaic the image is letterboxed on an ``s x s`` canvas and
    the same affine applies (as Ultralytics does once ``close_mosaic`` switches mosaic off).

    Args:
        image_size (int): ``s``, the output side.
        degrees, translate, scale, shear: see :class:`RandomAffine`.
        flip_lr (float): probability of a horizontal flip (:attr:`flip`, a canvas step of its own).

    Raises:
        TypeError, ValueError: a parameter is out of range (see :class:`RandomAffine`).
    """

    mosaic_capable: ClassVar[bool] = True
    recipe: ClassVar[str] = "mosaic"

    def __init__(
        self,
        image_size: int = 640,
        degrees: float = 0.0,
        translate: float = 0.1,
        scale: tuple[float, float] = (0.5, 1.5),
        shear: float = 0.0,
        flip_lr: float = 0.5,
    ) -> None:
        with step_arguments("MosaicAffine"):
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
        """Draw the centre (mosaic only), then the affine (the flip step draws after them).

        For a mosaic the affine's translation is moved (by under half a pixel) so the centre
        lands on an integer output point: there the four tiles meet, and
        :func:`~seg_datamodule.transforms.kernels.plan.snap_for_resize` can then keep their seams exact.
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
        return GlobalDraw(center=center, matrix=affine)

    def plan(self, draw: GlobalDraw, image_sizes: np.ndarray, snap: bool = True) -> TilePlan:
        """Tile plan for the drawn geometry and the tiles' original sizes (the flip is not in it).

        Args:
            draw (GlobalDraw): from :meth:`draw`.
            image_sizes (ndarray[K, 2] int): (H, W) per tile; K = 4 for a mosaic, 1 otherwise.
            snap (bool): let axis-aligned tiles be rendered by ``cv2.resize`` (see
                :func:`~seg_datamodule.transforms.kernels.plan.snap_for_resize`); False keeps the designed
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
