"""The batched HSV kernel against OpenCV's ``hsv_jitter``: every colour, real images, tables, errors."""

from __future__ import annotations

import json

from pathlib import Path

import albumentations as A
import cv2
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import seg_datamodule.transforms
from seg_datamodule.transforms.pixel.albu import load_transforms
from seg_datamodule.transforms.pixel.hsv import HSVJitter, apply_pending_hsv, hsv_jitter, hsv_jitter_batch_, hsv_luts


def _numpy_luts(gains: np.ndarray) -> np.ndarray:
    """The tables ``hsv_jitter`` builds, written out again (Ultralytics' RandomHSV), ``(3, 256)``."""
    x = np.arange(256, dtype=np.float64)
    hue = ((x + gains[0] * 180) % 180).astype(np.uint8)
    sat = np.clip(x * (gains[1] + 1), 0, 255).astype(np.uint8)
    val = np.clip(x * (gains[2] + 1), 0, 255).astype(np.uint8)
    sat[0] = 0
    return np.stack([hue, sat, val])


def _batch(images: np.ndarray) -> torch.Tensor:
    """``(B, H, W, 3)`` -> ``(B, 3, H, W)`` channels-last, as the collate makes it."""
    return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2)


def _reference(images: np.ndarray, gains: np.ndarray) -> np.ndarray:
    return np.stack([hsv_jitter(image, g) for image, g in zip(images, gains)])


def _draws(n: int, seed: int, gains: tuple[float, float, float]) -> np.ndarray:
    jitter, rng = HSVJitter(gains), np.random.default_rng(seed)
    return np.stack([jitter.draw(rng) for _ in range(n)])


@pytest.mark.slow
def test_every_colour_matches_opencv_within_one_level() -> None:
    # All 2^24 colours (saturated and pure greys included), as four images with their own gains.
    codes = np.arange(1 << 24, dtype=np.uint32)
    cube = np.stack([codes >> 16, (codes >> 8) & 255, codes & 255], -1).astype(np.uint8).reshape(4, 1024, 4096, 3)
    gains = np.concatenate([_draws(3, 0, (0.5, 0.9, 0.9)), [[0.0, 0.0, 0.0]]])
    expected = _reference(cube, gains)
    images = _batch(cube.copy())
    assert hsv_jitter_batch_(images, torch.from_numpy(gains)) is images
    diff = np.abs(images.permute(0, 2, 3, 1).numpy().astype(np.int16) - expected)
    assert diff.max() <= 1
    # Greys stay grey, whatever the gains.
    grey = (cube[..., 0] == cube[..., 1]) & (cube[..., 1] == cube[..., 2])
    out = images.permute(0, 2, 3, 1).numpy()
    assert (out[grey][:, 0] == out[grey][:, 1]).all() and (out[grey][:, 1] == out[grey][:, 2]).all()


def _real_images(coco_mini: Path, count: int, size: int) -> np.ndarray:
    files = sorted((coco_mini / "train2017").glob("*.jpg"))[:count]
    images = []
    for k, f in enumerate(files):
        image = cv2.cvtColor(cv2.imread(str(f)), cv2.COLOR_BGR2RGB)[:size, :size]
        image = np.pad(image, ((0, size - image.shape[0]), (0, size - image.shape[1]), (0, 0)))
        # Saturated primaries and secondaries, and every pure grey, in each image.
        image[:8, :256] = np.arange(256, dtype=np.uint8)[None, :, None]
        for j, colour in enumerate(np.array(np.meshgrid([0, 255], [0, 255], [0, 255])).T.reshape(-1, 3)):
            image[8 + 4 * j : 12 + 4 * j, :64] = colour
        image[40:48, :256] = np.stack([np.full(256, 255), np.arange(256), np.zeros(256)], -1)
        images.append(image)
    return np.stack(images)


def test_real_images_random_gains_match_hsv_jitter(coco_mini: Path) -> None:
    images = _real_images(coco_mini, 8, 320)
    for seed, ranges in ((1, (0.015, 0.7, 0.4)), (2, (0.5, 1.0, 1.0))):
        gains = _draws(len(images), seed, ranges)
        expected = _reference(images, gains)
        batch = _batch(images.copy())
        hsv_jitter_batch_(batch, torch.from_numpy(gains))
        out = batch.permute(0, 2, 3, 1).numpy()
        assert np.abs(out.astype(np.int16) - expected).max() <= 1
        assert not np.array_equal(out, images)
        assert (out[:, :8, :256, 0] == out[:, :8, :256, 1]).all()  # greys stay grey


