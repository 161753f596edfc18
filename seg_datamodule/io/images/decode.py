"""Image decoding: any file OpenCV reads, always to RGB ``uint8`` ``(H, W, 3)``, errors named.

Decoder choice (``benchmarks/bench_coco_index.py --decoders``: coco-mini's 80 train JPEGs, one
thread, best of 5, ms per image, on a shared machine where runs differ by ~10%):

=================================  =====  =====  =====  =====
decoder                            r=1    r=2    r=4    r=8
=================================  =====  =====  =====  =====
``cv2.imdecode`` + BGR->RGB        1.50   1.30   1.40   1.08
:func:`decode_image_bytes` (cv2)   1.46   1.28   1.19   1.10
PIL (``Image.draft`` if reduced)   1.73   1.35   1.25   1.15
``torchvision.io.decode_jpeg``     1.39   --     --     --
=================================  =====  =====  =====  =====

Where OpenCV has ``IMREAD_COLOR_RGB`` the decoder writes RGB itself, saving the whole-image
``cvtColor`` of the first row (the same pixels bit for bit; older OpenCV keeps the conversion).
All three wrap libjpeg-turbo and give bit-identical pixels. torchvision ties OpenCV at full size
(1.40 once made HWC numpy; other runs had it 3% behind) but cannot decode at reduced scale, and
PIL is slower at full size and clips 16-bit ``I;16`` PNGs; OpenCV is as fast as the fastest at
every scale and turns grayscale, CMYK / YCCK JPEG, RGBA / LA / palette / 1-bit PNG and 16-bit
PNG (keeping the high byte) into 3-channel 8-bit pixels in one call, so it is the decoder here.

Conventions of :func:`decode_image`:

* Channels are RGB; alpha is dropped, not composited (COCO annotations ignore transparency).
* EXIF orientation is **ignored** (``IMREAD_IGNORE_ORIENTATION``): COCO's width, height and
  polygons refer to the stored pixel grid, and OpenCV would otherwise rotate such images.
* ``reduce`` in ``(1, 2, 4, 8)`` returns exactly ``(ceil(H / reduce), ceil(W / reduce))`` for a
  stored ``(H, W)``. JPEGs are decoded by libjpeg's DCT scaling (``IMREAD_REDUCED_COLOR_*``, output
  pixel ``k`` covers stored pixels ``[k * reduce, (k + 1) * reduce)``, the last one partially);
  other formats are decoded in full and shrunk with ``INTER_AREA`` to that size.
* The stored full size is known even for a reduced decode (read from the JPEG SOF header), so a
  caller can compare it with the annotation's width and height exactly at any ``reduce``.

Files are read with limits (:mod:`seg_datamodule.io.images.files`, whose readers this module
re-exports): only regular files are opened (a FIFO or a device, also through a symlink, is
refused without blocking), at most :data:`MAX_IMAGE_BYTES` bytes, and the size in a
JPEG or PNG header is checked (against the caller's expected size, and against
:data:`MAX_IMAGE_PIXELS`) before anything is decoded.

Bad files raise :class:`~seg_datamodule.io.images.errors.BadImageError` naming the file and a
``reason`` key (see :mod:`seg_datamodule.io.images.errors`).
"""

from __future__ import annotations

import os

import cv2
import numpy as np

from seg_datamodule.io.images.errors import IMAGE_ERROR_REASONS, BadImageError
from seg_datamodule.io.images.files import MAX_IMAGE_BYTES, read_image_file, read_image_view

__all__ = [
    "BadImageError",
    "IMAGE_ERROR_REASONS",
    "MAX_IMAGE_BYTES",
    "MAX_IMAGE_PIXELS",
    "REDUCE_FACTORS",
    "complete_jpeg_size",
    "decode_image",
    "decode_image_bytes",
    "decode_image_with_size",
    "header_size",
    "read_image_file",
    "read_image_view",
    "reduced_size",
]

#: Most pixels an image may have: OpenCV's own decode limit (``CV_IO_MAX_IMAGE_PIXELS``).
MAX_IMAGE_PIXELS = 1 << 30

#: Allowed values of ``reduce`` (libjpeg's DCT scaling factors).
REDUCE_FACTORS: tuple[int, ...] = (1, 2, 4, 8)

