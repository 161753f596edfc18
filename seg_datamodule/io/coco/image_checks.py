"""Reading an index's image files: one image checked against its JSON entry, or all at once.

The file name is joined to the image root only when it is safe
(:func:`~seg_datamodule.io.paths.file_name_problem`), the file is read with limits and its
header's size checked before decoding (:func:`~seg_datamodule.io.images.decode.decode_image_with_size`),
and every failure is a :class:`~seg_datamodule.io.images.decode.BadImageError` naming the annotation
file, the image id and the file, with a reason a skip counter can count.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from seg_datamodule.io.coco.errors import MAX_EXAMPLES
from seg_datamodule.io.images.decode import BadImageError, read_image_view, reduced_size
from seg_datamodule.io.images.exif import decode_oriented, encoded_jpeg
from seg_datamodule.io.paths import file_name_problem
from seg_datamodule.structures import EncodedImage

__all__ = ["count_image_errors", "find_bad_images", "load_checked_image", "read_encoded_image"]


def load_checked_image(
    image_root: Path,
    file_name: str,
    expected: tuple[int, int],
    *,
    reduce: int,
    check_size: bool,
    where: str,
    ids: Mapping[str, int],
    orientation: int = 1,
) -> np.ndarray:
    """Decode ``image_root / file_name`` to RGB ``uint8``, checked against the JSON's ``(H, W)``.

    Args:
        image_root: the folder of the images.
        file_name: the JSON's ``file_name``.
        expected: the JSON's ``(H, W)`` (of the turned image when ``orientation`` turns it).
        reduce: one of ``(1, 2, 4, 8)``.
        check_size: refuse a file whose stored size is not ``expected``.
        where: what starts every message (the annotation file and image id).
        ids: ``image_id`` and ``image_index``, set on the errors.
        orientation: the EXIF orientation to turn the pixels by
            (:func:`~seg_datamodule.io.images.exif.decode_oriented`); 1: as stored.

    Returns:
        ndarray[ceil(H / reduce), ceil(W / reduce), 3] uint8 RGB.

    Raises:
        BadImageError: an unsafe name, a missing, unreadable, truncated, corrupt or wrongly sized
            file.
    """
    path = image_root / file_name
    unsafe = file_name_problem(file_name)
    if unsafe is not None:  # the build refuses such names; an index made by hand may not
        raise BadImageError(f"{where}: file_name {file_name!r} {unsafe}", path=path, reason="image_unreadable", **ids)
    try:
        image, stored = decode_oriented(read_image_view(path), orientation, reduce=reduce, name=str(path),
                                        expected_size=expected if check_size else None)
    except BadImageError as err:
        raise BadImageError(f"{where}: {err}", path=path, reason=err.reason, **ids) from None
    if check_size and stored != tuple(expected):  # a format whose header was not read
        raise BadImageError(
            f"{where}: image file {path} is {stored[0]}x{stored[1]} (HxW) but the annotation "
            f"file says {expected[0]}x{expected[1]}; its annotations would be misplaced",
            path=path, reason="image_size_mismatch", **ids,
        )
    if check_size and image.shape[:2] != reduced_size(expected, reduce):
        # The decoder gave another size than the header announced: a broken file.
        raise BadImageError(
            f"{where}: image file {path} decoded to {image.shape[0]}x{image.shape[1]} (HxW) "
            f"at reduce={reduce}, not the {reduced_size(expected, reduce)} its size implies",
            path=path, reason="image_corrupt", **ids,
        )
    return image


def read_encoded_image(image_root: Path, file_name: str, expected: tuple[int, int], orientation: int
                       ) -> EncodedImage | None:
    """``image_root / file_name`` kept encoded for the device (``pixels_on_device``) when it is a
    JPEG whose name, size and end marker pass :func:`load_checked_image`'s checks; None otherwise
    (another format, or a problem that :func:`load_checked_image` then reports with its reason).

    Args:
        image_root: the folder of the images.
        file_name: the JSON's ``file_name``.
        expected: the JSON's ``(H, W)`` (of the turned image when ``orientation`` turns it).
        orientation: the EXIF orientation the worker path turns the pixels by; 1: as stored.
    """
    if file_name_problem(file_name) is not None:
        return None
    try:
        data = read_image_view(image_root / file_name)
    except BadImageError:
        return None
    return encoded_jpeg(data, expected, orientation)


def find_bad_images(load: Callable[[int], Any], num_images: int) -> list[BadImageError | None]:
    """Call ``load(i)`` for every image, in threads (decoders release the GIL).

    Returns:
        per image, the :class:`BadImageError` it raised, or None.
    """

    def check(i: int) -> BadImageError | None:
        try:
            load(i)
        except BadImageError as err:
            return err
        return None

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return list(pool.map(check, range(num_images)))


def count_image_errors(
    counts: Mapping[str, int], examples: Mapping[str, list[str]], errors: list[BadImageError], lost: int
) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Skip counts and examples with bad images added (and ``lost`` annotations of theirs).

    Returns:
        new (counts, examples).
    """
    total = Counter(counts)
    kept = {k: list(v) for k, v in examples.items()}
    for err in errors:
        reason = err.reason or "image_corrupt"
        total[reason] += 1
        if len(kept.setdefault(reason, [])) < MAX_EXAMPLES:
            kept[reason].append(str(err))
    total["annotation_of_skipped_image"] += lost
    return {k: v for k, v in total.items() if v}, kept
