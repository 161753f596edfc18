"""A sample's tiles: which images it shows and where, decoded once each, bad images replaced.

The decode planning of the pipeline (:mod:`~seg_datamodule.data.samples.pipeline`). A training sample
first draws its tiles (:class:`TileDraw`: the images and the geometry draw) without decoding
anything, so a batch can plan every tile before its first decode and decode each image once, at
the finest JPEG scale any of its tiles needs (:class:`BatchDecodes
<seg_datamodule.data.samples.decoding.BatchDecodes>`). :meth:`TileLoader.load` then decodes the visible
tiles; an image that fails to load is returned as an event (:class:`BadTile`), replaced by
another image drawn from the sample's generator when the index skips bad samples, and the plan
follows the replacement (its size changes where the tile lands).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from seg_datamodule.io.images.decode import BadImageError
from seg_datamodule.transforms.kernels.plan import TilePlan, choose_reduce, visible_tiles
from seg_datamodule.transforms.steps import CanvasStep, Layout

__all__ = ["BadTile", "Decoder", "TileDraw", "TileLoader", "Tiles", "other_index"]


class Decoder(Protocol):
    """Where a sample's tiles and crowd masks are decoded from (``BatchDecodes``, or one decode per tile)."""

    def get(self, i: int, reduce: int) -> tuple[np.ndarray, int]:
        """Image ``i`` decoded at most at ``reduce``, and the reduction it was decoded at."""

    def crowd(self, i: int) -> np.ndarray | None:
        """Image ``i``'s crowd mask ``bool (H, W)``, or None when it has no crowd region."""


@dataclass(frozen=True)
class TileDraw:
    """What one training sample drew before any decode.

    Attributes:
        ids (ndarray[K] int64): image index per tile (the sample's own image first).
        draw: the layout's random part (its ``draw``: mosaic centre and affine, or LSJ's scale and crop).
        canvas (tuple[tuple[CanvasStep, Any], ...]): the plan-phase canvas steps (the flip) with
            their draws, applied after the warp.
    """

    ids: np.ndarray
    draw: Any
    canvas: tuple[tuple[CanvasStep, Any], ...] = ()


@dataclass(frozen=True)
class BadTile:
    """An image that failed to load while a sample was built (an event for the caller to count)."""

    index: int
    error: BadImageError


@dataclass(frozen=True)
class Tiles:
    """A sample's decoded tiles.

    Attributes:
        ids (ndarray[K] int64): image index per tile, after replacements.
        plan (TilePlan): where each tile lands.
        images (tuple[ndarray | None, ...]): per tile, the decoded image (None: not visible).
        reduces (tuple[int, ...]): per tile, the JPEG reduction its image was decoded at.
        bad (tuple[BadTile, ...]): the images that failed to load, in order; when the loader
            does not replace them, the first one ends the load (the other fields are then unset).
    """

    ids: np.ndarray
    plan: TilePlan | None
    images: tuple[np.ndarray | None, ...]
    reduces: tuple[int, ...]
    bad: tuple[BadTile, ...] = ()

    @property
    def visible(self) -> np.ndarray:
        """(ndarray[K] bool) the tiles that show on the canvas."""
        assert self.plan is not None
        return visible_tiles(self.plan)


class TileLoader:
    """Plans and decodes a sample's tiles over one index's image sizes.

    Args:
        geometry (Layout): what turns a draw and image sizes into a plan.
        sizes (ndarray[I, 2] int64): (H, W) of every image of the index.
        replace_bad (bool): replace an image that fails to load by another (``"skip"``); else
            the first bad image ends the load.
        max_retries (int): bad images tolerated per sample before giving up.
    """

    def __init__(self, geometry: Layout, sizes: np.ndarray, replace_bad: bool,
                 max_retries: int) -> None:
        self.geometry, self.sizes = geometry, sizes
        self.replace_bad, self.max_retries = replace_bad, max_retries

    def plan(self, tiles: TileDraw) -> TilePlan:
        """Where the tiles land, before any decode."""
        return self.geometry.plan(tiles.draw, self.sizes[tiles.ids])

    def load(self, tiles: TileDraw, decoder: Decoder, rng: np.random.Generator, where: str,
             plan: TilePlan | None = None) -> Tiles:
        """Decode the visible tiles at the coarsest JPEG scale their resample allows.

        Args:
            tiles (TileDraw): the sample's draw.
            decoder (Decoder): where images are decoded from.
            rng (numpy.random.Generator): the sample's generator (replacement images).
            where (str): the sample, for the error message.
            plan (TilePlan | None): :meth:`plan` of ``tiles`` when the caller already made it (a
                batch plans every tile before decoding); None plans here.

        Raises:
            RuntimeError: more than ``max_retries`` bad images in the sample.
        """
        ids = tiles.ids.copy()
        if plan is None:
            plan = self.geometry.plan(tiles.draw, self.sizes[ids])
        images: list[np.ndarray | None] = [None] * len(ids)
        reduces = [1] * len(ids)
        bad: list[BadTile] = []
        visible = visible_tiles(plan)
        k = 0
        while k < len(ids):
            if visible[k]:
                try:
                    images[k], reduces[k] = decoder.get(int(ids[k]), choose_reduce(plan.matrices[k]))
                except BadImageError as err:
                    bad.append(BadTile(int(ids[k]), err))
                    if not self.replace_bad:
                        return Tiles(ids, None, (), (), tuple(bad))
                    if len(bad) > self.max_retries:
                        raise RuntimeError(f"more than max_retries={self.max_retries} bad images while building "
                                           f"{where}; last: {err}") from err
                    # Another image in the bad one's place: the plan follows its size.
                    ids[k] = other_index(rng, int(ids[k]), len(self.sizes))
                    plan = self.geometry.plan(tiles.draw, self.sizes[ids])
                    visible = visible_tiles(plan)
                    continue
            k += 1
        return Tiles(ids, plan, tuple(images), tuple(reduces), tuple(bad))


def other_index(rng: np.random.Generator, bad: int, n: int) -> int:
    """A uniform draw from ``0..n-1`` without ``bad`` (``bad`` itself when it is the only one)."""
    if n < 2:
        return bad
    other = int(rng.integers(0, n - 1))
    return other + (other >= bad)
