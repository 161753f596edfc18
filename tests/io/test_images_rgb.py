"""Decoding straight to RGB (``IMREAD_COLOR_RGB``) gives the bytes of BGR decoding + ``cvtColor``.

Both paths of :mod:`seg_datamodule.io.images.decode` run on the same files: the flag where the installed
OpenCV has it, and the fallback (BGR, then a whole-image conversion) that an OpenCV without it
takes; the outputs must be equal byte for byte, at every reduce factor, also through the EXIF
path (:func:`~seg_datamodule.io.images.exif.decode_oriented`).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Callable

import cv2
import numpy as np
import pytest
from PIL import Image

import seg_datamodule.io.images.decode as images
from seg_datamodule.io.images.decode import REDUCE_FACTORS, decode_image_bytes
from seg_datamodule.io.images.exif import decode_oriented

pytestmark = pytest.mark.skipif(
    getattr(cv2, "IMREAD_COLOR_RGB", None) is None, reason="this OpenCV has no IMREAD_COLOR_RGB: one path only"
)


def _encode(image: Image.Image, fmt: str, **kwargs: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def _synthetic() -> dict[str, bytes]:
    """One file per pixel format the decoder turns into RGB (odd sizes: partial DCT blocks)."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:37, 0:53]
    smooth = np.stack([xx * 4, yy * 6, 255 - xx * 2], axis=-1).clip(0, 255).astype(np.uint8)
    noise = rng.integers(0, 256, (41, 67, 3), dtype=np.uint8)
    rgb = Image.fromarray(smooth)
    exif = Image.Exif()
    exif[0x0112] = 6
    return {
        "smooth.jpg": _encode(rgb, "JPEG", quality=90),
        "noise.jpg": _encode(Image.fromarray(noise), "JPEG", quality=75, subsampling=2),
        "444.jpg": _encode(Image.fromarray(noise), "JPEG", quality=95, subsampling=0),
        "progressive.jpg": _encode(rgb, "JPEG", quality=80, progressive=True),
        "gray.jpg": _encode(Image.fromarray(noise[..., 0]), "JPEG", quality=90),
        "cmyk.jpg": _encode(Image.fromarray(noise).convert("CMYK"), "JPEG", quality=90),
        "exif6.jpg": _encode(rgb, "JPEG", quality=95, exif=exif.tobytes()),
        "rgb.png": _encode(Image.fromarray(noise), "PNG"),
        "rgba.png": _encode(Image.fromarray(np.dstack([noise, noise[..., :1]])), "PNG"),
        "la.png": _encode(Image.fromarray(noise[..., 0]).convert("LA"), "PNG"),
        "palette.png": _encode(Image.fromarray(noise).convert("P"), "PNG"),
        "16bit.png": cv2.imencode(".png", noise.astype(np.uint16) * 257 + 3)[1].tobytes(),
        "exif6.png": _encode(rgb, "PNG", exif=exif.tobytes()),
        "rgb.bmp": _encode(Image.fromarray(noise), "BMP"),
        "rgb.webp": _encode(Image.fromarray(noise), "WEBP", lossless=True),
    }


def _both_ways(
    monkeypatch: pytest.MonkeyPatch, decode: Callable[[], tuple[np.ndarray, tuple[int, int]]]
) -> tuple[tuple[np.ndarray, tuple[int, int]], tuple[np.ndarray, tuple[int, int]]]:
    """``decode()`` with the flag, then with the fallback of an OpenCV without it."""
    direct = decode()
    with monkeypatch.context() as patch:
        patch.setattr(images, "_IMREAD_COLOR_RGB", None)
        fallback = decode()
    return direct, fallback


def _assert_same_bytes(direct: tuple[np.ndarray, tuple[int, int]], fallback: tuple[np.ndarray, tuple[int, int]],
                       what: str) -> None:
    (a, size_a), (b, size_b) = direct, fallback
    assert size_a == size_b, what
    assert a.shape == b.shape and a.dtype == b.dtype == np.uint8, what
    assert a.flags.c_contiguous and b.flags.c_contiguous, what
    assert a.tobytes() == b.tobytes(), f"{what}: {(a != b).sum()} values differ"


def test_the_flag_is_used_where_opencv_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # The direct path must really decode to RGB (no cvtColor afterwards), or the test below
    # compares the fallback with itself.
    calls: list[int] = []
    original = cv2.imdecode

    def spy(buf: np.ndarray, flags: int) -> np.ndarray | None:
        calls.append(flags)
        return original(buf, flags)

    monkeypatch.setattr(images.cv2, "imdecode", spy)
    monkeypatch.setattr(images.cv2, "cvtColor", None)  # any call would fail
    out, _ = decode_image_bytes(_synthetic()["smooth.jpg"], reduce=2)
    assert out.shape == (19, 27, 3)
    # IMREAD_REDUCED_GRAYSCALE_2 is the scale-1/2 bit alone (IMREAD_REDUCED_COLOR_2 less IMREAD_COLOR).
    assert calls == [cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION | cv2.IMREAD_REDUCED_GRAYSCALE_2]


@pytest.mark.parametrize("reduce", REDUCE_FACTORS)
def test_real_coco_jpegs_decode_to_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch, coco_mini: Path, reduce: int
) -> None:
    files = sorted(coco_mini.glob("*2017/*.jpg"))
    assert files
    for path in files:
        data = path.read_bytes()
        pair = _both_ways(monkeypatch, lambda: decode_image_bytes(data, reduce=reduce, name=str(path)))
        _assert_same_bytes(*pair, f"{path.name} at reduce={reduce}")


@pytest.mark.parametrize("reduce", REDUCE_FACTORS)
@pytest.mark.parametrize("name", sorted(_synthetic()))
def test_every_pixel_format_decodes_to_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch, name: str, reduce: int
) -> None:
    data = _synthetic()[name]
    pair = _both_ways(monkeypatch, lambda: decode_image_bytes(data, reduce=reduce, name=name))
    _assert_same_bytes(*pair, f"{name} at reduce={reduce}")


@pytest.mark.parametrize("reduce", REDUCE_FACTORS)
@pytest.mark.parametrize("orientation", range(1, 9))
def test_the_exif_path_decodes_to_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch, orientation: int, reduce: int
) -> None:
    # The YOLO source decodes with the orientation applied (decode_oriented); same rule there.
    for name in ("exif6.jpg", "exif6.png", "gray.jpg"):
        data = _synthetic()[name]
        pair = _both_ways(monkeypatch, lambda: decode_oriented(data, orientation, reduce=reduce, name=name))
        _assert_same_bytes(*pair, f"{name} turned by {orientation} at reduce={reduce}")