def test_contiguous_batches_and_gain_dtypes() -> None:
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (3, 17, 23, 3), dtype=np.uint8)
    gains = _draws(3, 4, (0.1, 0.8, 0.5))
    nchw = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())  # plain NCHW, not channels-last
    hsv_jitter_batch_(nchw, torch.from_numpy(gains))
    assert np.abs(nchw.numpy().transpose(0, 2, 3, 1).astype(np.int16) - _reference(images, gains)).max() <= 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0), min_size=3, max_size=3), st.floats(0.0, 1.0))
def test_lookup_tables_equal_numpys(unit: list[float], hue_range: float) -> None:
    gains = np.array(unit) * (hue_range, 1.5, 1.5)
    expected = _numpy_luts(gains)
    np.testing.assert_array_equal(hsv_luts(torch.tensor(gains[None]))[0].numpy(), expected)


def test_draws_are_ultralytics_and_from_the_generator() -> None:
    jitter = HSVJitter((0.015, 0.7, 0.4))
    a, b = jitter.draw(np.random.default_rng(3)), np.random.default_rng(3).uniform(-1, 1, 3) * (0.015, 0.7, 0.4)
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.float64 and a.shape == (3,)


def test_empty_batches_and_bad_arguments() -> None:
    empty = torch.zeros((0, 3, 8, 8), dtype=torch.uint8)
    assert hsv_jitter_batch_(empty, torch.zeros((0, 3), dtype=torch.float64)) is empty
    with pytest.raises(ValueError, match="images must be uint8"):
        hsv_jitter_batch_(torch.zeros((1, 3, 4, 4)), torch.zeros((1, 3)))
    with pytest.raises(ValueError, match="gains must be"):
        hsv_jitter_batch_(torch.zeros((2, 3, 4, 4), dtype=torch.uint8), torch.zeros((1, 3)))
    with pytest.raises(TypeError, match="three numbers"):
        HSVJitter((0.1, 0.2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="three numbers"):
        HSVJitter("abc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sgain"):
        HSVJitter((0.1, -0.2, 0.3))
    with pytest.raises(TypeError, match="hsv_on_device"):
        HSVJitter((0.1, 0.2, 0.3), on_device=1)  # type: ignore[arg-type]


def test_the_removed_random_hsv_is_refused_by_name(tmp_path: Path) -> None:
    """Issue 52: HSV is configured one way (the ``hsv`` key); the albumentations ``RandomHSV`` this
    package shipped is refused where it turns up: a saved pipeline (nested), or the class path."""
    saved = {"__version__": A.__version__, "transform": {
        "__class_fullname__": "Compose", "p": 1.0, "transforms": [
            {"__class_fullname__": "Blur", "p": 0.1},
            {"__class_fullname__": "OneOf", "p": 0.5, "transforms": [
                {"__class_fullname__": "seg_datamodule.transforms.albu.RandomHSV", "hgain": 0.015, "p": 1.0}]}]}}
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"recipe\.json.*RandomHSV.*hsv: \[h, s, v\]"):
        load_transforms(str(path))
    with pytest.raises(AttributeError, match=r"RandomHSV.*hsv: \[h, s, v\]"):
        seg_datamodule.transforms.RandomHSV  # noqa: B018 (a YAML class_path resolves it so)
    # A saved pipeline of albumentations' own transforms still loads.
    saved["transform"]["transforms"] = saved["transform"]["transforms"][:1]
    path.write_text(json.dumps(saved))
    assert isinstance(load_transforms(str(path)), A.Compose)


def test_pending_gains_are_applied_once() -> None:
    class Pending:
        images = torch.full((1, 3, 4, 4), 200, dtype=torch.uint8)
        images[:, 0] = 20
        hsv_gains: torch.Tensor | None = torch.tensor([[0.1, 0.0, -0.5]], dtype=torch.float64)

    batch = Pending()
    before = batch.images.clone()
    expected = hsv_jitter(before.permute(0, 2, 3, 1).numpy()[0].copy(), np.array([0.1, 0.0, -0.5]))
    assert apply_pending_hsv(batch) is batch and batch.hsv_gains is None
    once = batch.images.clone()
    assert np.abs(once.permute(0, 2, 3, 1).numpy()[0].astype(np.int16) - expected).max() <= 1
    apply_pending_hsv(batch)
    assert torch.equal(batch.images, once)
    assert apply_pending_hsv("not a batch") == "not a batch"
