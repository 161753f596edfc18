"""The COCO index: real coco-mini against pycocotools, every bad input, the cache, workers."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import math
import os
import pickle
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from _reference import reference_rasterize
from seg_datamodule.io.coco import index as coco_module


def flat(index: CocoIndex, i: int) -> tuple[np.ndarray, ...]:
    """Image ``i``'s targets as (vertices, ring_offsets, instance_offsets, labels, annotation_ids)."""
    return (*index.polygons(i).arrays, index.labels(i), index.annotation_ids(i))
from seg_datamodule.io.coco.errors import SKIP_REASONS
from seg_datamodule.io.coco.index import BadAnnotationError, BadImageError, CocoIndex, format_skip_summary, mask_to_rings, rle_counts_from_string
from seg_datamodule.data.accounting import SkipCounter

# --------------------------------------------------------------------------------------------
# A small valid dataset written into tmp_path, and helpers


def _square(x: float, y: float, s: float) -> list[float]:
    return [x, y, x + s, y, x + s, y + s, x, y + s]


def _uncompressed_rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO's uncompressed RLE of a mask: column-major runs starting with zeros."""
    flat = mask.flatten(order="F").astype(np.int8)
    change = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
    runs = np.diff(np.concatenate([[0], change]))
    return {"counts": [int(r) for r in runs], "size": list(mask.shape)}


def _base() -> dict[str, Any]:
    """3 images (one without annotations), categories with gaps, every kind of instance."""
    crowd = np.zeros((40, 60), bool)
    crowd[5:15, 30:50] = True
    blob = np.zeros((40, 60), bool)
    blob[20:35, 5:25] = True
    blob[25:30, 10:15] = False  # a hole
    blob[27, 12] = True  # an island in the hole
    blob_rle = mask_utils.encode(np.asfortranarray(blob.astype(np.uint8)))
    return {
        "info": {},
        "images": [
            {"id": 10, "file_name": "a.jpg", "height": 40, "width": 60},
            {"id": 20, "file_name": "b.jpg", "height": 30, "width": 50},
            {"id": 30, "file_name": "c.jpg", "height": 20, "width": 20},  # negative
        ],
        "categories": [
            {"id": 7, "name": "seven"},
            {"id": 2, "name": "two"},
            {"id": 90, "name": "ninety"},
        ],
        "annotations": [
            {"id": 101, "image_id": 20, "category_id": 7, "iscrowd": 0, "area": 100.0,
             "bbox": [1, 1, 10, 10], "segmentation": [_square(1, 1, 10)]},
            {"id": 102, "image_id": 10, "category_id": 90, "iscrowd": 0, "area": 50.5,
             "bbox": [2.5, 3.25, 20, 12],
             "segmentation": [_square(2.5, 3.25, 5.5), [30.1, 2.2, 40.7, 2.2, 35.0, 9.9]]},
            {"id": 103, "image_id": 10, "category_id": 2, "iscrowd": 1, "area": 200,
             "bbox": [30, 5, 20, 10], "segmentation": _uncompressed_rle(crowd)},
            {"id": 104, "image_id": 10, "category_id": 2, "iscrowd": 0, "area": 276,
             "bbox": [5, 20, 20, 15],
             "segmentation": {"size": [40, 60], "counts": blob_rle["counts"].decode("ascii")}},
            {"id": 105, "image_id": 20, "category_id": 2, "iscrowd": 0, "area": 12.0,
             "bbox": [20, 20, 4, 3], "segmentation": [[20, 20, 24, 20, 24, 23, 20, 23]]},
        ],
    }


