"""COCOSegDataModule over an Ultralytics data.yaml: the same batches as the same polygons in a COCO JSON, the keys,
the ground truth each stage is scored on, and a streamed split with turned photos."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from _yolo import coco_of_yolo_split, rotate_with_exif, write_data_yaml, write_yolo_split
from seg_datamodule import COCOSegDataModule, DetectionBatch
from seg_datamodule.data.splits.scan import LabelsNotFoundError
from seg_datamodule.io.yolo import DatasetYamlError

FIELDS = ("images", "boxes", "labels", "masks", "boxes_per_image", "image_ids", "annotation_ids", "ignore_masks",
          "scales", "pads", "orig_sizes")


@pytest.fixture(scope="module")
def both(coco_mini: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(data.yaml, the COCO JSON of the same polygons and ids, the image folder) of 16 coco-mini val images."""
    root = tmp_path_factory.mktemp("yolo")
    names = write_yolo_split(coco_mini / "annotations/instances_val2017.json", coco_mini / "val2017", root, "val",
                             limit=16)
    yaml = write_data_yaml(root, names, train="images/val", val="images/val", test="images/val")
    ann = root / "same.json"
    ann.write_text(json.dumps(coco_of_yolo_split(root, "val", names)))
    return yaml, ann, root / "images" / "val"


def _dm(tmp_path: Path, **kwargs) -> COCOSegDataModule:
    defaults = dict(image_size=160, batch_size=4, val_batch_size=4, num_workers=0, seed=5, copy_paste=0.5,
                    mixup=0.3, cache_dir=str(tmp_path / "cache"))
    return COCOSegDataModule(**(defaults | kwargs))


def _batches(loader, n: int) -> list[DetectionBatch]:
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            break
    return out


