"""The COCO index on valid input: tables, crowd, RLE targets, coco-mini against pycocotools, images."""

from __future__ import annotations

import contextlib
import io
import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from _coco_cases import (
    _ann, _annotation_skips, _base, _build, _kept_annotations, _set, _square, _uncompressed_rle, _write, flat,
)
from _reference import reference_rasterize
from seg_datamodule.data.counts import SkipCounter
from seg_datamodule.io.coco import CocoIndex, format_skip_summary
from seg_datamodule.io.images.decode import BadImageError


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
    assert index.dropped_counts == {"crowd_dropped": 1, "image_empty_dropped": 2, "box_only": 0}
    assert index.num_crowd == 1 and index.crowd_mask(0) is not None
    no_crowd = _build(path, drop_crowd=True)
    assert no_crowd.num_crowd == 0 and len(no_crowd) == 4
    assert all(no_crowd.crowd_mask(i) is None for i in range(len(no_crowd)))
    assert no_crowd.dropped_counts == {"crowd_dropped": 2, "image_empty_dropped": 0, "box_only": 0}
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


def test_polygons_returns_fresh_arrays(tmp_path: Path) -> None:
    index = _build(_write(tmp_path, _base()))
    before = [a.copy() for a in flat(index, 0)]
    for array in flat(index, 0):
        array[...] = 0
    for a, b in zip(before, flat(index, 0)):
        np.testing.assert_array_equal(a, b)


def test_build_arguments_are_checked(tmp_path: Path) -> None:
    path = _write(tmp_path, _base())
    # The same words as every other entry point (ops.checks): the choices, then what was given.
    with pytest.raises(ValueError, match=r"on_bad_sample must be one of \['raise', 'skip'\], got 'ignore'"):
        _build(path, on_bad_sample="ignore")
    with pytest.raises(TypeError, match=r"on_bad_sample must be one of \['raise', 'skip'\], got True"):
        _build(path, on_bad_sample=True)
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


@pytest.mark.parametrize("split", ["train", "val"])
def test_coco_mini_counts(coco_mini: Path, tmp_path: Path, split: str) -> None:
    """The counts pycocotools reads from the same file (coco-mini train: 80 images, 731 instances and
    8 crowd regions; val: 79, 619 and 5)."""
    ann_file = coco_mini / "annotations" / f"instances_{split}2017.json"
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(ann_file))
    crowd = sum(a["iscrowd"] for a in coco.anns.values())
    index = CocoIndex.build(ann_file, coco_mini / f"{split}2017", cache_dir=tmp_path)
    assert (index.num_images, index.num_instances, index.num_crowd) == (len(coco.imgs), len(coco.anns) - crowd, crowd)
    assert crowd > 0 and index.num_instances > 0
    assert index.skip_counts == {} and index.num_classes == len(coco.cats) == 80


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
    assert seen == sum(a["iscrowd"] for a in mini_coco.anns.values()) > 0


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
    for i in sorted({0, len(mini_index) // 4, len(mini_index) - 1}):
        for a, b in zip(flat(back, i), flat(mini_index, i)):
            np.testing.assert_array_equal(a, b)
    # The index holds arrays and a few small containers only.
    assert all(isinstance(v, np.ndarray) for v in mini_index._t.values())
    assert len(mini_index._t) < 30



def test_coordinates_that_are_not_hundredths_stay_float64(tmp_path: Path) -> None:
    data = _base()
    ring = [1 / 3, 0.1, 9.123456789, 0.1, 5.5, 7.25]
    _set(101, "segmentation", [ring])(data)
    index = _build(_write(tmp_path, data))
    vertices = flat(index, 1)[0]
    assert np.array_equal(vertices[:3], np.reshape(ring, (-1, 2)))  # bit for bit


# --------------------------------------------------------------------------------------------
# Images through the index


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

