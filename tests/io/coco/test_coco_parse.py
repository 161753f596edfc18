"""Bad input: each case in raise mode (message) and skip mode (count, nothing else lost)."""

from __future__ import annotations

import copy
import json
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _coco_cases import (
    Mutator, _ann, _annotation_skips, _base, _build, _delete, _image_skips, _kept_annotations, _set, _square, _write, flat,
)
from seg_datamodule.io.coco import BadAnnotationError, SKIP_REASONS
from seg_datamodule.io.coco.building import BoxOnlyError
from seg_datamodule.io.coco import parse as parse_module


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
    ("segmentation [[]]", _set(101, "segmentation", [[]]), "segmentation_empty", 101, 20, "b.jpg", 1),
    ("box-only with a zero box", lambda d: (_delete(101, "segmentation")(d), _set(101, "bbox", [1, 1, 0, 3])(d)),
     "bbox_non_positive", 101, 20, "b.jpg", 1),
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
    with caplog.at_level(logging.WARNING, logger="seg_datamodule.io.coco"):
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


@pytest.mark.parametrize("mode", ["raise", "skip"])
def test_box_only_annotations_are_dropped_and_counted_apart_in_either_mode(tmp_path: Path, mode: str) -> None:
    """A box without a mask (missing, null, "" or [] segmentation) is no bad entry: counted as box_only."""
    data = _base()
    _delete(101, "segmentation")(data)
    _set(102, "segmentation", None)(data)
    _set(105, "segmentation", [])(data)
    data["annotations"].append({**copy.deepcopy(_ann(data, 105)), "id": 106, "segmentation": ""})
    named = ("4 annotations in 2 images have a box and no mask (image id 10 (a.jpg): annotation id 102; "
             "image id 20 (b.jpg): annotation ids 101, 105, 106); 1 of those images would have no target left")
    with pytest.raises(BoxOnlyError, match=re.escape(named)):
        _build(_write(tmp_path, data), on_bad_sample=mode)  # the default: refused, never a bad entry
    index = _build(_write(tmp_path, data), on_bad_sample=mode, box_only="drop")
    assert index.skip_counts == {} and index.dropped_counts["box_only"] == 4
    kept = _kept_annotations(index)
    assert kept == {103, 104}
    # Every annotation is kept or counted once.
    assert index.num_instances + index.num_crowd + index.dropped_counts["box_only"] == len(data["annotations"])
    assert "box_only 4" in index.summary()


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
    # An image that lost every annotation is left out, counted apart (never trained as a background).
    assert index.skip_counts == {"polygon_too_few_points": 1, "bbox_non_positive": 1,
                                 "annotation_unknown_category_id": 1, "image_all_annotations_skipped": 1}
    assert "3 annotations" in index.skip_summary()
    assert index.num_instances == 1 and _kept_annotations(index) == {103, 104}


@pytest.mark.parametrize(
    "content, match",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "top level is a list"),
        (json.dumps({"images": [], "annotations": []}), "'categories' missing"),
        (json.dumps({"images": [], "categories": [], "annotations": {}}), "'annotations' missing or not a list"),
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
    monkeypatch.setattr(parse_module, "_CHUNK", 7)
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




def test_image_info_file_without_annotations_indexes(tmp_path: Path) -> None:
    # COCO test-dev's image_info_test-dev2017.json: images and categories, no "annotations" key.
    path = tmp_path / "image_info.json"
    path.write_text(json.dumps({
        "images": [{"id": 7, "file_name": "a.jpg", "height": 20, "width": 30},
                   {"id": 3, "file_name": "b.jpg", "height": 10, "width": 10}],
        "categories": [{"id": 5, "name": "x"}, {"id": 2, "name": "y"}],
    }))
    index = _build(path, on_bad_sample="raise")
    assert index.image_ids.tolist() == [7, 3] and index.num_instances == 0 and index.num_crowd == 0
    assert index.category_ids.tolist() == [2, 5] and index.skip_counts == {}
    assert index.labels(0).shape == (0,) and len(index.polygons(1)) == 0
