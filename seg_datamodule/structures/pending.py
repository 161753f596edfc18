"""Pixels still to make on the device (``pixels_on_device``): what a sample and a batch ship instead.

The workers plan every tile, transport the polygons and rasterise the masks as always, but leave
the pixels to the accelerator: per tile its image's encoded JPEG bytes (or, for another format,
the pixels the workers decoded), its plan, and the flips drawn for the canvas.
``COCOSegDataModule.on_after_batch_transfer`` decodes, warps and flips them
(:func:`~seg_datamodule.data.batching.device_pixels.apply_pending_pixels`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

__all__ = ["EncodedImage", "PendingPixels", "PendingTiles"]


@dataclass(frozen=True)
class EncodedImage:
    """An image's JPEG file, to be decoded on the device.

    Attributes:
        data (ndarray[n] uint8): the file's bytes.
        orientation (int): the EXIF orientation the worker path turns the pixels by (1: as stored).
        reduce (int): the worker path would decode it this many times smaller (1, 2, 4 or 8); the
            device averages blocks of that side.
    """

    data: np.ndarray
    orientation: int = 1
    reduce: int = 1


#: A tile's source: the encoded file, the decoded ``(h, w, 3)`` RGB pixels (not a JPEG), or None
#: (the tile shows nowhere on the canvas).
TileSource = EncodedImage | np.ndarray | None


@dataclass(frozen=True)
class PendingTiles:
    """One sample's pixels, still to be made: its tiles' sources and plan, and its flips.

    Attributes:
        ids (ndarray[K] int64): image index per tile (a batch ships each image once per scale).
        sources (tuple[TileSource, ...]): per tile, what the device warps.
        reduces (tuple[int, ...]): per tile, the scale its source is decoded at (1: full size).
        matrices (ndarray[K, 2, 3] float64), regions (ndarray[K, 4] float64), resize
            (ndarray[K, 8] int64 | None): the tiles' ``TilePlan`` fields.
        flips (tuple[int, int]): how many times the canvas is mirrored upside down (axis 0) and
            left-right (axis 1) after the warp; flips commute, so only their parity counts.
    """

    ids: np.ndarray
    sources: tuple[TileSource, ...]
    reduces: tuple[int, ...]
    matrices: np.ndarray
    regions: np.ndarray
    resize: np.ndarray | None
    flips: tuple[int, int] = (0, 0)

    def flipped(self, axis: int) -> PendingTiles:
        """These pixels mirrored once more along ``axis`` (0 upside down, 1 left-right)."""
        counts = list(self.flips)
        counts[axis] += 1
        return replace(self, flips=(counts[0], counts[1]))


@dataclass(frozen=True)
class PendingPixels:
    """A batch's pixels, still to be made: every image once, and each sample's tiles.

    Holds no tensors, so moving the batch (``DetectionBatch.to``, ``pin_memory``) leaves it on the
    CPU, where the JPEG decoders read their input.

    Attributes:
        sources (tuple[EncodedImage | ndarray, ...]): the batch's images, each once per scale.
        tile_sources (tuple[tuple[int, ...], ...]): per sample, per tile, the index of its source
            (-1: the tile shows nowhere).
        tile_reduces (tuple[tuple[int, ...], ...]): per sample, per tile, its source's scale.
        matrices, regions, resize (tuple[ndarray, ...]): per sample, its ``TilePlan`` fields.
        output_size (tuple[int, int]): the canvas ``(H, W)``.
        flips (ndarray[B, 2] bool): per sample, mirror it upside down, left-right (after the warp).
        image_ids (ndarray[B] int64): per sample, its image id (for error messages).
        channels_last (bool): the memory format of the images the batch would have carried.
    """

    sources: tuple[EncodedImage | np.ndarray, ...]
    tile_sources: tuple[tuple[int, ...], ...]
    tile_reduces: tuple[tuple[int, ...], ...]
    matrices: tuple[np.ndarray, ...]
    regions: tuple[np.ndarray, ...]
    resize: tuple[np.ndarray | None, ...]
    output_size: tuple[int, int]
    flips: np.ndarray
    image_ids: np.ndarray
    channels_last: bool = True

    @classmethod
    def of(cls, tiles: list[PendingTiles], output_size: tuple[int, int], image_ids: np.ndarray,
           channels_last: bool) -> PendingPixels:
        """The batch of these samples' pending tiles, each image shipped once per scale."""
        position: dict[tuple[int, int], int] = {}
        sources: list[EncodedImage | np.ndarray] = []
        rows = []
        for sample in tiles:
            row = []
            for i, source, reduce in zip(sample.ids.tolist(), sample.sources, sample.reduces):
                if source is None:
                    row.append(-1)
                    continue
                if (i, reduce) not in position:
                    position[i, reduce] = len(sources)
                    sources.append(source)
                row.append(position[i, reduce])
            rows.append(tuple(row))
        flips = np.array([[f % 2 == 1 for f in sample.flips] for sample in tiles], bool).reshape(len(tiles), 2)
        return cls(tuple(sources), tuple(rows), tuple(t.reduces for t in tiles), tuple(t.matrices for t in tiles), tuple(t.regions for t in tiles),
                   tuple(t.resize for t in tiles), output_size, flips, np.asarray(image_ids, np.int64),
                   channels_last)
