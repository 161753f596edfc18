"""Image decoding: every pixel format to RGB uint8, reduced decoding, and bad files named."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from seg_datamodule.io.images.decode import BadImageError, decode_image, decode_image_bytes, decode_image_with_size, reduced_size


def _save(image: Image.Image, path: Path, fmt: str, **kwargs: object) -> Path:
    image.save(path, fmt, **kwargs)
    return path


def _jpeg_bytes(array: np.ndarray, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, "JPEG", **kwargs)
    return buf.getvalue()


@pytest.fixture
def rgb() -> np.ndarray:
    """A smooth, odd-sized RGB image (JPEG-friendly)."""
    yy, xx = np.mgrid[0:37, 0:53]
    return np.stack([xx * 4, yy * 6, 255 - xx * 2], axis=-1).clip(0, 255).astype(np.uint8)


# --- pixel formats -------------------------------------------------------------------------


def test_rgb_png_is_exact(tmp_path: Path, rgb: np.ndarray) -> None:
    out = decode_image(_save(Image.fromarray(rgb), tmp_path / "a.png", "PNG"))
    assert out.dtype == np.uint8 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, rgb)


def test_grayscale_png_and_jpeg_become_three_equal_channels(tmp_path: Path) -> None:
    gray = np.arange(12 * 20, dtype=np.uint8).reshape(12, 20)
    out = decode_image(_save(Image.fromarray(gray, "L"), tmp_path / "g.png", "PNG"))
    assert out.shape == (12, 20, 3)
    for c in range(3):
        np.testing.assert_array_equal(out[..., c], gray)
    flat = np.full((16, 24), 77, np.uint8)
    out = decode_image(_save(Image.fromarray(flat, "L"), tmp_path / "g.jpg", "JPEG", quality=100))
    assert out.shape == (16, 24, 3) and np.abs(out.astype(int) - 77).max() <= 1


def test_cmyk_jpeg_becomes_rgb(tmp_path: Path) -> None:
    rgb = np.zeros((16, 16, 3), np.uint8)
    rgb[:8] = (200, 50, 30)
    rgb[8:] = (20, 160, 240)
    path = _save(Image.fromarray(rgb).convert("CMYK"), tmp_path / "c.jpg", "JPEG", quality=100)
    with Image.open(path) as im:
        assert im.mode == "CMYK"
    out = decode_image(path)
    assert out.shape == (16, 16, 3)
    assert np.abs(out[2:6].astype(int) - (200, 50, 30)).max() <= 3
    assert np.abs(out[10:14].astype(int) - (20, 160, 240)).max() <= 3


def test_rgba_and_la_png_drop_alpha(tmp_path: Path) -> None:
    rgba = np.zeros((5, 6, 4), np.uint8)
    rgba[..., :3] = (10, 20, 30)
    rgba[:, :3, 3] = 0  # fully transparent half: the colour stays, it is not composited
    rgba[:, 3:, 3] = 128
    out = decode_image(_save(Image.fromarray(rgba, "RGBA"), tmp_path / "a.png", "PNG"))
    assert (out == np.array([10, 20, 30], np.uint8)).all()
    la = np.zeros((3, 4, 2), np.uint8)
    la[..., 0], la[..., 1] = 100, 7
    out = decode_image(_save(Image.fromarray(la, "LA"), tmp_path / "la.png", "PNG"))
    assert (out == 100).all()


def test_16_bit_png_keeps_the_high_byte(tmp_path: Path) -> None:
    gray16 = np.array([[0x0000, 0x00FF, 0x0100, 0xABCD, 0xFFFF]], np.uint16)
    path = tmp_path / "g16.png"
    assert cv2.imwrite(str(path), gray16)
    out = decode_image(path)
    assert out.shape == (1, 5, 3)
    np.testing.assert_array_equal(out[0, :, 0], gray16[0] >> 8)
    color16 = np.zeros((2, 3, 3), np.uint16)
    color16[..., 0], color16[..., 1], color16[..., 2] = 0x1234, 0x8080, 0xFFFF  # R, G, B
    path = tmp_path / "c16.png"
    assert cv2.imwrite(str(path), color16[..., ::-1])  # OpenCV writes BGR
    np.testing.assert_array_equal(decode_image(path)[0, 0], [0x12, 0x80, 0xFF])


def test_palette_png_uses_the_palette(tmp_path: Path) -> None:
    pal = Image.fromarray(np.array([[0, 1, 2], [2, 1, 0]], np.uint8), "P")
    pal.putpalette([255, 0, 0, 0, 0, 255, 9, 200, 90] + [0] * (768 - 9))
    expected = np.array([[[255, 0, 0], [0, 0, 255], [9, 200, 90]], [[9, 200, 90], [0, 0, 255], [255, 0, 0]]])
    np.testing.assert_array_equal(decode_image(_save(pal, tmp_path / "p.png", "PNG")), expected)
    with_transparency = _save(pal, tmp_path / "pt.png", "PNG", transparency=0)
    np.testing.assert_array_equal(decode_image(with_transparency), expected)
    one_bit = Image.fromarray(np.array([[True, False, True]])).convert("1")
    out = decode_image(_save(one_bit, tmp_path / "b.png", "PNG"))
    np.testing.assert_array_equal(out[0, :, 0], [255, 0, 255])


def test_exif_orientation_is_ignored(tmp_path: Path, rgb: np.ndarray) -> None:
    # COCO's width/height and polygons refer to the stored pixels, not the displayed ones.
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    path = _save(Image.fromarray(rgb), tmp_path / "o.jpg", "JPEG", quality=95, exif=exif.tobytes())
    out, stored = decode_image_with_size(path)
    assert out.shape == (37, 53, 3) and stored == (37, 53)
    assert np.abs(out.astype(int) - rgb).mean() < 3


def test_real_jpeg_matches_pil(coco_mini: Path) -> None:
    path = sorted((coco_mini / "train2017").glob("*.jpg"))[0]
    with Image.open(path) as im:
        np.testing.assert_array_equal(decode_image(path), np.asarray(im.convert("RGB")))


# --- reduced decoding ----------------------------------------------------------------------


@pytest.mark.parametrize("reduce", [1, 2, 4, 8])
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_reduce_gives_ceil_size_and_the_stored_size(
    tmp_path: Path, rgb: np.ndarray, reduce: int, fmt: str
) -> None:
    path = _save(Image.fromarray(rgb), tmp_path / f"a.{fmt.lower()}", fmt)
    out, stored = decode_image_with_size(path, reduce=reduce)
    assert stored == (37, 53)
    assert out.shape == (-(-37 // reduce), -(-53 // reduce), 3) == (*reduced_size((37, 53), reduce), 3)
    # Same picture, smaller: compare with an area-downscaled full decode (JPEG: DCT scaling).
    full = decode_image(path)
    ref = cv2.resize(full, (out.shape[1], out.shape[0]), interpolation=cv2.INTER_AREA)
    assert np.abs(ref[:-1, :-1].astype(int) - out[:-1, :-1]).mean() < 6


def test_reduced_jpeg_decodes_at_scale(coco_mini: Path) -> None:
    path = sorted((coco_mini / "train2017").glob("*.jpg"))[1]
    for reduce in (2, 4, 8):
        with Image.open(path) as im:
            im.draft("RGB", (im.width // reduce, im.height // reduce))  # PIL's libjpeg DCT scaling
            np.testing.assert_array_equal(decode_image(path, reduce=reduce), np.asarray(im.convert("RGB")))


@pytest.mark.parametrize("reduce", [0, 3, 16, True, 2.0])
def test_bad_reduce_is_rejected(tmp_path: Path, rgb: np.ndarray, reduce: object) -> None:
    path = _save(Image.fromarray(rgb), tmp_path / "a.png", "PNG")
    with pytest.raises(ValueError, match="reduce must be one of"):
        decode_image(path, reduce=reduce)  # type: ignore[arg-type]


# --- bad files -----------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.jpg"
    with pytest.raises(BadImageError, match="nope.jpg.*does not exist") as info:
        decode_image(path)
    assert info.value.reason == "image_missing" and info.value.path == str(path)


def test_directory_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(BadImageError, match="cannot be read") as info:
        decode_image(tmp_path)
    assert info.value.reason == "image_unreadable"


@pytest.mark.parametrize("progressive", [False, True])
@pytest.mark.parametrize("keep", [0.5, 0.9, -2])
def test_truncated_jpeg(tmp_path: Path, rgb: np.ndarray, progressive: bool, keep: float) -> None:
    data = _jpeg_bytes(rgb, quality=95, progressive=progressive)
    cut = int(len(data) * keep) if keep > 0 else len(data) + int(keep)
    path = tmp_path / "t.jpg"
    path.write_bytes(data[:cut])
    for reduce in (1, 4):
        with pytest.raises(BadImageError, match="t.jpg.*truncated") as info:
            decode_image(path, reduce=reduce)
        assert info.value.reason == "image_truncated"


def test_truncation_is_found_past_an_embedded_thumbnail(rgb: np.ndarray) -> None:
    # An APP1 segment holding a complete JPEG (its own FF D9) must not count as the end.
    data = _jpeg_bytes(rgb)
    thumb = _jpeg_bytes(rgb[:8, :8])
    payload = b"Exif\x00\x00" + thumb
    app1 = b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload
    with_thumb = data[:2] + app1 + data[2:]
    assert decode_image_bytes(with_thumb)[1] == (37, 53)
    with pytest.raises(BadImageError, match="truncated"):
        decode_image_bytes(with_thumb[: len(with_thumb) - 300], name="x.jpg")


def test_trailing_bytes_after_the_end_marker_are_fine(rgb: np.ndarray) -> None:
    out, stored = decode_image_bytes(_jpeg_bytes(rgb) + b"\x00" * 16 + b"trailer")
    assert out.shape == (37, 53, 3) and stored == (37, 53)


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "image_truncated"),
        (b"this is not an image at all" * 10, "image_corrupt"),
        (np.random.default_rng(0).bytes(4000), "image_corrupt"),
    ],
)
def test_corrupt_files(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "bad.jpg"
    path.write_bytes(content)
    with pytest.raises(BadImageError, match="bad.jpg") as info:
        decode_image(path)
    assert info.value.reason == reason


def test_truncated_png(tmp_path: Path, rgb: np.ndarray) -> None:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG")
    path = tmp_path / "t.png"
    path.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(BadImageError, match="t.png"):
        decode_image(path)


def test_bad_image_error_pickles_and_rebuilds_from_its_message() -> None:
    err = BadImageError("image file /x/y.jpg is truncated", path="/x/y.jpg", reason="image_truncated",
                        image_id=7, image_index=3)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is BadImageError and str(back) == str(err) and isinstance(back, ValueError)
    assert (back.path, back.reason, back.image_id, back.image_index) == ("/x/y.jpg", "image_truncated", 7, 3)
    # What torch's ExceptionWrapper.reraise does in the main process.
    again = BadImageError("Caught BadImageError in DataLoader worker process 0.\nOriginal ... /x/y.jpg ...")
    assert "/x/y.jpg" in str(again) and again.reason is None


# --- reading with limits, header size first (issue 11) -------------------------------------


def test_header_size_of_jpeg_and_png(rgb: np.ndarray) -> None:
    from seg_datamodule.io.images.decode import header_size

    assert header_size(_jpeg_bytes(rgb)) == (37, 53)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG")
    assert header_size(buf.getvalue()) == (37, 53)
    assert header_size(b"GIF89a....") is None and header_size(b"") is None


def test_read_image_file_refuses_what_is_not_a_bounded_regular_file(tmp_path: Path) -> None:
    from seg_datamodule.io.images.decode import read_image_file

    path = tmp_path / "a.jpg"
    path.write_bytes(b"x" * 100)
    assert read_image_file(path) == b"x" * 100
    with pytest.raises(BadImageError, match="100 bytes, over the limit of 99") as info:
        read_image_file(path, max_bytes=99)
    assert info.value.reason == "image_unreadable"
    with pytest.raises(BadImageError, match="not a regular file"):
        read_image_file(tmp_path)
    with pytest.raises(BadImageError, match="does not exist") as info:
        read_image_file(tmp_path / "nope.jpg")
    assert info.value.reason == "image_missing"
    with pytest.raises(BadImageError, match="cannot be read") as info:
        read_image_file(str(tmp_path / "a\x00.jpg"))
    assert info.value.reason == "image_unreadable"


def test_expected_size_is_checked_before_decoding(rgb: np.ndarray) -> None:
    with pytest.raises(BadImageError, match=r"is 37x53 \(HxW\) but the annotation file says 37x52") as info:
        decode_image_bytes(_jpeg_bytes(rgb), expected_size=(37, 52))
    assert info.value.reason == "image_size_mismatch"
    assert decode_image_bytes(_jpeg_bytes(rgb), expected_size=(37, 53))[1] == (37, 53)
