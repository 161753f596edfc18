"""COCO image ids for images named only by their files (a predicted folder, an Ultralytics dataset).

The COCO and Ultralytics convention: a file whose stem is all digits (``000000397133.jpg``) has
that number as its id, so predictions on COCO's own folders score against COCO's ground truth.
Any other name gets a stable hash of its path relative to the folder (:func:`stable_image_id`):
the same id on every machine and run, whatever else the folder holds. Two files that end up with
one id (``7.jpg`` and ``007.png``, or a hash that meets a number) are refused, naming both
(:func:`assign_image_ids`).
"""

from __future__ import annotations

import hashlib
from pathlib import PurePosixPath
from typing import Sequence

import numpy as np

from seg_datamodule.errors import UserInputError

__all__ = ["ImageIdClashError", "assign_image_ids", "image_id_of", "stable_image_id"]

# 53 bits: exact as a JSON number in every reader (JavaScript's doubles included).
_ID_BITS = 53


class ImageIdClashError(UserInputError, ValueError):
    """Two image files would share one image id; the message names both and the id."""


def stable_image_id(relative_path: str) -> int:
    """A positive image id from a path relative to the folder (POSIX separators).

    The first 53 bits of the path's BLAKE2b digest, plus one: the same path gives the same id
    on every machine and run, whatever else the folder holds.

    Args:
        relative_path (str): e.g. ``"sub/img_001.jpg"``.

    Returns:
        int in ``[1, 2**53]``.
    """
    digest = hashlib.blake2b(relative_path.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> (64 - _ID_BITS)) + 1


def image_id_of(relative_path: str) -> int:
    """The image id of a file: its all-digit stem as a number, else :func:`stable_image_id`.

    Args:
        relative_path (str): the path relative to the folder (POSIX separators),
            e.g. ``"val2017/000000397133.jpg"`` (id 397133) or ``"holiday/IMG_0042.JPG"``.

    Returns:
        int in ``[0, 2**53]`` (stems over ``2**53`` are hashed: ids stay exact in JSON).
    """
    stem = PurePosixPath(relative_path).stem
    if stem.isascii() and stem.isdigit() and int(stem) <= 2**_ID_BITS:
        return int(stem)
    return stable_image_id(relative_path)


def assign_image_ids(relative_paths: Sequence[str], where: str) -> np.ndarray:
    """The image id of each file (:func:`image_id_of`), refusing two files with one id.

    Args:
        relative_paths (Sequence[str]): the files, relative to their folder, each once.
        where (str): the folder or dataset, for the message.

    Returns:
        ndarray[N] int64.

    Raises:
        ImageIdClashError: two paths share an id; the message names both.
    """
    ids = np.fromiter((image_id_of(p) for p in relative_paths), np.int64, len(relative_paths))
    order = np.argsort(ids, kind="stable")
    same = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if same.size:
        a, b = relative_paths[int(order[same[0]])], relative_paths[int(order[same[0] + 1])]
        raise ImageIdClashError(
            f"{where}: {a!r} and {b!r} would both have image id {int(ids[order[same[0]]])} (an all-digit file "
            "stem is its image id, other names a hash of their path); rename one"
        )
    return ids
