"""The pure parts of the run pictures (issue 51): label statistics against hand-counted files, the
label figure, and the windowed mask overlay against a full-image blend."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seg_datamodule.io.coco import CocoIndex
from seg_datamodule.pictures import COCO_SIZES, figure_rgb, label_figure, label_stats
from seg_datamodule.visualize import _palette, draw_instances


def _square(x: float, y: float, side: float) -> list[float]:
    return [x, y, x + side, y, x + side, y + side, x, y + side]


def _write_coco(path: Path, annotations: list[tuple[int, int, float, float, float]]) -> Path:
    """Images 1 (200 x 100), 2 (100 x 100), 3 (100 x 100, a background); ``(image, category, x, y, side)`` squares."""
    images = [{"id": 1, "file_name": "a.jpg", "width": 200, "height": 100},
              {"id": 2, "file_name": "b.jpg", "width": 100, "height": 100},
              {"id": 3, "file_name": "c.jpg", "width": 100, "height": 100}]
    anns = [{"id": k + 1, "image_id": im, "category_id": cat, "bbox": [x, y, side, side], "area": side * side,
             "iscrowd": 0, "segmentation": [_square(x, y, side)]} for k, (im, cat, x, y, side) in enumerate(annotations)]
    categories = [{"id": 5, "name": "cat"}, {"id": 9, "name": "dog"}, {"id": 11, "name": "unused"}]
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": categories}))
    return path


def test_label_stats_count_what_the_file_holds(tmp_path: Path) -> None:
    # areas 100 (small), 1024 = 32² (medium: the ranges are half-open), 9216 = 96² (large), 400 (small)
    ann = _write_coco(tmp_path / "a.json", [(1, 5, 0, 0, 10), (1, 9, 100, 0, 32), (2, 9, 2, 2, 96), (2, 5, 50, 60, 20)])
    stats = label_stats("train", CocoIndex.build(ann, tmp_path, use_cache=False))
    assert stats.names == ("cat", "dog", "unused")
    assert stats.class_counts.tolist() == [2, 2, 0] and stats.instances == 4
    assert stats.instances_per_image.tolist() == [2, 2, 0]
    assert stats.sizes == {"small": 2, "medium": 1, "large": 1}
    # fractions of each instance's own image: image 1 is 200 wide, image 2 100
    np.testing.assert_allclose(stats.box_wh, [[0.05, 0.1], [0.16, 0.32], [0.96, 0.96], [0.2, 0.2]])
    np.testing.assert_allclose(stats.box_centers, [[0.025, 0.05], [0.58, 0.16], [0.5, 0.5], [0.6, 0.7]])
    assert stats.crowd == 0 and list(COCO_SIZES) == ["small", "medium", "large"]


def test_the_label_figure_draws_a_split_and_an_empty_one(tmp_path: Path) -> None:
    ann = _write_coco(tmp_path / "a.json", [(1, 5, 0, 0, 10), (2, 9, 2, 2, 96)])
    picture = figure_rgb(label_figure(label_stats("val", CocoIndex.build(ann, tmp_path, use_cache=False))))
    assert picture.dtype == np.uint8 and picture.shape == (720, 1280, 3) and picture.std() > 10
    empty = _write_coco(tmp_path / "empty.json", [])
    stats = label_stats("val", CocoIndex.build(empty, tmp_path, use_cache=False))
    assert stats.instances == 0 and stats.sizes == {"small": 0, "medium": 0, "large": 0}
    assert figure_rgb(label_figure(stats)).std() > 10


def _full_image_blend(image: np.ndarray, masks: np.ndarray, stride: int, alpha: float = 0.45) -> np.ndarray:
    """The reference: every mask upsampled to the whole image and blended in turn."""
    h, w = image.shape[:2]
    out = image.astype(np.float32)
    for mask, colour in zip(masks, _palette(max(len(masks), 1))):
        big = np.repeat(np.repeat(mask, stride, axis=0), stride, axis=1)[:h, :w]
        out[big] = (1 - alpha) * out[big] + alpha * colour
    return out.clip(0, 255).astype(np.uint8)


@settings(max_examples=40)
@given(st.integers(1, 8), st.integers(1, 40), st.integers(1, 40), st.integers(0, 5), st.integers(0, 2**31 - 1))
def test_the_windowed_overlay_equals_a_full_image_blend(stride: int, h: int, w: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    grid = (-(-h // stride), -(-w // stride))
    masks = rng.random((n, *grid)) < rng.random((n, 1, 1))  # some empty, some full, overlapping
    boxes = np.zeros((n, 4), np.float32)  # boxes and labels off: the masks alone
    drawn = draw_instances(image, masks, boxes, mask_stride=stride)
    reference = _full_image_blend(image, masks, stride)
    # the boxes are drawn over the blend (at 0, 0); compare away from them
    np.testing.assert_array_equal(drawn[2:, 2:], reference[2:, 2:])


def test_labels_are_written_as_names_when_given() -> None:
    image = np.zeros((64, 64, 3), np.uint8)
    masks = np.zeros((1, 16, 16), bool)
    masks[0, 2:10, 2:10] = True
    boxes = np.array([[8, 8, 40, 40]], np.float32)
    as_index = draw_instances(image, masks, boxes, labels=np.array([3]), mask_stride=4)
    as_name = draw_instances(image, masks, boxes, labels=["giraffe"], mask_stride=4)
    assert (as_index != as_name).any(axis=2)[8:20, 9:40].sum() > (as_index != as_name).any(axis=2)[8:20, 9:14].sum()
    with pytest.raises(ValueError, match="masks has 1 instances but boxes has 0"):
        draw_instances(image, masks, boxes[:0])
