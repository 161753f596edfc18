"""Which splits setup refuses, on small generated data (issue 62): an Ultralytics split where no image has a label
file is refused with where labels were looked for, while images without a label file beside labelled ones are
backgrounds (Ultralytics' convention), kept and counted; a crowd-only evaluation split under ``drop_crowd`` has
nothing to score, and says so once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from seg_datamodule import COCOSegDataModule
from seg_datamodule.data.splits.scan import LabelsNotFoundError, NothingToLearnError, NothingToScoreError
from seg_datamodule.io.coco.crowd import CrowdShareWarning
from seg_datamodule.io.yolo.labels_hint import labels_not_found_hint, nearest_folder

#: A triangle of class 0, normalised (an Ultralytics polygon line).
TRIANGLE = "0 0.1 0.1 0.6 0.1 0.6 0.7\n"
SIZE = (48, 64)  # (H, W) of every generated image


def _image(path: Path, seed: int) -> None:
    """A random JPEG of :data:`SIZE` at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, (*SIZE, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, "JPEG", quality=90)


def _yolo(root: Path, labels: list[str | None]) -> Path:
    """``root/data.yaml`` whose train, val and test splits are one folder: image ``k`` with label text
    ``labels[k]`` (None: no label file at all). Returns the YAML."""
    for k, text in enumerate(labels):
        _image(root / "images" / "all" / f"{k + 1}.jpg", k)
        if text is not None:
            (root / "labels" / "all").mkdir(parents=True, exist_ok=True)
            (root / "labels" / "all" / f"{k + 1}.txt").write_text(text)
    yaml = root / "data.yaml"
    yaml.write_text(f"path: {root}\ntrain: images/all\nval: images/all\ntest: images/all\nnames: [a, b]\n")
    return yaml


def _dm(tmp_path: Path, **kwargs) -> COCOSegDataModule:
    return COCOSegDataModule(**{"image_size": 64, "batch_size": 2, "num_workers": 0, "persistent_workers": False,
                                "cache_dir": str(tmp_path / "cache"), **kwargs})


# ---------------------------------------------------------------------------------------- backgrounds


@pytest.mark.parametrize("stage", ["fit", "validate", "test"])
def test_images_without_a_label_file_beside_labelled_ones_are_kept_as_counted_backgrounds(tmp_path: Path,
                                                                                           stage: str) -> None:
    """Leaving a background's label file out is valid Ultralytics data: no split is refused for it."""
    yaml = _yolo(tmp_path / "yolo", [TRIANGLE, None, TRIANGLE + TRIANGLE.replace("0 ", "1 ", 1), None, ""])
    dm = _dm(tmp_path, dataset=str(yaml))
    dm.setup(stage)
    for split, scan in dm.sources.scans.items():
        assert (scan.images, scan.instances, scan.backgrounds, scan.labels_missing) == (5, 3, 3, 2), split
        assert "(3 backgrounds, 2 without a label file," in scan.line()
        index = dm.sources.split_index(split)
        assert index.source_counts["image_label_missing"] == 2 and index.source_counts["image_label_empty"] == 1
        assert index.instance_counts.tolist() == [1, 0, 2, 0, 0]  # the backgrounds stay, in their place


def test_missing_and_empty_label_files_have_nothing_to_learn_not_labels_not_found(tmp_path: Path) -> None:
    """Some label files exist (empty): the labels folder was found, so the error says why nothing is learned,
    not where labels were looked for."""
    yaml = _yolo(tmp_path / "yolo", [None, "", None, "\n"])
    with pytest.raises(NothingToLearnError) as caught:
        _dm(tmp_path, dataset=str(yaml), val_split=None).setup("fit")
    message = str(caught.value)
    assert message == (f"{yaml} [train]: no target instance to train on: 2 of its 4 images have no label file and "
                       "the others empty ones; every object would be learned as background. Negatives only on "
                       "purpose: allow_no_targets: true (--data.allow_no_targets true)")
    with pytest.raises(NothingToScoreError) as caught:
        _dm(tmp_path, dataset=str(yaml), train_split=None).setup("validate")
    assert str(caught.value).startswith(f"{yaml} [val]: no instance for COCO AP to score (val): 2 of its 4 images "
                                        "have no label file and the others empty ones; its AP would be -1")
    dm = _dm(tmp_path, dataset=str(yaml), allow_no_targets=True)
    dm.setup("fit")
    assert (dm.sources.scans["train"].labels_missing, dm.sources.scans["train"].backgrounds) == (2, 4)


@pytest.mark.parametrize(("stage", "split", "says"), [
    ("fit", "train", "so it would train on nothing; "),
    ("validate", "val", "so `validate` has nothing to score (a split without labels, as COCO's test-dev); "),
    ("test", "test", "so `test` has nothing to score (a split without labels, as COCO's test-dev); ")])
def test_no_label_file_at_all_is_refused_in_every_split_with_where_they_were_looked_for(
        tmp_path: Path, stage: str, split: str, says: str) -> None:
    root = tmp_path / "yolo"
    yaml = _yolo(root, [TRIANGLE, TRIANGLE, TRIANGLE])
    (root / "labels").rename(root / "LABELS")  # a case the close-name match alone would not find
    with pytest.raises(LabelsNotFoundError) as caught:
        _dm(tmp_path, dataset=str(yaml), **({"val_split": None} if split == "train" else {"train_split": None})
            ).setup(stage)
    message = str(caught.value)
    assert message.startswith(f"{yaml} [{split}]: none of its 3 images has a label file, {says}")
    hint = (f"{root / 'labels' / 'all' / '1.txt'} for {root / 'images' / 'all' / '1.jpg'}; {root} has no labels/ "
            "but has LABELS/: rename it labels")
    assert message.count(hint) == 1 and message.count("none of its") == 1


