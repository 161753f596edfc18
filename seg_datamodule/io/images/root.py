"""Is an image root the folder an index's file names point into? A sample of them, checked at setup.

A wrong ``val_images`` used to surface only at the first batch: as 161 lines of tracebacks with
``on_bad_sample: raise``, or, with ``skip``, as a run that "validated" nothing and printed AP 0
(issues 35 and 40). :func:`sample_image_root` looks, before any worker starts, at whether the
folder exists, holds anything, and holds an evenly spread sample of the files the index names
(a ``stat`` each: no decode), and returns what it found as a :class:`RootSample`; the caller
decides (the DataModule stops when none of the sample is there and warns past a small share).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from seg_datamodule.io.paths import InputPathError

__all__ = ["ImageRootError", "RootSample", "sample_image_root", "sample_positions"]

#: Files checked per split: 64 stats cost nothing, and a share above 5 % shows in the sample.
SAMPLE_SIZE = 64


class ImageRootError(InputPathError):
    """An image folder that is missing, empty, or does not hold the files its index names.

    An :class:`~seg_datamodule.io.paths.InputPathError`: the DataModule's ``__init__``
    already refused a folder that does not exist; this is what only a look inside it shows.

    Rebuilt from its message alone (as pickling does), the attributes are ``None``.

    Attributes:
        key (str | None): the argument that named the folder (``"val_images"``).
        root (str | None): the folder.
    """

    def __init__(self, message: str, *, key: str | None = None, root: str | None = None) -> None:
        super().__init__(message)
        self.key, self.root = key, root


@dataclass(frozen=True)
class RootSample:
    """What a sample of an index's files showed.

    Attributes:
        images (int): images the index names.
        sampled (int): files looked for.
        missing (tuple[str, ...]): the sampled file names that are not regular files in the root.
    """

    images: int
    sampled: int
    missing: tuple[str, ...]

    @property
    def missing_share(self) -> float:
        """Share of the sample that is missing (0 for an empty sample)."""
        return len(self.missing) / self.sampled if self.sampled else 0.0


def sample_positions(n: int, k: int = SAMPLE_SIZE) -> np.ndarray:
    """``min(n, k)`` distinct positions spread evenly over ``0..n-1``, first and last included.

    Returns:
        ndarray[m] int64, sorted.
    """
    if n <= 0 or k <= 0:
        return np.zeros(0, np.int64)
    return np.unique(np.linspace(0, n - 1, min(n, k)).round().astype(np.int64))


def sample_image_root(root: str | os.PathLike[str], n: int, file_name: Callable[[int], str], key: str,
                      source: str) -> RootSample:
    """Check that ``root`` is a non-empty folder and look for an even sample of the ``n`` files.

    Args:
        root: the image folder.
        n: how many images the index names.
        file_name: image position -> its path relative to ``root`` (``CocoIndex.file_name``).
        key: the argument that named the folder, for messages (``"val_images"``).
        source: what names the files (the annotation file), for messages.

    Returns:
        :class:`RootSample`.

    Raises:
        ImageRootError: naming ``key`` and the folder: it does not exist, is not a folder, holds
            nothing while ``source`` names ``n > 0`` images, or holds none of the sampled files
            (one example's expected path is given).
    """
    folder = os.fspath(root)
    if not os.path.isdir(folder):
        what = "does not exist" if not os.path.exists(folder) else "is not a folder"
        raise ImageRootError(f"{key} {folder!r} {what}; expected the folder of the {n} images {source} names",
                             key=key, root=folder)
    positions = sample_positions(n)
    with os.scandir(folder) as entries:
        empty = next(entries, None) is None
    if n > 0 and empty:
        raise ImageRootError(f"{key} {folder!r} is empty; expected the {n} images {source} names, e.g. "
                             f"{file_name(int(positions[0]))!r}", key=key, root=folder)
    names = [file_name(int(i)) for i in positions]
    missing = tuple(name for name in names if not os.path.isfile(os.path.join(folder, name)))
    if names and len(missing) == len(names):
        raise ImageRootError(
            f"{key} {folder!r} holds none of the {len(names)} files sampled from the {n} images {source} names "
            f"(e.g. {os.path.join(folder, names[0])!r}); expected the folder those file names are relative to",
            key=key, root=folder)
    return RootSample(n, len(names), missing)
