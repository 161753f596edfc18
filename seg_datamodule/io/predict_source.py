"""What to predict on: a folder of images walked recursively, or a COCO image-info / instances JSON.

A :class:`PredictImages` is the flat list a predict loader reads: each image's path relative to
its root, a COCO image id, and its size when the JSON gives one (``-1`` for a folder, whose sizes
are read from each file when it is decoded).

Image ids of a folder are derived from the relative paths alone
(:func:`~seg_datamodule.io.images.ids.image_id_of`): an all-digit file stem is its id (COCO's and
Ultralytics' convention, so predictions on ``val2017/`` score against COCO's ground truth), any
other name a stable hash of its path (:func:`stable_image_id`); an image keeps its id when other
files are added or removed, on every machine and rank, and two files with one id are refused. The
mapping is written beside the results (see
:class:`~seg_datamodule.evaluation.writer.COCOResultsWriter`). A folder's images are user photos:
their EXIF orientation is applied (:mod:`seg_datamodule.io.images.exif`), so they are predicted
as a person sees them and their sizes are the turned ones; a JSON's images are COCO's, whose
sizes refer to the stored pixels (orientation ignored). A folder lists every file whose
extension is one OpenCV decodes (:data:`IMAGE_EXTENSIONS`, any case); other files are counted
as ``files_ignored``, never silently dropped. Whether a listed file really decodes is found when
it is read (a bad one is counted or raises there, by ``on_bad_sample``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from seg_datamodule.io.coco import CocoIndex
from seg_datamodule.io.images.ids import assign_image_ids, stable_image_id
from seg_datamodule.io.images.root import ImageRootError
from seg_datamodule.io.paths import file_name_problem

__all__ = ["IMAGE_EXTENSIONS", "PredictImages", "images_from_index", "list_image_folder", "stable_image_id"]

#: File extensions (lower case) OpenCV's ``imread`` decodes in a standard build.
IMAGE_EXTENSIONS: frozenset[str] = frozenset({
    ".bmp", ".dib", ".jpeg", ".jpg", ".jpe", ".jp2", ".png", ".webp", ".avif", ".pbm", ".pgm",
    ".ppm", ".pxm", ".pnm", ".sr", ".ras", ".tiff", ".tif", ".exr", ".hdr", ".pic",
})

@dataclass(frozen=True)
class PredictImages:
    """The images of a predict run, in a fixed order.

    Attributes:
        root (str): folder the file names are relative to.
        file_names (tuple[str, ...]): relative POSIX paths, one per image.
        image_ids (ndarray[N] int64): COCO image ids.
        heights (ndarray[N] int64): stored height per image, ``-1`` when unknown until decoded.
        widths (ndarray[N] int64): stored width, ``-1`` likewise.
        source (str): what the list came from (the folder, or the JSON), for messages.
        counts (dict[str, int]): what was left out while listing (``files_ignored``: files
            without an image extension; the index's skip reasons for a JSON).
        oriented (bool): apply each file's EXIF orientation (a folder of photos), or decode the
            stored pixels (a COCO JSON's images, whose sizes refer to them).
    """

    root: str
    file_names: tuple[str, ...]
    image_ids: np.ndarray
    heights: np.ndarray
    widths: np.ndarray
    source: str
    counts: dict[str, int] = field(default_factory=dict)
    oriented: bool = False

    def __len__(self) -> int:
        return len(self.file_names)

    def path(self, i: int) -> str:
        """Absolute path of image ``i``."""
        return os.path.join(self.root, self.file_names[i])

    def size(self, i: int) -> tuple[int, int] | None:
        """``(H, W)`` of image ``i`` when known before decoding, else None."""
        height, width = int(self.heights[i]), int(self.widths[i])
        return None if height < 1 or width < 1 else (height, width)


def list_image_folder(root: str | os.PathLike[str]) -> PredictImages:
    """Every image file under ``root``, recursively, sorted by relative path.

    Symlinked files are listed; symlinked folders are not entered (a link loop cannot hang the
    walk). Names that are not valid text (a lone surrogate) are refused by the same rule as COCO
    ``file_name`` values and counted as ``files_ignored``.

    Args:
        root (str | PathLike): the folder.

    Returns:
        :class:`PredictImages` with :func:`~seg_datamodule.io.images.ids.image_id_of` ids, unknown
        sizes, and EXIF orientation applied when read.

    Raises:
        ImageRootError: ``root`` is not a folder (a ``FileNotFoundError``).
        ValueError: the folder holds no image file.
        ImageIdClashError: two paths share an id (``7.jpg`` and ``007.png``, or a 53-bit hash
            collision; the message names both).
    """
    base = Path(root)
    if not base.is_dir():
        raise ImageRootError(f"predict_images {str(root)!r} is not a folder", key="predict_images", root=str(root))
    names: list[str] = []
    ignored = 0
    for folder, subfolders, files in os.walk(base):
        subfolders.sort()
        for name in files:
            relative = Path(folder, name).relative_to(base).as_posix()
            if Path(name).suffix.lower() not in IMAGE_EXTENSIONS or file_name_problem(relative) is not None:
                ignored += 1
                continue
            names.append(relative)
    names.sort()
    if not names:
        raise ValueError(
            f"predict_images {str(root)!r} holds no image file (extensions: {', '.join(sorted(IMAGE_EXTENSIONS))}); "
            f"{ignored} other files"
        )
    ids = assign_image_ids(names, repr(str(root)))
    unknown = np.full(len(names), -1, np.int64)
    return PredictImages(
        root=str(base), file_names=tuple(names), image_ids=ids, heights=unknown, widths=unknown.copy(),
        source=str(base), counts={"files_ignored": ignored}, oriented=True,
    )


def images_from_index(
    index: CocoIndex, root: str | os.PathLike[str], ann_file: str | os.PathLike[str]
) -> PredictImages:
    """The images of a COCO image-info or instances JSON, as its index kept them.

    Args:
        index (CocoIndex): the file's index (images skipped at build are in its skip counts).
        root (str | PathLike): the folder ``file_name`` is relative to.
        ann_file (str | PathLike): the JSON, for messages.

    Returns:
        :class:`PredictImages` with the file's ids and sizes (checked against each header when read).
    """
    return PredictImages(
        root=str(root), file_names=tuple(index.file_name(i) for i in range(len(index))),
        image_ids=np.asarray(index.image_ids, np.int64).copy(), heights=np.asarray(index.heights, np.int64).copy(),
        widths=np.asarray(index.widths, np.int64).copy(), source=str(ann_file), counts=dict(index.skip_counts),
    )
