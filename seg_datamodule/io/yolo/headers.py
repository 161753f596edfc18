"""An image's size as decoded with its EXIF orientation applied, from its header, without decoding it.

What Ultralytics' label coordinates are normalised by (its ``exif_size``). JPEG and PNG: the
stored size from the header (:func:`~seg_datamodule.io.images.header_size`) and the orientation
from the EXIF block in front of the pixels (:func:`~seg_datamodule.io.orientation.exif_orientation`),
read from the first :data:`HEAD_BYTES` of the file (the whole file when the header runs longer).
Other formats are decoded once to learn their size (OpenCV reads no header without decoding),
WebP's orientation taken from its EXIF chunk as for decoding.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from seg_datamodule.io.images import BadImageError, MAX_IMAGE_PIXELS, decode_image_bytes, header_size, read_image_file
from seg_datamodule.io.orientation import exif_orientation, oriented_size

__all__ = ["HEAD_BYTES", "ImageHeader", "read_image_header"]

#: Bytes read for a header: a JPEG's EXIF segment (at most 64 KiB) and its frame header.
HEAD_BYTES = 1 << 16


class ImageHeader(NamedTuple):
    """An image's ``(H, W)`` as a person sees it (turned), and its EXIF orientation (1-8)."""

    size: tuple[int, int]
    orientation: int


def read_image_header(path: str | os.PathLike[str]) -> ImageHeader:
    """The turned size and the orientation of an image file (see the module docstring).

    Raises:
        BadImageError: the file is missing, unreadable, too large, or neither its header nor its
            pixels can be decoded (``reason`` as :func:`~seg_datamodule.io.images.decode_image_bytes`).
    """
    name = os.fspath(path)
    data = read_image_file(name, head=HEAD_BYTES)
    stored = header_size(data)
    if stored is None and len(data) == HEAD_BYTES:  # a header longer than the head, or another format
        data = read_image_file(name)
        stored = header_size(data)
    if stored is None:
        stored = decode_image_bytes(data, name=name)[1]
    if stored[0] * stored[1] > MAX_IMAGE_PIXELS:
        raise BadImageError(f"image file {name} claims {stored[0]}x{stored[1]} (HxW) pixels, over the limit of "
                            f"{MAX_IMAGE_PIXELS}", path=name, reason="image_corrupt")
    orientation = exif_orientation(data)
    return ImageHeader(oriented_size(stored, orientation), orientation)
