"""Canvas predictions -> COCO detections: windowed RLE equals pycocotools' encoder byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils

from seg_datamodule.evaluation.letterbox import MaskWindow, mask_windows
from seg_datamodule.evaluation.predictions import encode_windows, mask_stride_of


def _full(window: MaskWindow, size: tuple[int, int]) -> np.ndarray:
    full = np.zeros(size, bool)
    top, left, mask = window
    full[top : top + mask.shape[0], left : left + mask.shape[1]] = mask
    return full


def _cases(size: tuple[int, int]) -> list[MaskWindow]:
    h, w = size
    rng = np.random.default_rng(0)
    cases = [
        MaskWindow(0, 0, np.ones((h, w), bool)),  # everything on: one run across columns
        MaskWindow(0, 0, np.zeros((h, w), bool)),
        MaskWindow(0, 0, np.zeros((0, 0), bool)),  # no window
        MaskWindow(0, w // 3, np.ones((h, w - w // 3), bool)),  # whole columns, to the end
        MaskWindow(h - 1, w - 1, np.ones((1, 1), bool)),  # the last pixel
        MaskWindow(0, 0, np.ones((1, 1), bool)),  # the first pixel: counts start with 0
    ]
    for _ in range(30):
        top, left = int(rng.integers(0, h)), int(rng.integers(0, w))
        hh, ww = int(rng.integers(1, h - top + 1)), int(rng.integers(1, w - left + 1))
        cases.append(MaskWindow(top, left, rng.random((hh, ww)) < rng.random()))
    return cases


@pytest.mark.parametrize("size", [(7, 5), (1, 9), (9, 1), (40, 33)])
def test_window_rle_equals_pycocotools(size: tuple[int, int]) -> None:
    cases = _cases(size)
    ours = encode_windows(cases, size)
    full = np.stack([_full(c, size) for c in cases], axis=2).astype(np.uint8)
    theirs = [r["counts"] for r in mask_utils.encode(np.asfortranarray(full))]
    assert ours == theirs


def test_windows_of_resampled_masks_encode_like_the_full_masks() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 20, 20, generator=gen) * 3 - 2
    windows = mask_windows(logits, 0.7, (0.0, 6.0), (17, 28), 4, 0.0)
    full = np.stack([_full(w, (17, 28)) for w in windows], axis=2).astype(np.uint8)
    assert encode_windows(windows, (17, 28)) == [r["counts"] for r in mask_utils.encode(np.asfortranarray(full))]
    assert encode_windows([], (17, 28)) == []


def test_mask_stride_is_told_from_the_shape() -> None:
    assert mask_stride_of((640, 480), (640, 480), 4) == 1
    assert mask_stride_of((160, 120), (640, 480), 4) == 4
    assert mask_stride_of((43, 32), (170, 127), 4) == 4  # ceil
    assert mask_stride_of((42, 32), (170, 127), 4) is None