def _write(tmp_path: Path, data: dict[str, Any], name: str = "ann.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _build(path: Path, **kwargs: Any) -> CocoIndex:
    kwargs.setdefault("use_cache", False)
    return CocoIndex.build(path, path.parent, **kwargs)


def _kept_annotations(index: CocoIndex) -> set[int]:
    ids: set[int] = set()
    for i in range(len(index)):
        ids.update(flat(index, i)[4].tolist())
        ids.update(index.crowd_annotation_ids(i).tolist())
    return ids


def _annotation_skips(index: CocoIndex) -> int:
    return sum(c for r, c in index.skip_counts.items() if not r.startswith("image_"))


def _image_skips(index: CocoIndex) -> int:
    return sum(c for r, c in index.skip_counts.items() if r.startswith("image_"))


def _write_images(root: Path, data: dict[str, Any]) -> None:
    rng = np.random.default_rng(0)
    for img in data["images"]:
        pixels = rng.integers(0, 255, (img["height"], img["width"], 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / img["file_name"], "JPEG")


# --------------------------------------------------------------------------------------------
# The valid dataset


def test_labels_are_contiguous_in_sorted_category_id_order(tmp_path: Path) -> None:
    index = _build(_write(tmp_path, _base()))
    np.testing.assert_array_equal(index.category_ids, [2, 7, 90])
    assert index.label_of_category == {2: 0, 7: 1, 90: 2}
    assert index.class_names == ["two", "seven", "ninety"]
    assert index.num_classes == 3


def test_tables_of_the_small_dataset(tmp_path: Path) -> None:
    index = _build(_write(tmp_path, _base()))
    assert len(index) == index.num_images == 3
    np.testing.assert_array_equal(index.image_ids, [10, 20, 30])
    np.testing.assert_array_equal(index.heights, [40, 30, 20])
    np.testing.assert_array_equal(index.widths, [60, 50, 20])
    assert index.file_path(1) == tmp_path / "b.jpg"
    assert index.num_instances == 4 and index.num_crowd == 1 and index.skip_counts == {}
    # Image 10: annotations 102 then 104 (file order), the crowd 103 apart.
    vertices, rings, instances, labels, ann_ids = flat(index, 0)
    np.testing.assert_array_equal(ann_ids, [102, 104])
    np.testing.assert_array_equal(labels, [2, 0])
    np.testing.assert_array_equal(instances[:2], [0, 2])
    np.testing.assert_array_equal(vertices[rings[0] : rings[1]], np.reshape(_square(2.5, 3.25, 5.5), (-1, 2)))
    np.testing.assert_array_equal(vertices[rings[1] : rings[2]], [[30.1, 2.2], [40.7, 2.2], [35.0, 9.9]])
    np.testing.assert_array_equal(index.crowd_annotation_ids(0), [103])
    np.testing.assert_array_equal(index.bboxes(0), [[2.5, 3.25, 20, 12], [5, 20, 20, 15]])
    # Image 20: two polygons, no crowd.
    assert flat(index, 1)[4].tolist() == [101, 105] and index.crowd_mask(1) is None
    for array, dtype in zip(flat(index, 1), (np.float64, np.int64, np.int64, np.int64, np.int64)):
        assert array.dtype == dtype


def test_image_without_annotations_is_an_empty_negative(tmp_path: Path) -> None:
    index = _build(_write(tmp_path, _base()))
    vertices, rings, instances, labels, ann_ids = flat(index, 2)
    assert vertices.shape == (0, 2) and vertices.dtype == np.float64
    assert rings.tolist() == [0] and instances.tolist() == [0]
    assert labels.shape == ann_ids.shape == (0,) and labels.dtype == ann_ids.dtype == np.int64
    assert index.crowd_mask(2) is None


def test_drop_empty_and_drop_crowd(tmp_path: Path) -> None:
    data = _base()
    data["images"].append({"id": 40, "file_name": "d.jpg", "height": 40, "width": 60})
    data["annotations"].append({"id": 106, "image_id": 40, "category_id": 2, "iscrowd": 1,
                                "bbox": [0, 0, 5, 5],
                                "segmentation": [_square(0, 0, 5)]})
    path = _write(tmp_path, data)
    index = _build(path, drop_empty=True)
    np.testing.assert_array_equal(index.image_ids, [10, 20])  # 30 empty, 40 crowd only
    assert index.dropped_counts == {"crowd_dropped": 1, "image_empty_dropped": 2}
    assert index.num_crowd == 1 and index.crowd_mask(0) is not None
    no_crowd = _build(path, drop_crowd=True)
    assert no_crowd.num_crowd == 0 and len(no_crowd) == 4
    assert all(no_crowd.crowd_mask(i) is None for i in range(len(no_crowd)))
    assert no_crowd.dropped_counts == {"crowd_dropped": 2, "image_empty_dropped": 0}
    assert no_crowd.num_instances == index.num_instances == 4
    merged = {**index.skip_counts, **index.dropped_counts}
    assert format_skip_summary(merged) == (
        "skipped 2 images (image_empty_dropped 2) and 1 annotation (crowd_dropped 1)"
    )


def test_crowd_mask_is_the_rle_union(tmp_path: Path) -> None:
    data = _base()
    extra = np.zeros((40, 60), bool)
    extra[10:20, 45:58] = True
    data["annotations"].append({"id": 107, "image_id": 10, "category_id": 7, "iscrowd": 1,
                                "bbox": [45, 10, 13, 10],
                                "segmentation": _uncompressed_rle(extra)})
    index = _build(_write(tmp_path, data))
    expected = np.zeros((40, 60), bool)
    expected[5:15, 30:50] = True
    expected |= extra
    mask = index.crowd_mask(0)
    assert mask is not None and mask.dtype == bool and mask.shape == (40, 60)
    np.testing.assert_array_equal(mask, expected)


def test_crowd_polygon_becomes_rle(tmp_path: Path) -> None:
    data = _base()
    data["annotations"].append({"id": 108, "image_id": 20, "category_id": 7, "iscrowd": 1,
                                "bbox": [5, 5, 10, 10],
                                "segmentation": [_square(5, 5, 10)]})
    index = _build(_write(tmp_path, data))
    rle = mask_utils.merge(mask_utils.frPyObjects([_square(5, 5, 10)], 30, 50))
    np.testing.assert_array_equal(index.crowd_mask(1), mask_utils.decode(rle).astype(bool))


def test_non_crowd_rle_becomes_exact_polygons(tmp_path: Path) -> None:
    data = _base()
    index = _build(_write(tmp_path, data))
    vertices, rings, instances, labels, ann_ids = flat(index, 0)
    assert ann_ids.tolist() == [102, 104]
    n = 1
    instance_rings = [vertices[rings[r] : rings[r + 1]] for r in range(instances[n], instances[n + 1])]
    counts = data["annotations"][3]["segmentation"]["counts"]
    expected = mask_utils.decode({"size": [40, 60], "counts": counts}).astype(bool)
    np.testing.assert_array_equal(reference_rasterize([instance_rings], (40, 60), 1)[0], expected)
    corners = vertices[rings[instances[n]] :]
    assert np.array_equal(corners, np.round(corners))  # on pixel corners


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 14).flatmap(
        lambda h: st.integers(1, 14).flatmap(
            lambda w: st.lists(st.booleans(), min_size=h * w, max_size=h * w).map(
                lambda bits: np.array(bits, bool).reshape(h, w)
            )
        )
    )
)
def test_mask_to_rings_round_trips_exactly(mask: np.ndarray) -> None:
    rings = mask_to_rings(mask)
    if not mask.any():
        assert rings == []
        return
    assert all(r.dtype == np.float64 and r.ndim == 2 and r.shape[1] == 2 for r in rings)
    np.testing.assert_array_equal(reference_rasterize([rings], mask.shape, 1)[0], mask)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_rle_string_decoder_matches_pycocotools(h: int, w: int, seed: int) -> None:
    mask = np.random.default_rng(seed).random((h, w)) < 0.4
    encoded = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    assert rle_counts_from_string(encoded["counts"]) == _uncompressed_rle(mask)["counts"]


