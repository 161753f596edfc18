"""device_pixels and device_decode: the batch decoded and warped by torch ops, against the worker path.

The reference is the worker path itself: ``decode_image_bytes`` / ``decode_oriented`` (OpenCV) and
``warp_tiles`` (``cv2.resize`` and ``cv2.warpAffine``). Tile ownership is compared with constant
images (tile ``k`` all ``k + 1``, fill 0), which both paths resample to themselves exactly.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

from seg_datamodule.io.images.decode import decode_image_bytes
from seg_datamodule.io.images.device_decode import decode_jpegs
from seg_datamodule.io.images.exif import decode_oriented, exif_orientation
from seg_datamodule.ops.affine import make_affine
from seg_datamodule.transforms.kernels import device_warp
from seg_datamodule.transforms.kernels.device_warp import (
    flip_canvases,
    warp_tiles_device,
)
from seg_datamodule.transforms.kernels.plan import (
    TilePlan,
    draw_batch_partners,
    letterbox_layout,
    mosaic_layout,
    snap_for_resize,
)
from seg_datamodule.transforms.kernels.warp import FILL_VALUE, warp_tiles
from seg_datamodule.transforms.layouts.mosaic import Letterbox, MosaicAffine

FIXTURES = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "coco-cc-by").rglob("*.jpg"))


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    """A synthetic RGB photo: smooth gradients under sharp-edged shapes."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    image = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) % 256], -1).astype(np.uint8)
    for _ in range(6):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        cv2.rectangle(image, (x0, y0), (x0 + w // 5, y0 + h // 7), color, -1)
        cv2.circle(image, (w - x0, h - y0), max(h // 9, 2), color[::-1], -1)
    return image


def _jpeg(image: np.ndarray, *params: int) -> bytes:
    bgr = image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    return cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, 90, *params])[1].tobytes()


def _pil_jpeg(image: Image.Image, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90, **kwargs)
    return buf.getvalue()


@contextlib.contextmanager
def _codec_deprecation():
    """torchvision's own decode, its codec deprecation (0.29 and later, not 0.19) neither required nor shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*decoding and encoding capabilities of TorchVision", DeprecationWarning)
        yield


def _tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _hwc(image: torch.Tensor) -> np.ndarray:
    return image.permute(1, 2, 0).numpy()


@pytest.fixture(scope="module")
def photos() -> list[np.ndarray]:
    """The CC BY fixture images decoded by the worker path (RGB, 406 to 640 pixels a side)."""
    return [decode_image_bytes(path.read_bytes())[0] for path in FIXTURES]


# ----------------------------------------------------------------------------- decode


def test_decode_equals_the_worker_decode_bit_for_bit() -> None:
    rgb = _photo(97, 131, 0)
    files = [p.read_bytes() for p in FIXTURES] + [
        _jpeg(rgb),  # 4:2:0
        _jpeg(rgb, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444),
        _jpeg(rgb, cv2.IMWRITE_JPEG_PROGRESSIVE, 1),
        _jpeg(rgb[..., 1]),  # grey: one component
        _pil_jpeg(Image.fromarray(rgb).convert("CMYK")),  # Adobe CMYK
        _pil_jpeg(Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 56, 4), np.uint8), "CMYK")),
    ]
    decoded = decode_jpegs([_tensor(f) for f in files], "cpu", [False] * len(files))
    assert len(decoded) == len(files)
    for data, image in zip(files, decoded):
        assert image.dtype == torch.uint8 and image.device.type == "cpu" and image.shape[0] == 3
        np.testing.assert_array_equal(_hwc(image), decode_image_bytes(data)[0])


def test_torchvision_alone_converts_cmyk_one_grey_level_off() -> None:
    """Why CMYK is decoded to its four channels and converted here (OpenCV's formula)."""
    data = _pil_jpeg(Image.fromarray(_photo(64, 80, 2)).convert("CMYK"))
    with _codec_deprecation():
        own = decode_jpeg(_tensor(data), mode=ImageReadMode.RGB)
    diff = np.abs(_hwc(own).astype(int) - decode_image_bytes(data)[0])
    assert diff.max() == 1 and diff.mean() > 0.5


def test_decode_applies_exif_orientation_only_where_asked() -> None:
    rgb = _photo(24, 40, 3)  # not square: 5-8 swap the sides
    files = []
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = orientation
        files.append(_pil_jpeg(Image.fromarray(rgb), exif=exif.tobytes()))
    oriented = [k % 2 == 0 for k in range(8)] + [k % 2 == 1 for k in range(8)]
    decoded = decode_jpegs([_tensor(f) for f in files + files], "cpu", oriented)
    for k, (data, image) in enumerate(zip(files + files, decoded)):
        assert exif_orientation(data) == k % 8 + 1
        expected = decode_oriented(data, exif_orientation(data))[0] if oriented[k] else decode_image_bytes(data)[0]
        np.testing.assert_array_equal(_hwc(image), expected)
        if oriented[k]:  # and as torchvision turns it on the CPU
            with _codec_deprecation():
                own = decode_jpeg(_tensor(data), mode=ImageReadMode.RGB, apply_exif_orientation=True)
            np.testing.assert_array_equal(image.numpy(), own.numpy())


def test_decode_arguments() -> None:
    assert decode_jpegs([], "cpu", []) == []
    data = _tensor(_jpeg(_photo(8, 8, 0)))
    with pytest.raises(ValueError, match="oriented has 0 entries"):
        decode_jpegs([data], "cpu", [])
    with pytest.raises(TypeError, match=r"encoded\[0\] must be a 1-D uint8 CPU tensor"):
        decode_jpegs([data.to(torch.int32)], "cpu", [False])
    with pytest.raises(RuntimeError):
        decode_jpegs([data[:40]], "cpu", [False])


# ----------------------------------------------------------------------------- warp


def _reference(images: list[np.ndarray], plans: list[TilePlan], tile_images: list[list[int]], fill: int = FILL_VALUE
               ) -> np.ndarray:
    """The worker path: warp_tiles per sample, full-size images."""
    return np.stack([
        warp_tiles([images[i] if w is not None else None for i, w in zip(row, plan.windows)], plan,
                   out=np.full((*plan.output_size, 3), fill, np.uint8))
        for plan, row in zip(plans, tile_images)
    ])


def _device(images: list[np.ndarray], plans: list[TilePlan], tile_images: list[list[int]], fill: int = FILL_VALUE
            ) -> np.ndarray:
    tensors = [torch.from_numpy(np.ascontiguousarray(im)).permute(2, 0, 1) for im in images]
    return warp_tiles_device(tensors, plans, tile_images, fill=fill).permute(0, 2, 3, 1).numpy()


def _compare(images: list[np.ndarray], plans: list[TilePlan], tile_images: list[list[int]]) -> dict[str, float]:
    """Ownership and pixel differences between the device and the worker path."""
    constant = [np.full_like(im, k + 1) for k, im in enumerate(images)]
    owner_ref = _reference(constant, plans, tile_images, fill=0)[..., 0]
    owner_dev = _device(constant, plans, tile_images, fill=0)[..., 0]
    ref, dev = _reference(images, plans, tile_images), _device(images, plans, tile_images)
    agree = owner_ref == owner_dev
    diff = np.abs(ref.astype(int) - dev.astype(int))[agree]
    uncovered = agree & (owner_ref == 0)
    return {
        "owner_differs": float((~agree).mean()),
        "max": int(diff.max(initial=0)),
        "values_differ": float((diff > 0).mean()) if diff.size else 0.0,
        "fill_ok": bool((dev[uncovered] == FILL_VALUE).all() and (ref[uncovered] == FILL_VALUE).all()),
    }


def _mosaics(photos: list[np.ndarray], step: MosaicAffine, batch: int, seed: int, snap: bool = True
             ) -> tuple[list[TilePlan], list[list[int]]]:
    rng = np.random.default_rng(seed)
    sizes = np.array([im.shape[:2] for im in photos])
    plans, tile_images = [], []
    for _ in range(batch):
        chosen = [int(i) for i in rng.choice(len(photos), 4, replace=False)]
        plans.append(step.plan(step.draw(rng, True), sizes[chosen], snap=snap))
        tile_images.append(chosen)
    return plans, tile_images


def test_resize_tiles_equal_warp_tiles_bit_for_bit(photos: list[np.ndarray]) -> None:
    """The default recipe: axis-aligned mosaics snapped for cv2.resize, tiles cut at the canvas."""
    plans, tile_images = _mosaics(photos, MosaicAffine(image_size=256), batch=6, seed=0)
    assert sum(int((p.resize[:, 0] >= 0).sum()) for p in plans) >= 20  # the resize path is exercised
    stats = _compare(photos, plans, tile_images)
    assert stats == {"owner_differs": 0.0, "max": 0, "values_differ": 0.0, "fill_ok": True}
    # Letterboxes, snapped for resize as MosaicAffine.plan snaps them.
    boxes = [Letterbox(200).plan(photos[i].shape[:2])[0] for i in (0, 6, 7)]
    matrix, region, _, _ = letterbox_layout(photos[2].shape[:2], (160, 224))
    boxes.append(TilePlan(matrix[None], region[None], (160, 224)))
    boxes = [snap_for_resize(plan, np.array([photos[i].shape[:2]]), np.full((1, 2), -1))
             for plan, i in zip(boxes, (0, 6, 7, 2))]
    for plan, i in zip(boxes, (0, 6, 7, 2)):
        assert plan.resize[0, 0] >= 0
        assert _compare(photos, [plan], [[i]]) == {"owner_differs": 0.0, "max": 0, "values_differ": 0.0, "fill_ok": True}


def test_warp_affine_axis_aligned_tiles(photos: list[np.ndarray]) -> None:
    """Unsnapped plans: warp_tiles calls cv2.warpAffine, whose scale-and-shift path is integer."""
    plans, tile_images = _mosaics(photos, MosaicAffine(image_size=256), batch=4, seed=1, snap=False)
    stats = _compare(photos, plans, tile_images)
    assert stats == {"owner_differs": 0.0, "max": 0, "values_differ": 0.0, "fill_ok": True}
    # A letterbox samples the replicated edge, where OpenCV rounds its own way: a grey level at most.
    stats = _compare(photos, [Letterbox(200).plan(photos[0].shape[:2])[0]], [[0]])
    assert stats["owner_differs"] == 0.0 and stats["fill_ok"]
    assert stats["max"] <= 1 and stats["values_differ"] < 0.01


def _opencv4_warp_affine(image: np.ndarray, matrix: np.ndarray, dsize: tuple[int, int], dst: object = None,
                         flags: int = 0, borderMode: int = 0) -> np.ndarray:
    """OpenCV 4's ``warpAffine`` (bilinear, ``WARP_INVERSE_MAP``, ``BORDER_REPLICATE``) as its source
    writes it: positions rounded to 1/1024 per row and column, summed, cut to 1/32; 2**15 weights."""
    assert flags == cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP and borderMode == cv2.BORDER_REPLICATE
    (w_out, h_out), (h, w) = dsize, image.shape[:2]
    xs, ys = np.arange(w_out), np.arange(h_out)
    adelta, bdelta = np.rint(matrix[0, 0] * xs * 1024), np.rint(matrix[1, 0] * xs * 1024)
    x_row, y_row = np.rint((matrix[0, 1] * ys + matrix[0, 2]) * 1024) + 16, np.rint((matrix[1, 1] * ys + matrix[1, 2]) * 1024) + 16
    sx = (x_row[:, None] + adelta[None]).astype(np.int64) >> 5
    sy = (y_row[:, None] + bdelta[None]).astype(np.int64) >> 5
    a, b = (sx & 31)[..., None], (sy & 31)[..., None]
    x0, x1 = np.clip(sx >> 5, 0, w - 1), np.clip((sx >> 5) + 1, 0, w - 1)
    y0, y1 = np.clip(sy >> 5, 0, h - 1), np.clip((sy >> 5) + 1, 0, h - 1)
    p = image.astype(np.int64).reshape(h, w, -1)
    weights = 32 * ((32 - a) * (32 - b) * p[y0, x0] + a * (32 - b) * p[y0, x1] + (32 - a) * b * p[y1, x0] + a * b * p[y1, x1])
    return ((weights + (1 << 14)) >> 15).astype(np.uint8).reshape(h_out, w_out, *image.shape[2:])


@pytest.mark.skipif(int(cv2.__version__.split(".")[0]) >= 5, reason="checks the reference against OpenCV 4 itself")
def test_opencv4_reference_is_opencv4() -> None:
    """The reference below, against the OpenCV 4 the lowest-release CI installs: equal bit for bit."""
    rng = np.random.default_rng(0)
    for t in range(200):
        h, w = (int(v) for v in rng.integers(2, 60, 2))
        image = rng.integers(0, 256, (h, w, 3), np.uint8)
        matrix = rng.uniform(-2, 2, (2, 3))
        if t % 2:
            matrix[0, 1] = matrix[1, 0] = 0.0
        matrix[:, 2] = rng.uniform(-10, 40, 2)
        size = (int(rng.integers(1, 50)), int(rng.integers(1, 50)))
        flags, border = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP, cv2.BORDER_REPLICATE
        np.testing.assert_array_equal(_opencv4_warp_affine(image, matrix, size, flags=flags, borderMode=border),
                                      cv2.warpAffine(image, matrix, size, flags=flags, borderMode=border))


def test_opencv4_branch_equals_its_worker_path(photos: list[np.ndarray], monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's OpenCV 4 arithmetic, forced, against warp_tiles with OpenCV 4's warpAffine: rotated,
    sheared and unsnapped axis-aligned mosaics and a letterbox, bit for bit wherever both give a pixel
    the same tile (resized tiles keep cv2.resize, the same in 4 and 5)."""
    monkeypatch.setattr(device_warp, "opencv4", lambda: True)
    monkeypatch.setattr(cv2, "warpAffine", _opencv4_warp_affine)
    rotated = _mosaics(photos, MosaicAffine(image_size=256, degrees=30, shear=10, scale=(0.4, 1.6)), batch=4, seed=2)
    axis = _mosaics(photos, MosaicAffine(image_size=256), batch=4, seed=1, snap=False)
    letterbox = ([Letterbox(200).plan(photos[0].shape[:2])[0]], [[0]])
    for (plans, tile_images), owners in ((rotated, 1e-3), (axis, 0.0), (letterbox, 0.0)):
        stats = _compare(photos, plans, tile_images)
        assert stats["owner_differs"] <= owners and stats["fill_ok"]
        assert stats["max"] == 0, stats


def test_rotated_and_sheared_tiles(photos: list[np.ndarray]) -> None:
    """Rasterised parallelograms (warp_tiles) against inverse-mapped centres (here)."""
    step = MosaicAffine(image_size=256, degrees=30, shear=10, scale=(0.4, 1.6))
    plans, tile_images = _mosaics(photos, step, batch=6, seed=2)
    stats = _compare(photos, plans, tile_images)
    assert stats["owner_differs"] < 1e-3 and stats["fill_ok"]
    assert stats["max"] <= 1 and stats["values_differ"] < 1e-3


@settings(max_examples=25)
@given(st.data())
def test_random_affine_plans_match(data: st.DataObject) -> None:
    """Random tiles (any rotation, shear, scale, partly off the canvas or off the image) on noise."""
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    out_size = (int(rng.integers(8, 40)), int(rng.integers(8, 40)))
    images, matrices, regions = [], [], []
    for _ in range(int(rng.integers(1, 4))):
        h, w = (int(v) for v in rng.integers(2, 30, 2))
        images.append(rng.integers(0, 256, (h, w, 3), np.uint8))
        axis = data.draw(st.booleans())
        matrices.append(make_affine(
            (w / 2, h / 2), tuple(rng.uniform(0, 40, 2)), angle=0.0 if axis else rng.uniform(-180, 180),
            scale=rng.uniform(0.3, 3.0), shear=(0.0, 0.0) if axis else tuple(rng.uniform(-20, 20, 2))))
        x0, y0 = rng.uniform(0, w / 2), rng.uniform(0, h / 2)
        regions.append([x0, y0, rng.uniform(x0, w), rng.uniform(y0, h)])
    plan = TilePlan(np.stack(matrices), np.array(regions), out_size)
    stats = _compare(images, [plan], [list(range(len(images)))])
    assert stats["owner_differs"] <= 0.01 and stats["fill_ok"]
    assert stats["max"] <= 2


def test_batch_partners_ragged_plans_and_invisible_tiles(photos: list[np.ndarray]) -> None:
    """Images shared between samples, a letterbox beside mosaics, a tile off the canvas."""
    partners = draw_batch_partners(np.random.default_rng(3), 6)
    sizes = np.array([im.shape[:2] for im in photos[:6]])
    tile_images = [[b, *map(int, partners[b])] for b in range(6)]
    plans = [TilePlan(*mosaic_layout(sizes[row], (150.0, 170.0), 192), (192, 192)) for row in tile_images]
    plans[2] = Letterbox(192).plan(photos[2].shape[:2])[0]
    tile_images[2] = [2]
    # Tile 3 of sample 4 moved off the canvas: no window, and no image needed.
    moved = plans[4].matrices.copy()
    moved[3, :, 2] += 1000.0
    plans[4] = TilePlan(moved, plans[4].regions, (192, 192))
    assert plans[4].windows[3] is None
    ref = _reference(photos[:6], plans, tile_images)
    np.testing.assert_array_equal(_device(photos[:6], plans, tile_images), ref)
    tensors = [torch.from_numpy(im).permute(2, 0, 1) for im in photos[:6]] + [None]
    tile_images[4][3] = 6  # the invisible tile points at None
    np.testing.assert_array_equal(warp_tiles_device(tensors, plans, tile_images).permute(0, 2, 3, 1).numpy(), ref)
    tile_images[0][1] = 6  # a visible one may not
    with pytest.raises(ValueError, match="tile 1 of sample 0 is visible but has no image"):
        warp_tiles_device(tensors, plans, tile_images)


def test_reduced_decodes_warp_as_warp_tiles_warps_them(photos: list[np.ndarray], monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiles whose images were decoded 2, 4 or 8 times smaller (never resized; sampled in the small
    image's pixels, coverage from the plan): bit for bit against warp_tiles with ``reduces``, in both
    OpenCV arithmetics (the other one forced as in test_opencv4_branch_equals_its_worker_path)."""
    from seg_datamodule.io.images.exif import block_mean

    step = MosaicAffine(image_size=160, degrees=20, scale=(0.3, 0.6))
    for opencv4 in (False, True):
        if opencv4:
            monkeypatch.setattr(device_warp, "opencv4", lambda: True)
            monkeypatch.setattr(cv2, "warpAffine", _opencv4_warp_affine)
        for snap in (True, False):
            plans, tile_images = _mosaics(photos, step, batch=4, seed=11, snap=snap)
            reduces = [[(2, 4, 8, 2)[(b + k) % 4] for k in range(len(plan))] for b, plan in enumerate(plans)]
            flat = [block_mean(photos[i], r) for row, rs in zip(tile_images, reduces) for i, r in zip(row, rs)]
            rows = np.cumsum([0] + [len(p) for p in plans])
            ref = np.stack([warp_tiles(flat[rows[b]:rows[b + 1]], plan, reduces[b]) for b, plan in enumerate(plans)])
            tensors = [torch.from_numpy(im).permute(2, 0, 1) for im in flat]
            dev = warp_tiles_device(tensors, plans, None, reduces=reduces).permute(0, 2, 3, 1).numpy()
            diff = np.abs(ref.astype(int) - dev.astype(int))
            # Rotated tiles: seam pixels owned differently, as at full size (test_rotated_and_sheared_tiles).
            assert (diff > 0).mean() < 2e-3 and (diff > 1).mean() < 1e-3, (opencv4, snap)


@settings(max_examples=40)
@given(st.integers(1, 40), st.integers(1, 40), st.sampled_from([1, 2, 3, 4, 8]), st.integers(0, 2**32 - 1))
def test_block_mean_on_the_device_equals_numpys(h: int, w: int, reduce: int, seed: int) -> None:
    from seg_datamodule.io.images.device_decode import block_mean as device_block_mean
    from seg_datamodule.io.images.exif import block_mean

    image = np.random.default_rng(seed).integers(0, 256, (h, w, 3), np.uint8)
    np.testing.assert_array_equal(device_block_mean(torch.from_numpy(image).permute(2, 0, 1), reduce).permute(1, 2, 0),
                                  block_mean(image, reduce))


def test_reduced_decode_of_a_turned_photo_equals_decode_oriented() -> None:
    """Turned, then averaged: what the workers do for a turned photo at any reduce, bit for bit."""
    rgb = _photo(53, 70, 4)
    exif = Image.Exif()
    for orientation in (1, 3, 6, 8):
        exif[0x0112] = orientation
        data = _pil_jpeg(Image.fromarray(rgb), exif=exif.tobytes())
        decoded = decode_jpegs([_tensor(data)] * 3, "cpu", [True] * 3, [2, 4, 8])
        for image, reduce in zip(decoded, (2, 4, 8)):
            if orientation != 1:
                np.testing.assert_array_equal(_hwc(image), decode_oriented(data, orientation, reduce=reduce)[0])
            else:  # libjpeg's scaled IDCT, approximated (measured on real photos in tests/data/test_device_pixels.py)
                assert _hwc(image).shape == decode_image_bytes(data, reduce=reduce)[0].shape


def test_empty_batch_and_nothing_visible() -> None:
    assert warp_tiles_device([], []).shape == (0, 3, 0, 0)
    off = TilePlan(np.array([[[1.0, 0.0, 500.0], [0.0, 1.0, 0.0]]]), np.array([[0.0, 0.0, 10.0, 10.0]]), (6, 5))
    out = warp_tiles_device([None], [off, off], [[0], [0]], fill=7)
    assert out.shape == (2, 3, 6, 5) and out.dtype == torch.uint8 and bool((out == 7).all())


def test_warp_arguments() -> None:
    image = torch.zeros((3, 4, 4), dtype=torch.uint8)
    plan = TilePlan(np.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]]), np.array([[0.0, 0.0, 4.0, 4.0]]), (4, 4))
    other = TilePlan(plan.matrices, plan.regions, (5, 4))
    assert inspect.signature(warp_tiles_device).parameters["fill"].default == FILL_VALUE
    with pytest.raises(ValueError, match="fill must be an int in 0..255"):
        warp_tiles_device([image], [plan], fill=256)
    with pytest.raises(ValueError, match="tile_images has 2 samples but plans has 1"):
        warp_tiles_device([image], [plan], [[0], [0]])
    with pytest.raises(ValueError, match=r"tile_images\[0\] has 2 entries but its plan has 1 tiles"):
        warp_tiles_device([image], [plan], [[0, 0]])
    with pytest.raises(ValueError, match="output_size"):
        warp_tiles_device([image], [plan, other], [[0], [0]])
    with pytest.raises(TypeError, match="uint8"):
        warp_tiles_device([image.float()], [plan])
    np.testing.assert_array_equal(warp_tiles_device([image + 9], [plan])[0].numpy(), np.full((3, 4, 4), 9))


def test_decode_then_warp_equals_the_worker_path(photos: list[np.ndarray]) -> None:
    """Bytes to canvases on the device: the same canvases as the workers make."""
    decoded = decode_jpegs([_tensor(p.read_bytes()) for p in FIXTURES], "cpu", [False] * len(FIXTURES))
    plans, tile_images = _mosaics(photos, MosaicAffine(image_size=224), batch=3, seed=4)
    np.testing.assert_array_equal(warp_tiles_device(decoded, plans, tile_images).permute(0, 2, 3, 1).numpy(),
                                  _reference(photos, plans, tile_images))


def test_flip_canvases() -> None:
    canvases = torch.arange(2 * 3 * 4 * 5, dtype=torch.uint8).view(2, 3, 4, 5)
    flips = torch.tensor([True, False])
    for axis, dim in ((1, -1), (0, -2)):
        out = flip_canvases(canvases, flips, axis)
        assert torch.equal(out[0], canvases[0].flip(dim)) and torch.equal(out[1], canvases[1])
    with pytest.raises(ValueError, match="axis must be 0 or 1"):
        flip_canvases(canvases, flips, 2)
    with pytest.raises(ValueError, match=r"flips must be \(2,\)"):
        flip_canvases(canvases, flips[:1])
