"""The CVAT trap (issue 41): a file whose masks are all crowd RLE is named at setup, and
``crowd_as_instances`` trains on its regions as exact polygon instances, counted.

The export is made here from real COCO data (coco-mini, or the images that ship with the tests),
as CVAT's COCO export writes it: every mask as uncompressed RLE with ``iscrowd: 1``.
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from _reference import reference_rasterize
from seg_datamodule.data.splits.scan import NothingToLearnError
from seg_datamodule.io.coco import CocoIndex, IndexOptions
from seg_datamodule.io.coco import crowd
from seg_datamodule.io.coco.crowd import CrowdShareWarning, crowd_trap_message
from seg_datamodule.ops.raster import rasterize_polygons
from seg_datamodule.ops.rle import uncompressed_rle


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trap is warned once per file and process: each test starts with none warned."""
    monkeypatch.setattr(crowd, "_warned", set())


@pytest.fixture(scope="module")
def cvat_export(coco_mini: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """coco-mini val with every annotation a crowd region of uncompressed RLE (its own crowd ones kept)."""
    data = json.loads((coco_mini / "annotations" / "instances_val2017.json").read_text())
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(coco_mini / "annotations" / "instances_val2017.json"))
    for ann in data["annotations"]:
        if not ann["iscrowd"]:
            ann["segmentation"] = uncompressed_rle(coco.annToMask(coco.anns[ann["id"]]).astype(bool))
            ann["iscrowd"] = 1
    path = tmp_path_factory.mktemp("cvat") / "instances_default.json"
    path.write_text(json.dumps(data))
    return path


def _build(path: Path, images: Path, **options) -> CocoIndex:
    return CocoIndex.build(path, images, use_cache=False, **options)


def test_a_file_of_crowd_regions_is_named_once_with_the_share_and_the_fix(cvat_export: Path, coco_mini: Path) -> None:
    total = len(json.loads(cvat_export.read_text())["annotations"])
    with pytest.warns(CrowdShareWarning) as caught:
        index = _build(cvat_export, coco_mini / "val2017")
    assert len(caught) == 1 and index.num_instances == 0 and index.num_crowd == total
    message = str(caught[0].message)
    assert message.startswith(f"{cvat_export}: {total} of {total} annotations (100%) are crowd regions")
    assert "CVAT" in message and "crowd_as_instances: true" in message and "--crowd-as-instances" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error", CrowdShareWarning)
        _build(cvat_export, coco_mini / "val2017")  # once per file
        _build(cvat_export, coco_mini / "val2017", crowd_as_instances=True)
        _build(coco_mini / "annotations" / "instances_val2017.json", coco_mini / "val2017")  # a few crowds: quiet


def test_a_file_of_crowd_regions_is_named_with_drop_crowd_too(cvat_export: Path, coco_mini: Path) -> None:
    """``drop_crowd: true`` leaves every region out: the export trains on nothing, so it is still named,
    with its dropped regions counted in the share."""
    total = len(json.loads(cvat_export.read_text())["annotations"])
    with pytest.warns(CrowdShareWarning) as caught:
        index = _build(cvat_export, coco_mini / "val2017", drop_crowd=True)
    assert len(caught) == 1 and index.num_instances == 0 and index.num_crowd == 0
    assert str(caught[0].message).startswith(f"{cvat_export}: {total} of {total} annotations (100%) are crowd")


def test_the_share_that_is_named() -> None:
    assert crowd_trap_message("a.json", 10, 10) is None  # half: not most
    assert crowd_trap_message("a.json", 0, 0) is None
    assert "a.json: 11 of 20 annotations (55%)" in crowd_trap_message("a.json", 9, 11)