def test_rle_string_decoder_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="invalid character"):
        rle_counts_from_string("ab~")
    with pytest.raises(ValueError, match="ends inside"):
        rle_counts_from_string("a`")  # the continuation bit is set on the last character


def test_polygons_returns_fresh_arrays(tmp_path: Path) -> None:
    index = _build(_write(tmp_path, _base()))
    before = [a.copy() for a in flat(index, 0)]
    for array in flat(index, 0):
        array[...] = 0
    for a, b in zip(before, flat(index, 0)):
        np.testing.assert_array_equal(a, b)


def test_build_arguments_are_checked(tmp_path: Path) -> None:
    path = _write(tmp_path, _base())
    with pytest.raises(ValueError, match="on_bad_sample must be 'raise' or 'skip', got 'ignore'"):
        _build(path, on_bad_sample="ignore")
    with pytest.raises(TypeError, match="drop_crowd must be a bool"):
        _build(path, drop_crowd=1)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        _build(tmp_path / "nope.json")
    index = _build(path)
    with pytest.raises(IndexError, match="image index 3 out of range for 3 images"):
        flat(index, 3)


# --------------------------------------------------------------------------------------------
# coco-mini against pycocotools


@pytest.fixture(scope="module")
def mini_index(coco_mini: Path, tmp_path_factory: pytest.TempPathFactory) -> CocoIndex:
    return CocoIndex.build(
        coco_mini / "annotations" / "instances_train2017.json",
        coco_mini / "train2017",
        cache_dir=tmp_path_factory.mktemp("cache"),
    )


@pytest.fixture(scope="module")
def mini_coco(coco_mini: Path) -> COCO:
    with contextlib.redirect_stdout(io.StringIO()):
        return COCO(str(coco_mini / "annotations" / "instances_train2017.json"))


@pytest.mark.parametrize("split, images, instances, crowd", [("train", 80, 731, 8), ("val", 79, 619, 5)])
def test_coco_mini_counts(
    coco_mini: Path, tmp_path: Path, split: str, images: int, instances: int, crowd: int
) -> None:
    ann_file = coco_mini / "annotations" / f"instances_{split}2017.json"
    index = CocoIndex.build(ann_file, coco_mini / f"{split}2017", cache_dir=tmp_path)
    assert (index.num_images, index.num_instances, index.num_crowd) == (images, instances, crowd)
    assert index.skip_counts == {} and index.num_classes == 80
    assert index.num_instances + index.num_crowd == {"train": 739, "val": 624}[split]


def test_coco_mini_labels(mini_index: CocoIndex, mini_coco: COCO) -> None:
    cat_ids = sorted(mini_coco.getCatIds())
    np.testing.assert_array_equal(mini_index.category_ids, cat_ids)
    assert mini_index.label_of_category == {c: k for k, c in enumerate(cat_ids)}
    assert mini_index.class_names == [mini_coco.cats[c]["name"] for c in cat_ids]
    assert sorted(mini_index.label_of_category.values()) == list(range(80))


def test_coco_mini_polygons_match_the_json_exactly(mini_index: CocoIndex, coco_mini: Path) -> None:
    data = json.loads((coco_mini / "annotations" / "instances_train2017.json").read_text())
    label_of = mini_index.label_of_category
    assert mini_index.image_ids.tolist() == [img["id"] for img in data["images"]]
    for i, img in enumerate(data["images"]):
        assert mini_index.image_size(i) == (img["height"], img["width"])
        assert mini_index.file_path(i) == coco_mini / "train2017" / img["file_name"]
        anns = [a for a in data["annotations"] if a["image_id"] == img["id"] and not a["iscrowd"]]
        vertices, rings, instances, labels, ann_ids = flat(mini_index, i)
        assert ann_ids.tolist() == [a["id"] for a in anns]
        assert labels.tolist() == [label_of[a["category_id"]] for a in anns]
        np.testing.assert_array_equal(mini_index.bboxes(i), [a["bbox"] for a in anns] or np.zeros((0, 4)))
        for n, ann in enumerate(anns):
            got = [vertices[rings[r] : rings[r + 1]] for r in range(instances[n], instances[n + 1])]
            assert len(got) == len(ann["segmentation"])
            for ring, expected in zip(got, ann["segmentation"]):
                assert np.array_equal(ring, np.asarray(expected, np.float64).reshape(-1, 2))  # bit for bit