_REDUCED_FLAG = {
    1: cv2.IMREAD_COLOR,
    2: cv2.IMREAD_REDUCED_COLOR_2,
    4: cv2.IMREAD_REDUCED_COLOR_4,
    8: cv2.IMREAD_REDUCED_COLOR_8,
}
_IGNORE_ORIENTATION = cv2.IMREAD_IGNORE_ORIENTATION

#: ``cv2.IMREAD_COLOR_RGB`` where the installed OpenCV has it (the 4.12 and 5.0 wheels; not 4.9 or
#: 4.10.0.84): the decoder writes RGB itself (libjpeg-turbo's ``JCS_EXT_RGB``) instead of BGR
#: followed by a whole-image ``cvtColor``. Same pixels bit for bit on every format and reduce
#: factor tested (``tests/io/test_images.py``); None: decode BGR and convert.
_IMREAD_COLOR_RGB: int | None = getattr(cv2, "IMREAD_COLOR_RGB", None)


def _imdecode_rgb(buf: np.ndarray, reduce: int) -> np.ndarray | None:
    """``cv2.imdecode`` to RGB at DCT scale ``reduce`` (1 for a full decode), orientation ignored.

    Returns:
        ndarray[h, w, 3] uint8 RGB, or None when OpenCV cannot decode ``buf``.

    Raises:
        cv2.error: as ``cv2.imdecode``.
    """
    rgb_flag = _IMREAD_COLOR_RGB
    if rgb_flag is None:
        bgr = cv2.imdecode(buf, _REDUCED_FLAG[reduce] | _IGNORE_ORIENTATION)
        return None if bgr is None else cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    # OpenCV refuses IMREAD_COLOR_BGR (the low bit of IMREAD_REDUCED_COLOR_*) together with
    # IMREAD_COLOR_RGB; the scale is read from the other bits alone (loadsave.cpp).
    return cv2.imdecode(buf, (_REDUCED_FLAG[reduce] & ~cv2.IMREAD_COLOR) | rgb_flag | _IGNORE_ORIENTATION)