def _assert_identical(a: list[DetectionBatch], b: list[DetectionBatch]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        for name in FIELDS:
            assert torch.equal(getattr(x, name), getattr(y, name)), name
        assert x.counts == y.counts


def test_a_data_yaml_and_a_coco_json_of_the_same_polygons_give_identical_batches(both, tmp_path: Path) -> None:
    yaml, ann, images = both
    coco = _dm(tmp_path, train_ann=str(ann), train_images=str(images), val_ann=str(ann), val_images=str(images))
    yolo = _dm(tmp_path, dataset=str(yaml))
    coco.setup("fit")
    yolo.setup("fit")
    assert yolo.num_classes == coco.num_classes == 80 and yolo.category_ids == coco.category_ids
    np.testing.assert_array_equal(yolo.train_index.image_ids, coco.train_index.image_ids)
    # Mosaic, copy-paste and MixUp draw from the same generators over the same polygons: bit for bit.
    _assert_identical(_batches(yolo.train_dataloader(), 3), _batches(coco.train_dataloader(), 3))
    _assert_identical(_batches(yolo.val_dataloader(), 2), _batches(coco.val_dataloader(), 2))


def test_each_stage_is_scored_on_a_coco_ground_truth(both, tmp_path: Path) -> None:
    from pycocotools.coco import COCO

    yaml, ann, images = both
    dm = _dm(tmp_path, dataset=str(yaml), val_split="val", test_split="test")
    dm.setup("validate")
    path = dm.evaluation_file("validate")
    assert path is not None and Path(path).parent == tmp_path / "cache" / "ground_truth"
    gt, same = COCO(path), COCO(str(ann))
    assert sorted(gt.getImgIds()) == sorted(same.getImgIds()) and len(gt.anns) == len(same.anns)
    for a in same.anns.values():
        b = gt.anns[a["id"]]
        assert (b["image_id"], b["category_id"], b["segmentation"]) == (a["image_id"], a["category_id"],
                                                                        a["segmentation"])
    assert dm.evaluation_file("test") is None  # not set up yet
    dm.setup("test")
    assert dm.evaluation_file("test") == path  # the same split, the same content, the same file
    coco = _dm(tmp_path, train_ann=str(ann), train_images=str(images), val_ann=str(ann), val_images=str(images))
    assert coco.evaluation_file("fit") == str(ann) and coco.evaluation_file("test") is None


def test_keys_that_contradict_are_named(both, tmp_path: Path) -> None:
    yaml, ann, images = both
    with pytest.raises(ValueError, match="give dataset .* or train_ann / val_ann, not both"):
        _dm(tmp_path, dataset=str(yaml), train_ann=str(ann), train_images=str(images), val_ann=str(ann),
            val_images=str(images))
    with pytest.raises(ValueError, match="set train_split to null"):
        _dm(tmp_path, dataset=str(yaml), train_stream=str(tmp_path))
    with pytest.raises(TypeError, match="val_split must be a split name"):
        _dm(tmp_path, dataset=str(yaml), val_split=3)
    dm = _dm(tmp_path, dataset=str(yaml), val_split="validation")
    with pytest.raises(DatasetYamlError, match=r"no split 'validation' \(splits: train, val, test\)"):
        dm.setup("fit")


def test_the_index_check_key_is_checked_and_forwarded(both, tmp_path: Path) -> None:
    yaml, _, _ = both
    with pytest.raises(ValueError, match=r"index_check must be one of \['files', 'folders'\], got 'dirs'"):
        _dm(tmp_path, dataset=str(yaml), index_check="dirs")
    for _ in range(2):
        dm = _dm(tmp_path, dataset=str(yaml), index_check="folders", train_split=None, test_split=None)
        dm.setup("validate")
    assert dm.index_options.index_check == "folders" and dm.val_index.from_cache and len(dm.val_dataset) == 16


def test_validate_alone_needs_no_training_split(both, tmp_path: Path) -> None:
    yaml, _, _ = both
    dm = _dm(tmp_path, dataset=str(yaml), train_split=None, test_split=None)
    dm.setup("validate")
    assert dm.train_index is None and dm.num_classes == 80 and len(dm.val_dataset) == 16
    assert dm.class_names[:2] == ["person", "bicycle"]
    with pytest.raises(ValueError, match="fit needs .* train_split"):
        dm.train_dataloader()


def test_test_and_validate_read_the_data_yamls_splits_by_default(both, tmp_path: Path) -> None:
    """``test`` scores the data.yaml's ``test:`` split with no key set (the shipped config's default too)."""
    yaml, _, _ = both
    dm = _dm(tmp_path, dataset=str(yaml))
    dm.setup("test")
    assert dm.test_index is not None and len(dm.test_dataset) == 16 and dm.test_index.num_instances > 0
    assert dm.evaluation_file("test") is not None
    config = (Path(__file__).resolve().parents[2] / "configs" / "yolo11n_seg_data_yaml.yaml").read_text()
    assert "  test_split: test  #" in config and "  val_split: val\n" in config


@pytest.mark.parametrize("split", ["test", "val"])
def test_a_split_without_labels_is_one_line_naming_the_key_to_score_another(split: str, both,
                                                                             tmp_path: Path) -> None:
    """A ``test:`` of images without label files (COCO's test-dev, as Ultralytics' coco.yaml names it)."""
    from seg_datamodule.cli_errors import one_line

    yaml, _, images = both
    dev = tmp_path / "dataset"
    (dev / "images" / "test-dev").mkdir(parents=True)
    for image in sorted(images.iterdir())[:5]:
        (dev / "images" / "test-dev" / image.name).symlink_to(image.resolve())
    (dev / "data.yaml").write_text(yaml.read_text().replace(f"path: {yaml.parent}", f"path: {dev}")
                                   .replace("train: images/val", f"train: {images}")
                                   .replace("val: images/val",
                                            "val: images/test-dev" if split == "val" else f"val: {images}")
                                   .replace("test: images/val", "test: images/test-dev"))
    dm = _dm(tmp_path, dataset=str(dev / "data.yaml"))
    stage = "test" if split == "test" else "validate"
    with pytest.raises(LabelsNotFoundError) as info:
        dm.setup(stage)
    message = str(info.value)
    assert "\n" not in message
    shown = one_line(message)  # as the CLI prints it (bounded): the remedy comes before the paths
    assert shown.startswith(f"{dev / 'data.yaml'} [{split}]: none of its 5 images has a label file, so `{stage}` "
                              "has nothing to score (a split without labels, as COCO's test-dev); score a split with "
                              "labels: ")
    assert ("--data.test_split val." if split == "test" else "--data.val_split SPLIT, one with labels") in shown
    assert str(dev / "labels" / "test-dev") in message  # where labels were looked for, should it have them
    if split == "test":  # fit and validate never read it
        _dm(tmp_path, dataset=str(dev / "data.yaml")).setup("validate")


def test_a_streamed_split_decodes_turned_photos_as_the_index_does(both, tmp_path: Path) -> None:
    pytest.importorskip("litdata")
    from seg_datamodule.io.stream import convert_yolo, read_stream_meta, window_from_meta
    from seg_datamodule.io.stream.records import record_from_index
    from seg_datamodule.io.yolo import build_yolo_index

    yaml, _, images = both
    root = tmp_path / "turned"
    (root / "images/val").mkdir(parents=True)
    (root / "labels").mkdir()
    source = sorted(images.iterdir())[:3]
    for k, image in enumerate(source):
        target = root / "images/val" / image.name
        if k == 1:
            rotate_with_exif(image.resolve(), target, 6)
        else:
            target.symlink_to(image.resolve())
    (root / "labels/val").symlink_to(yaml.parent / "labels/val")
    turned = write_data_yaml(root, [str(n) for n in range(80)], val="images/val")
    meta = convert_yolo(turned, "val", str(tmp_path / "chunks"))
    assert meta["orientations"] == [1, 6, 1] and read_stream_meta(str(tmp_path / "chunks"))["orientations"] == [1, 6, 1]
    index = build_yolo_index(turned, "val", use_cache=False)
    window = window_from_meta(meta)
    window.bind([record_from_index(index, i, Path(index.file_path(i)).read_bytes()) for i in range(3)])
    for i in range(3):
        for reduce in (1, 2):
            np.testing.assert_array_equal(window.load_image(i, reduce), index.load_image(i, reduce))
    from PIL import Image

    with Image.open(source[1]) as original:
        assert index.image_size(1) == original.size[::-1]  # (H, W) as the original shows