def test_coco_mini_crowd_masks_match_ann_to_mask(mini_index: CocoIndex, mini_coco: COCO) -> None:
    seen = 0
    for i, image_id in enumerate(mini_index.image_ids.tolist()):
        crowd = [a for a in mini_coco.imgToAnns[image_id] if a["iscrowd"]]
        mask = mini_index.crowd_mask(i)
        if not crowd:
            assert mask is None
            continue
        expected = np.zeros(mini_index.image_size(i), bool)
        for ann in crowd:
            expected |= mini_coco.annToMask(ann).astype(bool)
        np.testing.assert_array_equal(mask, expected)
        seen += len(crowd)
    assert seen == 8


def test_coco_mini_images_decode_at_the_json_size(mini_index: CocoIndex) -> None:
    for i in range(0, len(mini_index), 9):
        h, w = mini_index.image_size(i)
        assert mini_index.load_image(i).shape == (h, w, 3)
        assert mini_index.load_image(i, reduce=4).shape == (math.ceil(h / 4), math.ceil(w / 4), 3)


def test_index_pickles_small_and_equal(mini_index: CocoIndex) -> None:
    blob = pickle.dumps(mini_index, protocol=pickle.HIGHEST_PROTOCOL)
    assert len(blob) < mini_index.nbytes + 16_384  # flat arrays, no per-annotation objects
    back = pickle.loads(blob)
    assert back == mini_index
    for i in (0, 17, 79):
        for a, b in zip(flat(back, i), flat(mini_index, i)):
            np.testing.assert_array_equal(a, b)
    # The index holds arrays and a few small containers only.
    assert all(isinstance(v, np.ndarray) for v in mini_index._t.values())
    assert len(mini_index._t) < 30


# --------------------------------------------------------------------------------------------
# Bad input: each case in raise mode (message) and skip mode (count, nothing else lost)

Mutator = Callable[[dict[str, Any]], None]


def _ann(data: dict[str, Any], ann_id: int) -> dict[str, Any]:
    return next(a for a in data["annotations"] if a["id"] == ann_id)


def _set(ann_id: int, key: str, value: Any) -> Mutator:
    def mutate(data: dict[str, Any]) -> None:
        _ann(data, ann_id)[key] = value

    return mutate


def _delete(ann_id: int, key: str) -> Mutator:
    def mutate(data: dict[str, Any]) -> None:
        del _ann(data, ann_id)[key]

    return mutate


def _append_duplicate_annotation(data: dict[str, Any]) -> None:
    dup = copy.deepcopy(_ann(data, 105))
    data["annotations"].append(dup)


def _append_duplicate_image(data: dict[str, Any]) -> None:
    data["images"].append({"id": 20, "file_name": "other.jpg", "height": 30, "width": 50})


def _bad_image_entry(data: dict[str, Any]) -> None:
    data["images"][1]["height"] = 0  # image 20, which has annotations 101 and 105


