"""EXIF orientation: read from JPEG, PNG and WebP headers, applied as PIL and OpenCV 5 apply it, reduced exactly."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from seg_datamodule.io.images.decode import reduced_size
from seg_datamodule.io.images.exif import apply_orientation, block_mean, decode_oriented, exif_orientation, oriented_size

#: The orientation that undoes each one (5 and 7 are their own inverses, 6 and 8 each other's).
INVERSE = {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 8, 7: 7, 8: 6}


def _encode(pixels: np.ndarray, fmt: str, orientation: int | None) -> bytes:
    image = Image.fromarray(pixels)
    options = {"JPEG": {"quality": 95}, "WEBP": {"lossless": True}, "PNG": {}}[fmt]
    if orientation is not None:
        exif = image.getexif()
        exif[0x0112] = orientation
        options["exif"] = exif.tobytes()
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_decoded_as_pil_and_opencv_show_it(fmt: str, orientation: int) -> None:
    pixels = np.random.default_rng(orientation).integers(0, 255, (30, 50, 3), dtype=np.uint8)
    data = _encode(pixels, fmt, orientation)
    assert exif_orientation(data) == orientation
    mine, size = decode_oriented(data, orientation)
    reference = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data)).convert("RGB")))
    np.testing.assert_array_equal(mine, reference)
    assert size == mine.shape[:2] == oriented_size((30, 50), orientation)
    if int(cv2.__version__.split(".")[0]) >= 5:  # OpenCV 5 applies the tag itself for these three formats
        bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        np.testing.assert_array_equal(mine, cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_no_tag_or_garbage_is_as_stored(fmt: str) -> None:
    pixels = np.zeros((8, 9, 3), np.uint8)
    assert exif_orientation(_encode(pixels, fmt, None)) == 1
    assert exif_orientation(_encode(pixels, fmt, 9)) == 1  # not an orientation
    assert exif_orientation(b"") == exif_orientation(b"GIF89a....") == 1
    jpeg = _encode(pixels, "JPEG", 6)
    start = jpeg.index(b"Exif\x00\x00")
    assert exif_orientation(jpeg[:start + 12]) == 1  # the EXIF block cut short
    broken = jpeg[:start + 6] + b"XX" + jpeg[start + 8:]  # not a TIFF byte order
    assert exif_orientation(broken) == 1


@settings(max_examples=60)
@given(st.integers(1, 8), st.integers(1, 9), st.integers(1, 9), st.integers(1, 3))
def test_orientation_then_its_inverse_is_the_identity(orientation: int, h: int, w: int, c: int) -> None:
    image = np.arange(h * w * c, dtype=np.int64).reshape(h, w, c)
    turned = apply_orientation(image, orientation)
    assert turned.shape[:2] == oriented_size((h, w), orientation) and turned.flags.c_contiguous
    np.testing.assert_array_equal(apply_orientation(turned, INVERSE[orientation]), image)


def test_block_mean_by_hand() -> None:
    image = np.arange(5 * 3, dtype=np.uint8).reshape(5, 3, 1)  # rows of 0 1 2 / 3 4 5 / ...
    out = block_mean(image, 2)
    assert out.shape == (3, 2, 1)
    # Full blocks average 4 pixels, the last column 2, the last row 2, the corner 1 (rounded half up).
    expected = [[(0 + 1 + 3 + 4) / 4, (2 + 5) / 2], [(6 + 7 + 9 + 10) / 4, (8 + 11) / 2], [(12 + 13) / 2, 14]]
    np.testing.assert_array_equal(out[..., 0], np.floor(np.asarray(expected) + 0.5))
    assert block_mean(image, 1) is image


@pytest.mark.parametrize("orientation", range(2, 9))
@pytest.mark.parametrize("reduce", [2, 4])
def test_a_reduced_turned_decode_keeps_the_pixel_grid(orientation: int, reduce: int) -> None:
    """Pixel k of a reduced decode of a turned image covers turned pixels [k r, (k+1) r): a bright
    square lands in its cell, alone (1, as stored, is the plain decode's business)."""
    h, w = 37, 29  # sides no reduction divides: a turned libjpeg grid would be shifted
    pixels = np.zeros((h, w, 3), np.uint8)
    turned_size = oriented_size((h, w), orientation)
    # Where the square must show once turned: a block of cells of the reduced grid.
    cell = (2, 3)
    top, left = cell[0] * reduce, cell[1] * reduce
    shown = np.zeros((*turned_size, 3), np.uint8)
    shown[top:top + reduce, left:left + reduce] = 255
    pixels[...] = apply_orientation(shown, INVERSE[orientation])  # stored so that it shows as `shown`
    data = _encode(pixels, "PNG", orientation)
    image, size = decode_oriented(data, orientation, reduce=reduce, expected_size=turned_size)
    assert size == turned_size and image.shape[:2] == reduced_size(turned_size, reduce)
    assert image[cell][0] == 255 and int(image.sum()) == 255 * 3


def test_a_header_of_another_size_is_refused() -> None:
    from seg_datamodule.io.images.decode import BadImageError

    data = _encode(np.zeros((10, 20, 3), np.uint8), "JPEG", 6)  # shows as 20 x 10
    decode_oriented(data, 6, expected_size=(20, 10))
    with pytest.raises(BadImageError, match=r"is 10x20 \(HxW\) but the annotation file says 20x10"):
        decode_oriented(data, 6, expected_size=(10, 20))
    with pytest.raises(ValueError, match="reduce must be one of"):
        decode_oriented(data, 6, reduce=3)
    with pytest.raises(ValueError, match="orientation must be"):
        apply_orientation(np.zeros((2, 2, 3)), 9)
