"""``box_only: raise | drop_images | drop | keep`` on the index (issue 41): every annotation is an instance or counted, one
cache serves both settings, and a kept box-only annotation is an instance without a ring and its box."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from seg_datamodule.io.coco import CocoIndex, IndexOptions
from seg_datamodule.io.coco.building import BoxOnlyError


def strip_segmentations(coco_mini: Path, out: Path, every: int = 4) -> tuple[Path, set[int]]:
    """coco-mini's val file with every ``every``-th non-crowd annotation made box-only (its
    segmentation removed, missing, ``[]`` or ``null`` in turn); returns the file and those ids."""
    data = json.loads((coco_mini / "annotations" / "instances_val2017.json").read_text())
    stripped = set()
    targets = [a for a in data["annotations"] if not a.get("iscrowd")]
    for k, ann in enumerate(targets[::every]):
        if k % 3 == 0:
            del ann["segmentation"]
        else:
            ann["segmentation"] = [] if k % 3 == 1 else None
        stripped.add(ann["id"])
    out.write_text(json.dumps(data))
    return out, stripped


def test_keep_and_drop_counts_add_up_and_share_one_cache(coco_mini: Path, tmp_path: Path) -> None:
    ann, stripped = strip_segmentations(coco_mini, tmp_path / "val.json")
    data = json.loads(ann.read_text())
    cache = tmp_path / "cache"
    drop = CocoIndex.build(ann, coco_mini / "val2017", cache_dir=cache, box_only="drop")
    keep = CocoIndex.build(ann, coco_mini / "val2017", cache_dir=cache, box_only="keep")
    images = CocoIndex.build(ann, coco_mini / "val2017", cache_dir=cache, box_only="drop_images")
    assert not drop.from_cache and keep.from_cache and images.from_cache  # one cache serves every setting
    total = len(data["annotations"])
    assert drop.dropped_counts["box_only"] == len(stripped) > 0 and keep.dropped_counts["box_only"] == 0
    for index in (drop, keep):
        assert index.skip_counts == {}
        assert index.num_instances + index.num_crowd + index.dropped_counts["box_only"] == total
    assert keep.num_instances == drop.num_instances + len(stripped)
    counts = images.dropped_counts
    assert counts["box_only"] == len(stripped) and counts["image_box_only_dropped"] == drop.source_counts["image_box_only"]
    assert images.num_instances + images.num_crowd + counts["box_only"] + counts["annotation_of_box_only_image"] == total
    with pytest.raises(BoxOnlyError, match=f"{len(stripped)} annotations in"):  # the default, from the same cache
        CocoIndex.build(ann, coco_mini / "val2017", cache_dir=cache)
    # drop: box-only annotations nowhere in the index.
    drop_ids = np.concatenate([drop.annotation_ids(i) for i in range(len(drop))])
    assert not set(drop_ids.tolist()) & stripped
    # Kept: an instance without a ring, with the JSON's label and box.
    by_id = {a["id"]: a for a in data["annotations"]}
    cat_index = {c: k for k, c in enumerate(keep.category_ids.tolist())}
    seen = set()
    for i in range(len(keep)):
        polygons, ids = keep.polygons(i), keep.annotation_ids(i)
        rings = np.diff(polygons.instance_offsets)
        for n, aid in enumerate(ids.tolist()):
            assert (rings[n] == 0) == (aid in stripped)
            if aid in stripped:
                seen.add(aid)
                np.testing.assert_array_equal(keep.bboxes(i)[n], by_id[aid]["bbox"])
                assert keep.labels(i)[n] == cat_index[by_id[aid]["category_id"]]
    assert seen == stripped


def test_raise_is_the_default_and_the_key_is_checked() -> None:
    assert IndexOptions().box_only == "raise"
    with pytest.raises(ValueError, match="box_only"):
        IndexOptions(box_only="maybe")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="box_only"):
        IndexOptions(box_only=True)  # type: ignore[arg-type]


def test_a_box_only_image_is_not_empty_when_kept(coco_mini: Path, tmp_path: Path) -> None:
    """``drop_empty`` leaves out an image whose only annotations are box-only under drop, not under keep."""
    data = json.loads((coco_mini / "annotations" / "instances_val2017.json").read_text())
    image_id = data["images"][0]["id"]
    for ann in data["annotations"]:
        if ann["image_id"] == image_id:
            ann["segmentation"], ann["iscrowd"] = [], 0
    ann_file = tmp_path / "val.json"
    ann_file.write_text(json.dumps(data))
    drop = CocoIndex.build(ann_file, coco_mini / "val2017", use_cache=False, drop_empty=True, box_only="drop")
    keep = CocoIndex.build(ann_file, coco_mini / "val2017", use_cache=False, drop_empty=True, box_only="keep")
    assert image_id not in drop.image_ids.tolist() and image_id in keep.image_ids.tolist()