# (case id, mutation, reason, annotation id named, image id named, file named, how many of the
# five valid annotations are lost)
BAD_ANNOTATIONS = [
    ("duplicate annotation id", _append_duplicate_annotation, "annotation_duplicate_id", 105, 20, None, 0),
    ("unknown image id", _set(101, "image_id", 999), "annotation_unknown_image_id", 101, 999, None, 1),
    ("unknown category id", _set(101, "category_id", 3),
     "annotation_unknown_category_id", 101, 20, "b.jpg", 1),
    ("polygon of 2 points", _set(101, "segmentation", [[1, 1, 5, 5]]),
     "polygon_too_few_points", 101, 20, "b.jpg", 1),
    ("polygon odd coordinates", _set(105, "segmentation", [[20, 20, 24, 20, 24, 23, 20]]),
     "polygon_odd_coordinates", 105, 20, "b.jpg", 1),
    ("polygon NaN", _set(101, "segmentation", [[1, 1, 5, float("nan"), 5, 9]]),
     "polygon_non_finite", 101, 20, "b.jpg", 1),
    ("polygon inf", _set(102, "segmentation", [_square(1, 1, 2), [1, 1, 5, float("inf"), 5, 9]]),
     "polygon_non_finite", 102, 10, "a.jpg", 1),
    ("polygon collinear", _set(101, "segmentation", [[1.1, 1.1, 2.2, 2.2, 3.3, 3.3, 4.4, 4.4]]),
     "zero_area", 101, 20, "b.jpg", 1),
    ("polygon one point", _set(101, "segmentation", [[7, 7, 7, 7, 7, 7]]), "zero_area", 101, 20, "b.jpg", 1),
    ("polygon of strings", _set(101, "segmentation", [["1", "1", "5", "1", "5", "5"]]),
     "segmentation_invalid", 101, 20, "b.jpg", 1),
    ("segmentation []", _set(101, "segmentation", []), "segmentation_empty", 101, 20, "b.jpg", 1),
    ("segmentation [[]]", _set(101, "segmentation", [[]]), "segmentation_empty", 101, 20, "b.jpg", 1),
    ("segmentation missing", _delete(101, "segmentation"), "segmentation_empty", 101, 20, "b.jpg", 1),
    ("segmentation a number", _set(101, "segmentation", 5), "segmentation_invalid", 101, 20, "b.jpg", 1),
    ("bbox zero width", _set(101, "bbox", [1, 1, 0, 10]), "bbox_non_positive", 101, 20, "b.jpg", 1),
    ("bbox negative height", _set(105, "bbox", [1, 1, 3, -2]), "bbox_non_positive", 105, 20, "b.jpg", 1),
    ("bbox missing", _delete(101, "bbox"), "bbox_invalid", 101, 20, "b.jpg", 1),
    ("bbox NaN", _set(101, "bbox", [1, 1, float("nan"), 2]), "bbox_invalid", 101, 20, "b.jpg", 1),
    ("crowd bbox zero", _set(103, "bbox", [1, 1, 0, 0]), "bbox_non_positive", 103, 10, "a.jpg", 1),
    ("rle size mismatch", lambda d: _ann(d, 104)["segmentation"].update(size=[41, 60]),
     "rle_size_mismatch", 104, 10, "a.jpg", 1),
    ("rle counts too long", lambda d: _ann(d, 103)["segmentation"]["counts"].append(5000),
     "rle_invalid", 103, 10, "a.jpg", 1),
    ("rle counts negative", lambda d: _ann(d, 103)["segmentation"].update(counts=[-1, 2401]),
     "rle_invalid", 103, 10, "a.jpg", 1),
    ("rle string garbage", lambda d: _ann(d, 104)["segmentation"].update(counts="~~~"),
     "rle_invalid", 104, 10, "a.jpg", 1),
    ("rle all zeros", _set(104, "segmentation", {"size": [40, 60], "counts": [2400]}),
     "zero_area", 104, 10, "a.jpg", 1),
    ("iscrowd a string", _set(101, "iscrowd", "0"), "annotation_bad_entry", 101, 20, "b.jpg", 1),
    ("iscrowd 2", _set(105, "iscrowd", 2), "annotation_bad_entry", 105, 20, "b.jpg", 1),
    ("annotation id missing", _delete(101, "id"), "annotation_bad_entry", None, 20, None, 1),
    ("annotation not an object", lambda d: d["annotations"].insert(1, [1, 2]),
     "annotation_bad_entry", None, None, None, 0),
    ("duplicate image id", _append_duplicate_image, "image_duplicate_id", None, 20, "other.jpg", 0),
    ("image height 0", _bad_image_entry, "image_bad_entry", None, 20, "b.jpg", 2),
]


@pytest.mark.parametrize(
    "mutate, reason, ann_id, image_id, file_name, lost",
    [case[1:] for case in BAD_ANNOTATIONS],
    ids=[case[0] for case in BAD_ANNOTATIONS],
)
def test_bad_input_raises_naming_file_and_ids(
    tmp_path: Path, mutate: Mutator, reason: str, ann_id: int | None, image_id: int | None,
    file_name: str | None, lost: int,
) -> None:
    data = _base()
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(BadAnnotationError) as info:
        _build(path)
    message = str(info.value)
    assert info.value.reason == reason
    assert message.startswith(f"{path}:")
    if ann_id is not None:
        assert f"annotation id {ann_id}" in message and info.value.annotation_id == ann_id
    if image_id is not None:
        assert f"image id {image_id}" in message
    if file_name is not None:
        assert file_name in message


@pytest.mark.parametrize(
    "mutate, reason, ann_id, image_id, file_name, lost",
    [case[1:] for case in BAD_ANNOTATIONS],
    ids=[case[0] for case in BAD_ANNOTATIONS],
)
def test_bad_input_is_skipped_and_counted(
    tmp_path: Path, mutate: Mutator, reason: str, ann_id: int | None, image_id: int | None,
    file_name: str | None, lost: int, caplog: pytest.LogCaptureFixture,
) -> None:
    data = _base()
    mutate(data)
    path = _write(tmp_path, data)
    with caplog.at_level(logging.WARNING, logger="seg_datamodule.coco"):
        index = _build(path, on_bad_sample="skip")
    assert index.skip_counts[reason] == 1
    assert set(index.skip_counts) <= set(SKIP_REASONS)
    # Nothing silently lost: every annotation is kept, or counted once.
    total_annotations = len(data["annotations"])
    kept = _kept_annotations(index)
    assert len(kept) == index.num_instances + index.num_crowd
    assert index.num_instances + index.num_crowd + _annotation_skips(index) == total_annotations
    assert len({101, 102, 103, 104, 105} - kept) == lost
    assert index.num_images + _image_skips(index) == len(data["images"])
    if reason == "image_bad_entry":
        assert index.skip_counts["annotation_of_skipped_image"] == 2 and 20 not in index.image_ids
    # The summary is logged once, naming the reason and an example with the file.
    records = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert len(records) == 1 and reason in records[0].getMessage() and str(path) in records[0].getMessage()