def test_crowd_as_instances_gives_exact_polygon_targets_counted(cvat_export: Path, coco_mini: Path) -> None:
    """Every region becomes a target of its image, in file order, with its label, id and box; its
    polygons filled at pixel centres (the training rasteriser, stride 1) are pycocotools' mask of
    the RLE bit for bit."""
    data = json.loads(cvat_export.read_text())
    index = _build(cvat_export, coco_mini / "val2017", crowd_as_instances=True)
    assert (index.num_instances, index.num_crowd) == (len(data["annotations"]), 0)
    assert index.dropped_counts == {"crowd_dropped": 0, "image_empty_dropped": 0, "box_only": 0,
                                    "crowd_as_instances": len(data["annotations"])}
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(cvat_export))
    label_of = index.label_of_category
    checked = 0
    for i, image_id in enumerate(index.image_ids.tolist()):
        anns = coco.imgToAnns[image_id]
        assert index.annotation_ids(i).tolist() == [a["id"] for a in anns]
        assert index.labels(i).tolist() == [label_of[a["category_id"]] for a in anns]
        np.testing.assert_array_equal(index.bboxes(i), np.array([a["bbox"] for a in anns]).reshape(-1, 4))
        polygons, size = index.polygons(i), index.image_size(i)
        masks = rasterize_polygons([polygons.instance(n) for n in range(len(anns))], size, 1)
        for mask, ann in zip(masks, anns):
            np.testing.assert_array_equal(mask, coco.annToMask(ann).astype(bool), err_msg=f"annotation {ann['id']}")
            checked += 1
    assert checked == len(data["annotations"]) > 50
    # And one small region against the independent full-grid crossing test.
    i, n = next((i, n) for i in range(len(index)) for n in range(len(index.annotation_ids(i)))
                if coco.anns[int(index.annotation_ids(i)[n])]["area"] < 2000)
    ann = coco.anns[int(index.annotation_ids(i)[n])]
    reference = reference_rasterize([index.polygons(i).instance(n)], index.image_size(i), 1)[0]
    np.testing.assert_array_equal(reference, coco.annToMask(ann).astype(bool))


def test_crowd_as_instances_and_drop_crowd_exclude_each_other() -> None:
    with pytest.raises(ValueError, match="crowd_as_instances=True .* drop_crowd=True"):
        IndexOptions(drop_crowd=True, crowd_as_instances=True)
    with pytest.raises(TypeError, match="crowd_as_instances"):
        IndexOptions(crowd_as_instances="yes")


@pytest.mark.slow
def test_the_datamodule_warns_at_setup_and_trains_on_the_regions(cvat_export: Path, coco_mini: Path) -> None:
    from seg_datamodule import COCOSegDataModule

    images = str(coco_mini / "val2017")
    plain = COCOSegDataModule(train_ann=str(cvat_export), train_images=images, image_size=128, batch_size=4,
                              num_workers=0, use_cache=False)
    with pytest.warns(CrowdShareWarning, match="crowd_as_instances: true"), \
            pytest.raises(NothingToLearnError, match="crowd_as_instances: true"):
        plain.setup("fit")  # the trap (nothing to train on) stops setup
    allowed = COCOSegDataModule(train_ann=str(cvat_export), train_images=images, image_size=128, batch_size=4,
                                num_workers=0, use_cache=False, allow_no_targets=True)
    allowed.setup("fit")
    assert sum(len(b.boxes) for b in allowed.train_dataloader()) == 0  # allowed on purpose: nothing to train on

    dm = COCOSegDataModule(train_ann=str(cvat_export), train_images=images, image_size=128, batch_size=4,
                           num_workers=0, use_cache=False, crowd_as_instances=True)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    crowd_ids = {a["id"] for a in json.loads(cvat_export.read_text())["annotations"]}
    delivered = {int(a) for b in batches for a in b.annotation_ids}
    assert delivered and delivered <= crowd_ids
    assert all(not b.ignore_masks.any() for b in batches)  # no region is ignored any more
    assert dm.skip_counts["train_index"]["crowd_as_instances"] == len(crowd_ids)
    assert f"train_index: {len(crowd_ids)} crowd regions converted to instances (crowd_as_instances)" in dm.report()


def test_convert_takes_crowd_as_instances(cvat_export: Path, coco_mini: Path, tmp_path: Path) -> None:
    pytest.importorskip("litdata")
    from seg_datamodule.io.stream.cli import convert_main

    total = len(json.loads(cvat_export.read_text())["annotations"])
    meta = convert_main([str(cvat_export), str(coco_mini / "val2017"), str(tmp_path / "chunks"),
                         "--crowd-as-instances", "--num-workers", "1"])
    assert meta["num_instances"] == total and meta["dropped_counts"]["crowd_as_instances"] == total
