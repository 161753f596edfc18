"""EXIF orientation: read from an image file's header, applied to its decoded pixels.

A phone photo is often stored sideways with an EXIF ``Orientation`` tag (1-8) saying how to turn
it for display. COCO's sizes and polygons refer to the stored pixels, so COCO indexes ignore the
tag (:mod:`seg_datamodule.io.images.decode`). Ultralytics' labels and a user's photos refer to the image
as a person sees it, with the tag applied; :func:`decode_oriented` decodes it that way.

OpenCV applies the tag itself in ``imdecode`` for some formats, depending on its release (5.0
does for JPEG, PNG and WebP; older ones for fewer), so the tag is read here (:func:`exif_orientation`:
a JPEG's APP1 segment, a PNG's ``eXIf`` chunk, a WebP's ``EXIF`` chunk) and applied with numpy
(:func:`apply_orientation`) on pixels decoded with the tag ignored: the same pixels whatever the
installed OpenCV, and the same as ``PIL.ImageOps.exif_transpose`` and OpenCV 5's ``imdecode``
(tests/io/test_orientation.py). Other formats are taken as the decoder gives them.

A reduced decode (``reduce`` in 2, 4, 8) of a turned image is made from the full decode by
averaging ``reduce x reduce`` blocks (:func:`block_mean`): libjpeg's reduced grid is anchored
at the stored image's top-left corner, which a flip moves to another corner, so turning a
reduced decode would shift the pixel grid by up to ``reduce - 1`` pixels. Block averaging keeps
the contract of :func:`~seg_datamodule.io.images.decode.decode_image`: output pixel ``k`` covers input
pixels ``[k * reduce, (k + 1) * reduce)``, the last one partially.

:func:`read_image_header`: an image's size as decoded with its EXIF orientation applied, from its header, without decoding it.

What Ultralytics' label coordinates are normalised by (its ``exif_size``). JPEG and PNG: the
stored size from the header (:func:`~seg_datamodule.io.images.decode.header_size`) and the orientation
from the EXIF block in front of the pixels (:func:`~seg_datamodule.io.images.exif.exif_orientation`),
read from the first :data:`HEAD_BYTES` of the file (the whole file when the header runs longer).
Other formats are decoded once to learn their size (OpenCV reads no header without decoding),
WebP's orientation taken from its EXIF chunk as for decoding.
"""

from __future__ import annotations

import os
import struct
from typing import Iterator, NamedTuple

import numpy as np

from seg_datamodule.io.images.decode import (MAX_IMAGE_PIXELS, BadImageError, complete_jpeg_size, decode_image_bytes,
                                             header_size, read_image_file, reduced_size)
from seg_datamodule.structures.pending import EncodedImage

__all__ = ["HEAD_BYTES", "ImageHeader", "apply_orientation", "block_mean", "decode_oriented", "encoded_jpeg",
           "exif_orientation", "jpeg_segments", "oriented_size", "read_image_header"]

_ORIENTATION_TAG = 0x0112
_EXIF_PREFIX = b"Exif\x00\x00"


def _tiff_orientation(tiff: bytes) -> int:
    """The ``Orientation`` tag of IFD0 of a TIFF-structured EXIF block, 1 when absent or invalid."""
    if len(tiff) < 8 or tiff[:2] not in (b"II", b"MM"):
        return 1
    order = "<" if tiff[:2] == b"II" else ">"
    magic, ifd = struct.unpack(order + "HI", tiff[2:8])
    if magic != 42 or ifd + 2 > len(tiff):
        return 1
    (count,) = struct.unpack(order + "H", tiff[ifd:ifd + 2])
    for k in range(count):
        entry = ifd + 2 + 12 * k
        if entry + 12 > len(tiff):
            break
        tag, kind, n = struct.unpack(order + "HHI", tiff[entry:entry + 8])
        if tag != _ORIENTATION_TAG:
            continue
        if n < 1 or kind not in (3, 4):  # SHORT, or LONG as some writers store it
            return 1
        value = struct.unpack(order + ("H" if kind == 3 else "I"), tiff[entry + 8:entry + (10 if kind == 3 else 12)])[0]
        return int(value) if 1 <= value <= 8 else 1
    return 1