def test_skip_keeps_everything_else_exactly(tmp_path: Path) -> None:
    good = _build(_write(tmp_path, _base(), "good.json"))
    data = _base()
    _set(101, "segmentation", [[1, 1, 5, 5]])(data)
    index = _build(_write(tmp_path, data, "bad.json"), on_bad_sample="skip")
    assert _kept_annotations(index) == _kept_annotations(good) - {101}
    for a, b in zip(flat(index, 0), flat(good, 0)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(flat(index, 1)[4], [105])


def test_raise_names_the_first_problem_in_file_order(tmp_path: Path) -> None:
    data = _base()
    # A NaN (found by the vectorised pass) before an unknown category (found in the loop).
    _set(101, "segmentation", [[1, 1, 5, float("nan"), 5, 9]])(data)
    _set(105, "category_id", 3)(data)
    with pytest.raises(BadAnnotationError, match="annotation id 101 .*NaN"):
        _build(_write(tmp_path, data))
    data = _base()
    _set(105, "segmentation", [[1, 1, 5, float("nan"), 5, 9]])(data)
    _set(101, "category_id", 3)(data)
    with pytest.raises(BadAnnotationError, match="annotation id 101 .*category_id 3"):
        _build(_write(tmp_path, data))


def test_several_problems_are_counted_by_reason(tmp_path: Path) -> None:
    data = _base()
    _set(101, "segmentation", [[1, 1, 5, 5]])(data)
    _set(105, "bbox", [0, 0, 0, 0])(data)
    _set(102, "category_id", 12345)(data)
    index = _build(_write(tmp_path, data), on_bad_sample="skip")
    assert index.skip_counts == {"polygon_too_few_points": 1, "bbox_non_positive": 1,
                                 "annotation_unknown_category_id": 1}
    assert "skipped 3 annotations" in index.skip_summary()
    assert index.num_instances == 1 and _kept_annotations(index) == {103, 104}


@pytest.mark.parametrize(
    "content, match",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "top level is a list"),
        (json.dumps({"images": [], "annotations": []}), "'categories' missing"),
        (json.dumps({"images": [], "categories": []}), "'annotations' missing"),
        (json.dumps({"annotations": [], "categories": [], "images": {}}), "'images' missing"),
        (json.dumps({"images": [], "annotations": [],
                     "categories": [{"id": 1, "name": "a"}, {"id": 1, "name": "b"}]}),
         "category id 1 appears twice"),
        (json.dumps({"images": [], "annotations": [], "categories": [{"name": "a"}]}),
         "category #0 needs an integer"),
    ],
)
@pytest.mark.parametrize("mode", ["raise", "skip"])
def test_not_coco_always_raises(tmp_path: Path, content: str, match: str, mode: str) -> None:
    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(BadAnnotationError, match=match) as info:
        _build(path, on_bad_sample=mode)
    assert str(path) in str(info.value)


def test_many_bad_annotations_across_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coco_module, "_CHUNK", 7)
    data = _base()
    rng = np.random.default_rng(0)
    bad_ids = set()
    for k in range(60):
        ann = {"id": 1000 + k, "image_id": 10, "category_id": 7, "iscrowd": 0, "bbox": [1, 1, 3, 3],
               "segmentation": [_square(float(rng.integers(0, 30)), 1.5, 3)]}
        if k % 5 == 0:
            ann["segmentation"] = [[1, 1, float("inf"), 2, 3, 3]]
            bad_ids.add(ann["id"])
        data["annotations"].append(ann)
    index = _build(_write(tmp_path, data), on_bad_sample="skip")
    assert index.skip_counts == {"polygon_non_finite": len(bad_ids)}
    assert _kept_annotations(index) == {a["id"] for a in data["annotations"]} - bad_ids
    ids = flat(index, 0)[4].tolist()
    assert ids == [a["id"] for a in data["annotations"] if a["image_id"] == 10 and not a["iscrowd"]
                   and a["id"] not in bad_ids]  # file order survives the chunking
    with pytest.raises(BadAnnotationError, match="annotation id 1000 "):
        _build(_write(tmp_path, data))


def test_coordinates_that_are_not_hundredths_stay_float64(tmp_path: Path) -> None:
    data = _base()
    ring = [1 / 3, 0.1, 9.123456789, 0.1, 5.5, 7.25]
    _set(101, "segmentation", [ring])(data)
    index = _build(_write(tmp_path, data))
    vertices = flat(index, 1)[0]
    assert np.array_equal(vertices[:3], np.reshape(ring, (-1, 2)))  # bit for bit


# --------------------------------------------------------------------------------------------
# Cache


def test_cache_hit_is_equal_and_skips_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, _base())
    cache = tmp_path / "cache"
    first = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert not first.from_cache and first.cache_path is not None and first.cache_path.parent == cache

    def no_build(*args: Any) -> Any:
        raise AssertionError("the JSON was parsed again")

    monkeypatch.setattr(coco_module, "_build_tables", no_build)
    second = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert second.from_cache and second == first
    for i in range(len(first)):
        for a, b in zip(flat(first, i), flat(second, i)):
            np.testing.assert_array_equal(a, b)
    # Options apply on the cached arrays.
    assert CocoIndex.build(path, tmp_path, cache_dir=cache, drop_crowd=True).num_crowd == 0


