"""LVIS files in CocoIndex: v0.5 and v1 (coco_url) paths, no iscrowd, the federated label lists."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from seg_datamodule.io.coco import BadAnnotationError, CocoIndex
from seg_datamodule.io.coco.lvis_fields import coco_url_path, image_file_name
from _lvis import LVIS_VAL_100, load_json, write_images, write_v1


@pytest.fixture(scope="module")
def data() -> dict:
    return load_json()


def _check_against_json(index: CocoIndex, data: dict) -> None:
    """Every annotation kept, in its image, with its label; the lists as the JSON's labels."""
    label_of = {c: k for k, c in enumerate(sorted(c["id"] for c in data["categories"]))}
    assert index.num_instances == len(data["annotations"]) == 977 and index.num_crowd == 0
    assert index.skip_counts == {} and len(index) == 100
    by_image: dict[int, list] = {}
    for ann in data["annotations"]:
        by_image.setdefault(ann["image_id"], []).append(ann)
    for img in data["images"]:
        i = index.index_of_image_id(img["id"])
        anns = by_image.get(img["id"], [])
        assert index.annotation_ids(i).tolist() == [a["id"] for a in anns]
        assert index.labels(i).tolist() == [label_of[a["category_id"]] for a in anns]
        assert index.neg_labels(i).tolist() == sorted(label_of[c] for c in img["neg_category_ids"])
        assert index.not_exhaustive_labels(i).tolist() == sorted(
            label_of[c] for c in img["not_exhaustive_category_ids"])


def test_v05_file_indexes_every_annotation_with_its_lists(data: dict, tmp_path: Path) -> None:
    index = CocoIndex.build(LVIS_VAL_100, tmp_path, use_cache=False)
    _check_against_json(index, data)
    assert index.file_name(0) == data["images"][0]["file_name"]  # file_name wins when present
    assert sum(len(index.neg_labels(i)) for i in range(len(index))) > 0


def test_v1_file_takes_paths_from_coco_url_and_reads_the_images(data: dict, tmp_path: Path) -> None:
    ann = write_v1(tmp_path / "lvis_v1.json")
    index = CocoIndex.build(ann, tmp_path / "coco", use_cache=False)
    _check_against_json(index, data)
    for i, img in enumerate(data["images"]):
        assert index.file_name(i) == "val2017/" + img["coco_url"].rsplit("/", 1)[1]
    write_images(load_json(ann), tmp_path / "coco", from_url=True)
    assert index.load_image(3).shape == (*index.image_size(3), 3)


def test_the_cache_keeps_the_lists_and_drop_empty_keeps_them_aligned(data: dict, tmp_path: Path) -> None:
    ann = write_v1(tmp_path / "lvis_v1.json")
    built = CocoIndex.build(ann, tmp_path, cache_dir=tmp_path / "cache")
    cached = CocoIndex.build(ann, tmp_path, cache_dir=tmp_path / "cache")
    assert not built.from_cache and cached.from_cache and cached == built
    dropped = CocoIndex.build(ann, tmp_path, cache_dir=tmp_path / "cache", drop_empty=True)
    assert 0 < len(dropped) < len(built)
    for i in range(len(dropped)):
        j = built.index_of_image_id(int(dropped.image_ids[i]))
        assert np.array_equal(dropped.neg_labels(i), built.neg_labels(j))
        assert np.array_equal(dropped.not_exhaustive_labels(i), built.not_exhaustive_labels(j))
        assert dropped.file_name(i) == built.file_name(j)


def test_a_coco_file_has_empty_lists(tmp_path: Path) -> None:
    coco = {"images": [{"id": 1, "file_name": "a.jpg", "height": 10, "width": 10}],
            "annotations": [{"id": 5, "image_id": 1, "category_id": 3, "bbox": [1, 1, 4, 4], "area": 16.0,
                             "segmentation": [[1, 1, 5, 1, 5, 5]], "iscrowd": 0}],
            "categories": [{"id": 3, "name": "x"}]}
    (tmp_path / "c.json").write_text(json.dumps(coco))
    index = CocoIndex.build(tmp_path / "c.json", tmp_path, use_cache=False)
    assert index.neg_labels(0).tolist() == [] and index.not_exhaustive_labels(0).tolist() == []


def test_coco_url_paths() -> None:
    assert coco_url_path("http://images.cocodataset.org/train2017/000000391895.jpg") == (
        "train2017/000000391895.jpg", None)
    assert coco_url_path("http://host/a/b%20c.jpg") == ("a/b c.jpg", None)
    assert coco_url_path("http://host/x.jpg")[0] is None
    assert coco_url_path("http://host/a/")[0] is None
    # file_name wins; a null file_name falls back to coco_url.
    assert image_file_name({"file_name": "f.jpg", "coco_url": "http://h/a/b.jpg"})[0] == "f.jpg"
    assert image_file_name({"file_name": None, "coco_url": "http://h/a/b.jpg"})[0] == "a/b.jpg"


@pytest.mark.parametrize(("url", "reason", "phrase"), [
    ("http://images.cocodataset.org/../..", "image_unsafe_file_name", "leaves the image root"),
    ("http://h/val2017/%2e%2e/%2e%2e", "image_unsafe_file_name", "leaves the image root"),
    ("http://h/a%00/b.jpg", "image_unsafe_file_name", "NUL"),
    ("http://h/000000391895.jpg", "image_bad_entry", "no '<folder>/<file>'"),
    (17, "image_bad_entry", "coco_url is not a non-empty string"),
])
def test_a_bad_coco_url_is_refused_like_a_bad_file_name(tmp_path: Path, url, reason: str, phrase: str,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    data = load_json()
    for img in data["images"]:
        img.pop("file_name")
    victim = data["images"][5]
    victim["coco_url"] = url
    lost = sum(a["image_id"] == victim["id"] for a in data["annotations"])
    ann = tmp_path / "bad.json"
    ann.write_text(json.dumps(data))
    with pytest.raises(BadAnnotationError, match=phrase) as err:
        CocoIndex.build(ann, tmp_path, use_cache=False)
    assert str(victim["id"]) in str(err.value) and err.value.reason == reason
    with caplog.at_level(logging.WARNING):
        index = CocoIndex.build(ann, tmp_path, use_cache=False, on_bad_sample="skip")
    assert len(index) == 99 and index.skip_counts[reason] == 1
    assert index.num_instances + index.skip_counts.get("annotation_of_skipped_image", 0) == 977
    assert index.skip_counts.get("annotation_of_skipped_image", 0) == lost


def test_an_unknown_category_in_neg_category_ids_is_named(tmp_path: Path) -> None:
    data = load_json()
    data["images"][2]["neg_category_ids"] = [1, 999999]
    data["images"][4]["not_exhaustive_category_ids"] = "all"
    ann = tmp_path / "bad.json"
    ann.write_text(json.dumps(data))
    with pytest.raises(BadAnnotationError, match="neg_category_ids holds \\[999999\\]") as err:
        CocoIndex.build(ann, tmp_path, use_cache=False)
    assert str(data["images"][2]["id"]) in str(err.value)
    index = CocoIndex.build(ann, tmp_path, use_cache=False, on_bad_sample="skip")
    assert index.skip_counts["image_bad_entry"] == 2 and len(index) == 98