def jpeg_segments(data: bytes | memoryview) -> Iterator[tuple[int, int, int]]:
    """``(marker, start, length)`` of each segment of a JPEG header, up to the scan data.

    ``start`` is the segment's ``0xFF`` byte and ``length`` the segment's own length field (its
    payload runs ``start + 4`` to ``start + 2 + length``); fill bytes and the markers without a
    length are stepped over; the walk ends at the scan (``SOS``), the end (``EOI``), a broken
    length or the data's end.
    """
    pos, n = 2, len(data)
    while pos + 4 <= n and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # no length
            pos += 2
            continue
        if marker in (0xDA, 0xD9):  # scan data, or the end
            return
        length = (data[pos + 2] << 8) | data[pos + 3]
        if length < 2:
            return
        yield marker, pos, length
        pos += 2 + length


def _jpeg_exif(data: bytes) -> bytes | None:
    """The TIFF block of a JPEG's first APP1 ``Exif`` segment (before the scan data), or None."""
    for marker, pos, length in jpeg_segments(data):
        if marker == 0xE1 and data[pos + 4:pos + 10] == _EXIF_PREFIX:
            return data[pos + 10:pos + 2 + length]
    return None


def _png_exif(data: bytes) -> bytes | None:
    """The ``eXIf`` chunk of a PNG (it precedes the image data), or None."""
    pos, n = 8, len(data)
    while pos + 8 <= n:
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        if kind == b"eXIf":
            block = data[pos + 8:pos + 8 + length]
            return block[len(_EXIF_PREFIX):] if block.startswith(_EXIF_PREFIX) else block
        if kind in (b"IDAT", b"IEND"):
            return None
        pos += 12 + length
    return None


def _webp_exif(data: bytes) -> bytes | None:
    """The ``EXIF`` chunk of an extended WebP, or None."""
    pos, n = 12, len(data)
    while pos + 8 <= n:
        kind, length = data[pos:pos + 4], int.from_bytes(data[pos + 4:pos + 8], "little")
        if kind == b"EXIF":
            block = data[pos + 8:pos + 8 + length]
            return block[len(_EXIF_PREFIX):] if block.startswith(_EXIF_PREFIX) else block
        pos += 8 + length + (length & 1)
    return None


def exif_orientation(data: bytes | bytearray | memoryview) -> int:
    """The EXIF ``Orientation`` (1-8) an image file's header declares.

    Args:
        data (bytes): the encoded file, or at least its header (a JPEG's segments before the
            scan data, a PNG's chunks before ``IDAT``).

    Returns:
        1 to 8; 1 (as stored) for a file without the tag, with an invalid one, or of another
        format than JPEG, PNG or WebP.
    """
    head = bytes(data[:16])
    if head[:3] == b"\xff\xd8\xff":
        block = _jpeg_exif(bytes(data))
    elif head[:8] == b"\x89PNG\r\n\x1a\n":
        block = _png_exif(bytes(data))
    elif head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        block = _webp_exif(bytes(data))
    else:
        block = None
    return 1 if block is None else _tiff_orientation(block)


def oriented_size(size: tuple[int, int], orientation: int) -> tuple[int, int]:
    """``(H, W)`` of a stored ``size`` once turned by ``orientation`` (5-8 swap the sides)."""
    return (int(size[1]), int(size[0])) if orientation >= 5 else (int(size[0]), int(size[1]))


def encoded_jpeg(data: bytes | bytearray | memoryview, expected: tuple[int, int], orientation: int
                 ) -> EncodedImage | None:
    """A JPEG file kept encoded for the device (``pixels_on_device``), its header checked as the
    worker path checks it; None for anything else (another format, a header that does not parse or
    disagrees with ``expected``): decode that the usual way, which gives its pixels or its error.

    Args:
        data (bytes): the file.
        expected (tuple[int, int]): the index's ``(H, W)``, of the image as turned by ``orientation``.
        orientation (int): the EXIF orientation the worker path turns it by (1: as stored).

    Returns:
        EncodedImage | None: a copy of the bytes (``data`` may be a reused buffer) and ``orientation``.
    """
    try:
        stored = complete_jpeg_size(data)
    except BadImageError:
        return None
    if stored is None or oriented_size(stored, orientation) != tuple(expected):
        return None
    return EncodedImage(np.frombuffer(data, np.uint8).copy(), int(orientation))