# ---------------------------------------------------------------------------------------- the hint


def test_the_hint_finds_a_folder_named_in_another_case_or_close_and_nothing_far(tmp_path: Path) -> None:
    expected = tmp_path / "labels" / "val" / "1.txt"
    for folder, near in (("LABELS", "LABELS"), ("Label", "Label"), ("lbls", "lbls"), ("annotations", None)):
        (tmp_path / folder).mkdir()
        assert nearest_folder(expected) == (tmp_path, "labels", None if near is None else tmp_path / near), folder
        (tmp_path / folder).rmdir()
    # A folder only named like "images" is not Ultralytics' /images/: the label file is beside the image.
    (tmp_path / "Labels").mkdir()
    assert labels_not_found_hint(str(tmp_path / "images_raw" / "val" / "1.jpg")).endswith(
        f"{tmp_path / 'images_raw' / 'val' / '1.txt'} for {tmp_path / 'images_raw' / 'val' / '1.jpg'} "
        "(no images folder in its path, so beside the image)")
    (tmp_path / "labels" / "val").mkdir(parents=True)
    assert labels_not_found_hint(str(tmp_path / "images" / "val" / "1.jpg")).endswith(
        f"; {tmp_path / 'labels' / 'val'} exists but holds no label file of this split's images")


# ---------------------------------------------------------------------------------------- crowd only


def _crowd_coco(root: Path, crowd: bool = True) -> tuple[Path, Path]:
    """(a COCO file of 3 images whose every annotation is a crowd polygon, its image folder)."""
    images, annotations = [], []
    for k in range(3):
        _image(root / "images" / f"{k + 1}.jpg", k)
        images.append({"id": k + 1, "file_name": f"{k + 1}.jpg", "height": SIZE[0], "width": SIZE[1]})
        for j in range(2):
            x = 4 + 20 * j
            annotations.append({"id": 10 * k + j + 1, "image_id": k + 1, "category_id": 1, "iscrowd": int(crowd),
                                "bbox": [x, 4, 12, 12], "area": 144.0,
                                "segmentation": [[x, 4, x + 12, 4, x + 12, 16, x, 16]]})
    ann = root / "crowd.json"
    ann.write_text(json.dumps({"images": images, "annotations": annotations,
                               "categories": [{"id": 1, "name": "thing"}]}))
    return ann, root / "images"


@pytest.mark.parametrize(("stage", "split"), [("validate", "val"), ("test", "test")])
def test_a_crowd_only_evaluation_split_under_drop_crowd_has_nothing_to_score(tmp_path: Path, stage: str,
                                                                             split: str) -> None:
    """Every region dropped: not an image-info file (a test split is refused too), and the message counts them."""
    ann, images = _crowd_coco(tmp_path)
    with pytest.warns(CrowdShareWarning) as warned, pytest.raises(NothingToScoreError) as caught:
        _dm(tmp_path, drop_crowd=True, **{f"{split}_ann": str(ann), f"{split}_images": str(images)}).setup(stage)
    assert len(warned) == 1
    message = str(caught.value)
    assert message.startswith(f"{ann}: no instance for COCO AP to score ({split}): all 6 of its annotations are "
                              "crowd regions (iscrowd=1)")
    assert message.count("crowd_as_instances: true") == 1 and message.endswith("allow_no_targets: true "
                                                                               "(--data.allow_no_targets true)")


def test_an_evaluation_split_without_annotations_is_refused_for_val_and_passed_for_test(tmp_path: Path) -> None:
    """An image-info file (COCO test-dev) is a test split by design, never a validation split."""
    ann, images = _crowd_coco(tmp_path)
    data = json.loads(ann.read_text())
    data["annotations"] = []
    ann.write_text(json.dumps(data))
    with pytest.raises(NothingToScoreError, match=r"no instance for COCO AP to score \(val\): it has no annotation;"):
        _dm(tmp_path, val_ann=str(ann), val_images=str(images)).setup("validate")
    dm = _dm(tmp_path, test_ann=str(ann), test_images=str(images))
    dm.setup("test")
    assert (dm.sources.scans["test"].images, dm.sources.scans["test"].instances) == (3, 0)


def test_drop_crowd_counts_every_crowd_region_with_those_of_images_left_out_as_bad(tmp_path: Path) -> None:
    """Image 1's only target is a bad polygon, so it is left out with its crowd region; the others' are dropped:
    every annotation of the file is counted once, and the refusal counts all six regions."""
    ann, images = _crowd_coco(tmp_path)
    data = json.loads(ann.read_text())
    data["annotations"].append({"id": 99, "image_id": 1, "category_id": 1, "iscrowd": 0, "bbox": [1, 1, 4, 4],
                                "area": 0.0, "segmentation": [[1.0, 1.0, 5.0, 5.0]]})  # two points
    ann.write_text(json.dumps(data))
    dm = _dm(tmp_path, drop_crowd=True, on_bad_sample="skip", val_ann=str(ann), val_images=str(images))
    with pytest.warns(UserWarning) as warned, pytest.raises(NothingToScoreError) as caught:
        dm.setup("validate")
    assert sorted(type(w.message).__name__ for w in warned) == ["CrowdShareWarning", "UserWarning"]
    assert sum("1 images were left out as bad" in str(w.message) for w in warned) == 1
    assert "no instance for COCO AP to score (val): all 6 of its annotations are crowd regions" in str(caught.value)
    index = dm.sources.split_index("val")
    assert len(index) == 2 and index.skip_counts == {"polygon_too_few_points": 1, "image_all_annotations_skipped": 1}
    assert index.dropped_counts["crowd_dropped"] == 6 and index.num_crowd == index.num_instances == 0