def reduced_size(size: tuple[int, int], reduce: int) -> tuple[int, int]:
    """Size of an image of stored ``size`` decoded at ``reduce``.

    Args:
        size (tuple[int, int]): stored ``(H, W)``.
        reduce (int): one of :data:`REDUCE_FACTORS`.

    Returns:
        ``(ceil(H / reduce), ceil(W / reduce))``.

    Raises:
        ValueError: ``reduce`` is not one of :data:`REDUCE_FACTORS`.
    """
    _check_reduce(reduce)
    return -(-int(size[0]) // reduce), -(-int(size[1]) // reduce)


def _check_reduce(reduce: int) -> None:
    if type(reduce) is not int or reduce not in REDUCE_FACTORS:
        raise ValueError(f"reduce must be one of {REDUCE_FACTORS}, got {reduce!r}")


def _last_eoi(data: bytes | memoryview) -> int:
    """Where the last ``FF D9`` of ``data`` starts (-1: none), searching a short tail first.

    The same answer as ``bytes(data).rfind(b"\xff\xd9")`` without copying a whole file held in
    a view: an ``FF D9`` starting in the tail is later than any starting before it.
    """
    if isinstance(data, bytes):
        return data.rfind(b"\xff\xd9")
    n = len(data)
    tail_start = max(n - 4096, 0)
    found = bytes(data[tail_start:]).rfind(b"\xff\xd9")
    if found >= 0 or tail_start == 0:
        return tail_start + found if found >= 0 else -1
    return bytes(data[: tail_start + 1]).rfind(b"\xff\xd9")  # + 1: a pair across the cut


def _jpeg_header(data: bytes | memoryview) -> tuple[tuple[int, int] | None, bool]:
    """Stored size from a JPEG's SOF marker and whether an EOI marker follows the scan data.

    Walks the marker segments from SOI to the first SOS by their lengths (so an EXIF thumbnail,
    which has its own SOI/EOI inside APP1, is skipped), then looks for ``FF D9`` after the SOS:
    in entropy-coded data an ``FF`` byte is always followed by ``00`` or a restart marker, so an
    ``FF D9`` there is the real end of image (also for progressive files, whose later scans are
    separated by marker segments).

    Returns:
        ((H, W) or None when the header cannot be parsed, True when EOI is present). A header that
        cannot be walked returns ``(None, True)``: the decoder then has the last word.
    """
    n = len(data)
    pos = 2
    size: tuple[int, int] | None = None
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None, True
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # TEM / RSTn: no length
            pos += 2
            continue
        length = (data[pos + 2] << 8) | data[pos + 3]
        if length < 2:
            return None, True
        if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
            if pos + 9 > n:
                return None, False
            height = (data[pos + 5] << 8) | data[pos + 6]
            width = (data[pos + 7] << 8) | data[pos + 8]
            size = (height, width) if height > 0 and width > 0 else None
        if marker == 0xDA:  # SOS: scan data follows the header
            # rfind: in a complete file the last FF D9 is (nearly) the last two bytes.
            return size, _last_eoi(data) >= pos + 2 + length
        pos += 2 + length
    # The data ended inside the header: certainly truncated.
    return size, False


def _byte_view(data: bytes | bytearray | memoryview) -> bytes | memoryview:
    """``data`` indexable byte by byte (ints), without copying it."""
    return data if isinstance(data, bytes) else memoryview(data).cast("B")


def complete_jpeg_size(data: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """The stored ``(H, W)`` of a JPEG whose header parses and whose end-of-image marker is there
    (what the decode path checks before decoding); None for anything else."""
    if bytes(data[:3]) != b"\xff\xd8\xff":
        return None
    stored, complete = _jpeg_header(_byte_view(data))
    return stored if complete else None


def header_size(data: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """The stored ``(H, W)`` a JPEG (SOF marker) or PNG (IHDR chunk) header announces.

    Args:
        data (bytes): the encoded file, or at least its header.

    Returns:
        ``(H, W)``, or None for other formats and headers that cannot be parsed.
    """
    head = bytes(data[:4])
    if head[:3] == b"\xff\xd8\xff":
        return _jpeg_header(_byte_view(data))[0]
    if head == b"\x89PNG" and len(data) >= 24 and bytes(data[12:16]) == b"IHDR":
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        return (height, width) if height > 0 and width > 0 else None
    return None


def _describe(name: str) -> str:
    return f"image file {name}"


def _check_header(
    data: bytes | bytearray | memoryview, name: str, expected_size: tuple[int, int] | None
) -> None:
    """Refuse, before decoding, a header whose size is not the expected one or is too large."""
    size = header_size(data)
    if size is None:
        return
    if expected_size is not None and size != tuple(expected_size):
        raise BadImageError(
            f"{_describe(name)} is {size[0]}x{size[1]} (HxW) but the annotation file says "
            f"{expected_size[0]}x{expected_size[1]}; its annotations would be misplaced",
            path=name,
            reason="image_size_mismatch",
        )
    if size[0] * size[1] > MAX_IMAGE_PIXELS:
        raise BadImageError(
            f"{_describe(name)} claims {size[0]}x{size[1]} (HxW) pixels, over the limit of {MAX_IMAGE_PIXELS}",
            path=name,
            reason="image_corrupt",
        )


def decode_image_bytes(
    data: bytes | bytearray | memoryview,
    *,
    reduce: int = 1,
    name: str = "<bytes>",
    expected_size: tuple[int, int] | None = None,
) -> tuple[np.ndarray, tuple[int, int]]:
    """Decode an encoded image held in memory to RGB ``uint8``.

    Args:
        data (bytes): the encoded file (JPEG, PNG, or any format OpenCV reads).
        reduce (int): shrink factor, one of :data:`REDUCE_FACTORS` (see the module docstring).
        name (str): the file's name, for error messages.
        expected_size (tuple[int, int] | None): ``(H, W)`` the file must have; a JPEG or PNG
            header announcing another size is refused before decoding.

    Returns:
        (image (ndarray[ceil(H / reduce), ceil(W / reduce), 3] uint8, RGB, C-contiguous),
        stored size ``(H, W)`` of the encoded image).

    Raises:
        ValueError: ``reduce`` is not one of :data:`REDUCE_FACTORS`.
        BadImageError: ``reason`` ``image_size_mismatch`` (header), ``image_truncated`` or
            ``image_corrupt``; the message names ``name``.
    """
    _check_reduce(reduce)
    buf = np.frombuffer(data, np.uint8)
    if buf.size == 0:
        raise BadImageError(f"{_describe(name)} is empty", path=name, reason="image_truncated")
    is_jpeg = buf.size >= 3 and bytes(buf[:3]) == b"\xff\xd8\xff"
    stored: tuple[int, int] | None = None
    scale = 1
    scaled = False  # decoded by libjpeg at reduced scale: the stored size comes from the header
    if is_jpeg:
        stored, complete = _jpeg_header(_byte_view(data))
        if not complete:
            # OpenCV 5 refuses such files itself, 4.x decodes them with a grey bottom part.
            raise BadImageError(
                f"{_describe(name)} is truncated: JPEG end-of-image marker missing",
                path=name,
                reason="image_truncated",
            )
    _check_header(data, name, expected_size)  # before decoding: a header may claim 30000x30000
    if is_jpeg and reduce > 1 and stored is not None:
        scale = reduce
        scaled = True
    try:
        rgb = _imdecode_rgb(buf, scale)
    except cv2.error as err:  # e.g. a header announcing absurd dimensions
        raise BadImageError(
            f"{_describe(name)} is corrupt: OpenCV cannot decode it ({err.msg or err})",
            path=name,
            reason="image_corrupt",
        ) from None
    if rgb is None:
        # A JPEG reaching here has its end-of-image marker (truncation was ruled out above).
        what = "corrupt" if is_jpeg else "corrupt, truncated or in an unsupported format"
        raise BadImageError(
            f"{_describe(name)} is {what}: OpenCV cannot decode it", path=name, reason="image_corrupt"
        )
    if not scaled:
        stored = (int(rgb.shape[0]), int(rgb.shape[1]))
    target = reduced_size(stored, reduce)
    if rgb.shape[:2] != target:
        # Non-JPEG (or a JPEG libjpeg would not scale): shrink the full decode to the contract.
        rgb = cv2.resize(rgb, (target[1], target[0]), interpolation=cv2.INTER_AREA)
    return rgb, stored


def decode_image_with_size(
    path: str | os.PathLike[str], *, reduce: int = 1, expected_size: tuple[int, int] | None = None
) -> tuple[np.ndarray, tuple[int, int]]:
    """Read (:func:`read_image_view`) and decode an image file to RGB ``uint8``; also return its stored size.

    Args:
        path (str | PathLike): the image file.
        reduce (int): shrink factor, one of :data:`REDUCE_FACTORS`.
        expected_size (tuple[int, int] | None): ``(H, W)`` the file must have, checked against
            a JPEG or PNG header before decoding.

    Returns:
        (image (ndarray[ceil(H / reduce), ceil(W / reduce), 3] uint8 RGB), stored ``(H, W)``).

    Raises:
        ValueError: ``reduce`` is not one of :data:`REDUCE_FACTORS`.
        BadImageError: ``reason`` ``image_missing``, ``image_unreadable``, ``image_size_mismatch``,
            ``image_truncated`` or ``image_corrupt``; the message names ``path``.
    """
    _check_reduce(reduce)
    data = read_image_view(path)  # decoded at once: this thread's reused buffer is enough
    return decode_image_bytes(data, reduce=reduce, name=os.fspath(path), expected_size=expected_size)


def decode_image(path: str | os.PathLike[str], *, reduce: int = 1) -> np.ndarray:
    """Read and decode an image file to RGB ``uint8``, whatever the file holds.

    Grayscale, CMYK JPEG, RGBA / palette / 16-bit PNG all come out as 3-channel 8-bit RGB; EXIF
    orientation is ignored (see the module docstring).

    Args:
        path (str | PathLike): the image file.
        reduce (int): shrink factor, one of :data:`REDUCE_FACTORS`; the result is
            ``(ceil(H / reduce), ceil(W / reduce))`` for a stored ``(H, W)``.

    Returns:
        ndarray[h, w, 3] uint8: RGB pixels, C-contiguous.

    Raises:
        ValueError: ``reduce`` is not one of :data:`REDUCE_FACTORS`.
        BadImageError: the file is missing, unreadable, truncated or corrupt; the message names it.
    """
    return decode_image_with_size(path, reduce=reduce)[0]