def apply_orientation(image: np.ndarray, orientation: int) -> np.ndarray:
    """Turn stored pixels as the EXIF ``orientation`` says, for display.

    Args:
        image (ndarray[H, W, ...]): stored pixels.
        orientation (int): 1 to 8 (1 leaves the image as it is).

    Returns:
        ndarray[H', W', ...], C-contiguous; ``(H', W') = (W, H)`` for 5 to 8.

    Raises:
        ValueError: ``orientation`` is not in 1..8.
    """
    if orientation == 1:
        return image
    turn = {
        2: lambda a: a[:, ::-1],  # mirrored left-right
        3: lambda a: a[::-1, ::-1],  # upside down
        4: lambda a: a[::-1],  # mirrored top-bottom
        5: lambda a: a.swapaxes(0, 1),  # transposed
        6: lambda a: a.swapaxes(0, 1)[:, ::-1],  # turned 90 degrees clockwise
        7: lambda a: a[::-1, ::-1].swapaxes(0, 1),  # transversed
        8: lambda a: a.swapaxes(0, 1)[::-1],  # turned 90 degrees counter-clockwise
    }.get(orientation)
    if turn is None:
        raise ValueError(f"orientation must be an EXIF orientation 1..8, got {orientation!r}")
    return np.ascontiguousarray(turn(image))


def block_mean(image: np.ndarray, reduce: int) -> np.ndarray:
    """Average ``reduce x reduce`` pixel blocks (the last row and column of blocks partial).

    Args:
        image (ndarray[H, W, C] uint8): pixels.
        reduce (int): block side.

    Returns:
        ndarray[ceil(H / reduce), ceil(W / reduce), C] uint8, each value the rounded mean of its block.
    """
    if reduce == 1:
        return image
    h, w, c = image.shape
    rows, cols = -(-h // reduce), -(-w // reduce)
    padded = np.zeros((rows * reduce, cols * reduce, c), np.uint32)
    padded[:h, :w] = image
    sums = padded.reshape(rows, reduce, cols, reduce, c).sum(axis=(1, 3))
    counts = np.outer(np.minimum(reduce, h - reduce * np.arange(rows)),
                      np.minimum(reduce, w - reduce * np.arange(cols)))[..., None].astype(np.uint32)
    return ((sums + counts // 2) // counts).astype(np.uint8)


def decode_oriented(
    data: bytes | bytearray | memoryview,
    orientation: int,
    *,
    reduce: int = 1,
    name: str = "<bytes>",
    expected_size: tuple[int, int] | None = None,
) -> tuple[np.ndarray, tuple[int, int]]:
    """Decode an encoded image to RGB ``uint8`` as a person sees it: turned by ``orientation``.

    Args:
        data (bytes): the encoded file.
        orientation (int): its EXIF orientation (:func:`exif_orientation`), 1 to 8.
        reduce (int): one of ``(1, 2, 4, 8)``: the result is ``(ceil(H / reduce), ceil(W / reduce))``
            for the turned ``(H, W)`` (see the module docstring for how a turned image is reduced).
        name (str): the file, for error messages.
        expected_size (tuple[int, int] | None): the turned ``(H, W)`` the file must have; the
            header is checked against it (sides swapped for 5 to 8) before decoding.

    Returns:
        (image (ndarray[h, w, 3] uint8 RGB), the turned full size ``(H, W)``).

    Raises:
        ValueError: a bad ``reduce`` or ``orientation``.
        BadImageError: as :func:`~seg_datamodule.io.images.decode.decode_image_bytes`.
    """
    if orientation == 1:
        return decode_image_bytes(data, reduce=reduce, name=name, expected_size=expected_size)
    stored_expected = None if expected_size is None else oriented_size(expected_size, orientation)
    reduced_size((1, 1), reduce)  # a bad reduce fails as in a plain decode
    image, stored = decode_image_bytes(data, reduce=1, name=name, expected_size=stored_expected)
    return block_mean(apply_orientation(image, orientation), reduce), oriented_size(stored, orientation)


# An image's size as decoded with its orientation applied, from its header, without decoding it.

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
            pixels can be decoded (``reason`` as :func:`~seg_datamodule.io.images.decode.decode_image_bytes`).
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