def test_modified_annotation_file_is_rebuilt(tmp_path: Path) -> None:
    path = _write(tmp_path, _base())
    cache = tmp_path / "cache"
    assert CocoIndex.build(path, tmp_path, cache_dir=cache).num_instances == 4
    data = _base()
    data["annotations"].pop()
    path.write_text(json.dumps(data))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    rebuilt = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert not rebuilt.from_cache and rebuilt.num_instances == 3
    assert CocoIndex.build(path, tmp_path, cache_dir=cache).from_cache
    # Same size, other content (an editor saving in place): the mtime tells.
    text = path.read_text()
    path.write_text(text.replace('"two"', '"TWO"'))
    assert path.stat().st_size == len(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2 * 10**9))
    renamed = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert not renamed.from_cache and renamed.class_names[0] == "TWO"
    assert len(list(cache.glob("*.npz"))) == 1  # overwritten, not accumulated


@pytest.mark.parametrize("damage", ["garbage", "truncate", "flip"])
def test_corrupt_cache_is_rebuilt(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path, _base())
    cache = tmp_path / "cache"
    first = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert first.cache_path is not None
    blob = first.cache_path.read_bytes()
    if damage == "garbage":
        first.cache_path.write_bytes(b"not a zip file")
    elif damage == "truncate":
        first.cache_path.write_bytes(blob[: len(blob) // 2])
    else:  # one byte inside the vertex data: caught by the zip CRC
        k = blob.index(b"vertices.npy") + 200
        first.cache_path.write_bytes(blob[:k] + bytes([blob[k] ^ 0xFF]) + blob[k + 1 :])
    with caplog.at_level(logging.WARNING, logger="seg_datamodule.coco"):
        again = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert not again.from_cache and again == first
    assert any("unreadable" in r.getMessage() for r in caplog.records)
    assert CocoIndex.build(path, tmp_path, cache_dir=cache).from_cache  # rewritten


def test_cache_built_in_skip_mode_still_raises_in_raise_mode(tmp_path: Path) -> None:
    data = _base()
    _set(101, "segmentation", [[1, 1, 5, 5]])(data)
    path = _write(tmp_path, data)
    cache = tmp_path / "cache"
    skipped = CocoIndex.build(path, tmp_path, cache_dir=cache, on_bad_sample="skip")
    assert skipped.skip_counts == {"polygon_too_few_points": 1}
    match = r"annotation id 101 \(image id 20, file b.jpg\).*2 points"
    with pytest.raises(BadAnnotationError, match=match) as info:
        CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert info.value.reason == "polygon_too_few_points" and info.value.annotation_id == 101
    again = CocoIndex.build(path, tmp_path, cache_dir=cache, on_bad_sample="skip")
    assert again.from_cache and again.skip_counts == skipped.skip_counts


def test_default_cache_dir_honours_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEG_DATAMODULE_CACHE", str(tmp_path / "env_cache"))
    path = _write(tmp_path, _base())
    index = CocoIndex.build(path, tmp_path)
    assert index.cache_path is not None and index.cache_path.parent == tmp_path / "env_cache" / "coco_index"


# --------------------------------------------------------------------------------------------
# Images through the index


@pytest.fixture
def image_dataset(tmp_path: Path) -> Path:
    data = _base()
    _write_images(tmp_path, data)
    return _write(tmp_path, data)


def test_load_image_and_wrong_sizes(image_dataset: Path) -> None:
    index = _build(image_dataset)
    assert index.load_image(0).shape == (40, 60, 3)
    assert index.load_image(1, reduce=8).shape == (4, 7, 3)
    # A file 1 px narrower than the JSON says: caught at full and at reduced scale (the ceil
    # sizes agree at reduce=2, the stored size from the header does not).
    Image.fromarray(np.zeros((40, 59, 3), np.uint8)).save(index.file_path(0), "JPEG")
    for reduce in (1, 2):
        match = r"image id 10: image file .*a.jpg is 40x59 .* says 40x60"
        with pytest.raises(BadImageError, match=match) as info:
            index.load_image(0, reduce=reduce)
        error = info.value
        assert (error.reason, error.image_id, error.image_index) == ("image_size_mismatch", 10, 0)
    assert index.load_image(0, check_size=False).shape == (40, 59, 3)


def test_load_image_missing_and_corrupt(image_dataset: Path) -> None:
    index = _build(image_dataset)
    index.file_path(1).unlink()
    with pytest.raises(BadImageError, match=r"image id 20: image file .*b.jpg does not exist") as info:
        index.load_image(1)
    assert info.value.reason == "image_missing" and str(image_dataset) in str(info.value)
    index.file_path(2).write_bytes(index.file_path(0).read_bytes()[:300])
    with pytest.raises(BadImageError, match=r"image id 30: image file .*c.jpg is truncated"):
        index.load_image(2)


def test_verify_images(image_dataset: Path) -> None:
    root = image_dataset.parent
    assert len(_build(image_dataset, verify_images=True)) == 3
    (root / "b.jpg").write_bytes(b"garbage")
    with pytest.raises(BadImageError, match="b.jpg"):
        _build(image_dataset, verify_images=True)
    index = _build(image_dataset, verify_images=True, on_bad_sample="skip")
    np.testing.assert_array_equal(index.image_ids, [10, 30])
    assert index.skip_counts == {"image_corrupt": 1, "annotation_of_skipped_image": 2}
    assert index.num_instances + index.num_crowd + _annotation_skips(index) == 5
    assert _build(image_dataset).num_images == 3  # setup never opens images by default


class _LoadImages(torch.utils.data.Dataset):
    def __init__(self, index: CocoIndex, counter: SkipCounter | None = None) -> None:
        self.index, self.counter = index, counter

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> int:
        try:
            return int(self.index.load_image(i).shape[0])
        except BadImageError as err:
            if self.counter is None:
                raise
            self.counter.add_error(err)
            return -1


def test_worker_error_reaches_the_main_process_with_the_file_name(image_dataset: Path) -> None:
    index = _build(image_dataset)
    index.file_path(1).write_bytes(b"\xff\xd8\xff\xe0 corrupt")
    loader = torch.utils.data.DataLoader(_LoadImages(index), batch_size=1, num_workers=2)
    with pytest.raises(BadImageError, match=r"b\.jpg") as info:
        list(loader)
    assert "image id 20" in str(info.value)


# --------------------------------------------------------------------------------------------
# SkipCounter


def test_skip_counter_basics() -> None:
    counter = SkipCounter()
    assert counter.counts() == {} and counter.total() == 0 and counter.summary() == "nothing skipped"
    counter.add("image_missing")
    counter.add("image_corrupt", 2)
    counter.add_error(BadImageError("x", reason="image_truncated"))
    counter.add_error(BadImageError("rebuilt from a message in the main process"))
    assert counter.counts() == {"image_missing": 1, "image_truncated": 1, "image_corrupt": 3}
    assert counter.total() == 5
    assert counter.summary() == "skipped 5 images (image_corrupt 3, image_missing 1, image_truncated 1)"
    with pytest.raises(ValueError, match="unknown skip reason 'polygon'"):
        counter.add("polygon")
    counter.reset()
    assert counter.counts() == {}
    with pytest.raises(ValueError, match="distinct strings"):
        SkipCounter(["a", "a"])


def test_skip_counter_pickled_outside_spawning_is_a_snapshot() -> None:
    counter = SkipCounter(["a", "b"])
    counter.add("b", 3)
    copied = copy.deepcopy(counter)
    loaded = pickle.loads(pickle.dumps(counter))
    copied.add("a")
    assert counter.counts() == {"b": 3}
    assert copied.counts() == {"a": 1, "b": 3} and loaded.counts() == {"b": 3}


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_skip_counter_counts_across_workers(image_dataset: Path, context: str) -> None:
    index = _build(image_dataset)
    index.file_path(1).unlink()
    index.file_path(2).write_bytes(b"garbage")
    counter = SkipCounter(context=torch.multiprocessing.get_context(context))
    dataset = torch.utils.data.ConcatDataset([_LoadImages(index, counter)] * 4)  # 12 items, 8 bad
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=2, num_workers=2, multiprocessing_context=context, collate_fn=list
    )
    heights = [h for batch in loader for h in batch]
    assert sorted(heights) == [-1] * 8 + [40] * 4
    assert counter.counts() == {"image_missing": 4, "image_corrupt": 4}


def test_format_skip_summary() -> None:
    assert format_skip_summary({}) == "nothing skipped"
    assert format_skip_summary({"zero_area": 1}) == "skipped 1 annotation (zero_area 1)"
    text = format_skip_summary({"image_missing": 2, "zero_area": 1, "bbox_invalid": 3, "image_corrupt": 0})
    assert text == "skipped 2 images (image_missing 2) and 4 annotations (bbox_invalid 3, zero_area 1)"


def test_bow_tie_whose_lobes_cancel_is_a_target(tmp_path: Path) -> None:
    # Net shoelace area 0, yet pycocotools paints 50 px: it must not be dropped as zero_area.
    data = _base()
    bow_tie = [[0, 0, 10, 10, 10, 0, 0, 10]]
    _ann(data, 101)["segmentation"] = bow_tie
    index = _build(_write(tmp_path, data))
    assert 101 in _kept_annotations(index)
    assert index.skip_counts.get("zero_area", 0) == 0
    h, w = 30, 50  # image 20
    theirs = mask_utils.area(mask_utils.merge(mask_utils.frPyObjects(bow_tie, h, w)))
    assert theirs > 0


def test_same_size_copy_keeping_the_mtime_rebuilds_the_cache(tmp_path: Path) -> None:
    import shutil

    data = _base()
    path = _write(tmp_path, data)
    cache = tmp_path / "cache"
    first = CocoIndex.build(path, tmp_path, cache_dir=cache)
    names = [c["name"] for c in data["categories"]]
    # Swap two category names: same file size; copy2 carries the old modification time over.
    data["categories"][0]["name"], data["categories"][1]["name"] = names[1], names[0]
    staged = _write(tmp_path, data, "staged.json")
    os.utime(staged, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    assert staged.stat().st_size == path.stat().st_size
    shutil.copy2(staged, path)
    again = CocoIndex.build(path, tmp_path, cache_dir=cache)
    assert not again.from_cache
    assert again.class_names[:2] == first.class_names[:2][::-1]


def _build_and_report(args: tuple[str, str, str]) -> bool:
    path, root, cache = args
    return CocoIndex.build(path, root, cache_dir=cache).from_cache


def test_processes_starting_together_build_the_cache_once(tmp_path: Path) -> None:
    # DDP ranks: one parses the JSON, the others wait on the lock and read its cache.
    import multiprocessing

    path = _write(tmp_path, _base())
    args = (str(path), str(tmp_path), str(tmp_path / "cache"))
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        from_cache = pool.map(_build_and_report, [args] * 3)
    assert sorted(from_cache) == [False, True, True]
