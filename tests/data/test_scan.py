"""No silent traps in a user's data (issue 49), on real images in both layouts: a scan line per split at setup,
box-only objects never trained as background by surprise, a split with nothing to learn or score stopped at setup,
and crowd_as_instances applied to the evaluation's ground truth as it is to training."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from _yolo import write_data_yaml, write_yolo_split
from seg_datamodule import COCOSegDataModule
from seg_datamodule.data.splits.scan import (SCAN_FILE, LabelsNotFoundError, NothingToScoreError, NothingToLearnError,
                                      scan_index)
from seg_datamodule.io.coco import CocoIndex
from seg_datamodule.io.coco.building import BoxOnlyError
from seg_datamodule.io.yolo import build_yolo_index
from seg_datamodule.io.yolo.labels_hint import labels_not_found_hint, nearest_folder
from seg_datamodule.ops.rle import uncompressed_rle

S = 128
VAL = "annotations/instances_val2017.json"


def _dm(tmp_path: Path, **kwargs) -> COCOSegDataModule:
    return COCOSegDataModule(**{"image_size": S, "batch_size": 4, "num_workers": 0, "persistent_workers": False,
                                "cache_dir": str(tmp_path / "cache"), **kwargs})


def _yolo(coco_mini: Path, root: Path, limit: int | None = 24) -> Path:
    names = write_yolo_split(coco_mini / VAL, coco_mini / "val2017", root, "val", limit=limit)
    return write_data_yaml(root, names, train="images/val", val="images/val")


def _as_boxes(label: Path) -> int:
    """Rewrite a label file's polygon lines as box lines (``class cx cy w h``); returns how many."""
    lines = []
    for line in label.read_text().split("\n"):
        if line.strip():
            cls, *coords = line.split()
            xy = np.asarray(coords, np.float64).reshape(-1, 2)
            (x0, y0), (x1, y1) = xy.min(0), xy.max(0)
            values = (float(x0 + x1) / 2, float(y0 + y1) / 2, float(x1 - x0), float(y1 - y0))
            lines.append(" ".join([cls, *map(repr, values)]))
    label.write_text("\n".join(lines) + "\n")
    return len(lines)


def _subset(coco_mini: Path, out: Path, n: int = 12, crowd: bool = False, annotations: bool = True) -> Path:
    """The first ``n`` val images (by id) as a COCO file; ``crowd``: every mask exported as crowd RLE (CVAT)."""
    data = json.loads((coco_mini / VAL).read_text())
    ids = sorted(im["id"] for im in data["images"])[:n]
    data["images"] = [im for im in data["images"] if im["id"] in ids]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] in ids] if annotations else []
    if crowd:
        with contextlib.redirect_stdout(io.StringIO()):
            coco = COCO(str(coco_mini / VAL))
        for ann in data["annotations"]:
            if not ann["iscrowd"]:
                ann["segmentation"] = uncompressed_rle(coco.annToMask(coco.anns[ann["id"]]).astype(bool))
                ann["iscrowd"] = 1
    out.write_text(json.dumps(data))
    return out


# ---------------------------------------------------------------------------------------- the scan line


def test_the_scan_line_is_said_at_setup_with_the_counts_of_the_file(coco_mini: Path, tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    data = json.loads((coco_mini / VAL).read_text())
    annotated = {a["image_id"] for a in data["annotations"]}
    crowd = sum(bool(a["iscrowd"]) for a in data["annotations"])
    dm = _dm(tmp_path, val_ann=str(coco_mini / VAL), val_images=str(coco_mini / "val2017"))
    with caplog.at_level(logging.INFO):
        dm.setup("validate")
    scan = dm.sources.scans["val"]
    # Reference: the JSON itself.
    assert (scan.images, scan.backgrounds) == (len(data["images"]), len(data["images"]) - len(annotated))
    assert (scan.instances, scan.crowd) == (len(data["annotations"]) - crowd, crowd)
    assert scan.crowd_share == pytest.approx(crowd / len(data["annotations"]))
    assert (scan.box_only_images, scan.bad_images, scan.left_out) == (0, 0, {})
    said = [r.getMessage() for r in caplog.records if "what each split holds" in r.getMessage()]
    assert len(said) == 1 and scan.line() in said[0]
    assert said[0].splitlines()[1].startswith(f"val {coco_mini / VAL}: {len(data['images'])} images (")
    dm.setup("validate")  # once per split
    assert sum("what each split holds" in r.getMessage() for r in caplog.records) == 1


def test_a_fit_writes_the_scans_and_where_the_annotations_went_to_the_run_folder(coco_mini: Path,
                                                                                  tmp_path: Path) -> None:
    from seg_datamodule.models import YolactLite

    ann = _subset(coco_mini, tmp_path / "val12.json")
    images = str(coco_mini / "val2017")
    dm = _dm(tmp_path, train_ann=str(ann), train_images=images, val_ann=str(ann), val_images=images)
    logger = CSVLogger(str(tmp_path / "runs"), name="scan")
    trainer = Trainer(max_steps=2, limit_val_batches=1, num_sanity_val_steps=0, logger=logger, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, accelerator="cpu")
    trainer.fit(YolactLite(num_classes=dm.num_classes, num_prototypes=8, width=8), datamodule=dm)
    saved = json.loads((Path(logger.log_dir) / SCAN_FILE).read_text())
    assert set(saved["splits"]) == {"train", "val"}
    assert saved["splits"]["train"]["line"] == dm.sources.scans["train"].line()
    assert saved["where_the_annotations_went"] == dm.skip_counts
    assert saved["splits"]["val"]["instances"] == sum(not a["iscrowd"] for a in json.loads(ann.read_text())["annotations"])
    assert dm.sources.scans["train"].line() in dm.report()


# ---------------------------------------------------------------------------------------- box-only labels


def test_a_box_only_label_file_stops_setup_naming_it_and_the_choices(coco_mini: Path, tmp_path: Path) -> None:
    yaml = _yolo(coco_mini, tmp_path / "yolo")
    label = sorted((tmp_path / "yolo" / "labels" / "val").glob("*.txt"))[3]
    boxes = _as_boxes(label)
    dm = _dm(tmp_path, dataset=str(yaml))
    with pytest.raises(BoxOnlyError) as caught:
        dm.setup("fit")
    message = str(caught.value)
    assert message.startswith(f"{yaml} [train]: {boxes} annotation{'s' * (boxes != 1)} in 1 image ")
    assert f"{label}: {boxes} box line{'s' * (boxes != 1)} of {boxes}" in message
    assert "learned as background" in message
    for choice in ("drop_images", "keep", "drop", "--data.box_only"):
        assert choice in message


def test_drop_images_leaves_the_image_out_counted_and_never_trains_it(coco_mini: Path, tmp_path: Path) -> None:
    yaml = _yolo(coco_mini, tmp_path / "yolo")
    labels = sorted((tmp_path / "yolo" / "labels" / "val").glob("*.txt"))
    boxes = _as_boxes(labels[3])
    plain = build_yolo_index(yaml, "val", use_cache=False, box_only="drop")
    dm = _dm(tmp_path, dataset=str(yaml), box_only="drop_images", mosaic=0.0)
    dm.setup("fit")
    index = dm.train_index
    names = [index.file_name(i) for i in range(len(index))]
    assert f"{labels[3].stem}.jpg" not in names and len(names) == len(labels) - 1
    assert index.dropped_counts["image_box_only_dropped"] == 1 and index.dropped_counts["box_only"] == boxes
    assert index.num_instances == plain.num_instances  # the other images' instances, all of them
    scan = dm.sources.scans["train"]
    assert scan.box_only_images == 1 and scan.left_out == {"box_only": boxes, "image_box_only_dropped": 1}
    dropped_id = int(labels[3].stem)
    for batch in dm.train_dataloader():
        assert dropped_id not in batch.image_ids.tolist()


def test_coco_box_only_annotations_are_named_by_image_and_annotation_id(coco_mini: Path, tmp_path: Path) -> None:
    data = json.loads(_subset(coco_mini, tmp_path / "s.json").read_text())
    first = min(data["images"], key=lambda im: im["id"])
    mine = [a for a in data["annotations"] if a["image_id"] == first["id"] and not a["iscrowd"]]
    for a in mine[:2]:
        a["segmentation"] = []
    ann = tmp_path / "box.json"
    ann.write_text(json.dumps(data))
    with pytest.raises(BoxOnlyError) as caught:
        CocoIndex.build(ann, coco_mini / "val2017", use_cache=False)
    ids = ", ".join(str(a["id"]) for a in mine[:2])
    assert f"image id {first['id']} ({first['file_name']}): annotation ids {ids}" in str(caught.value)
    kept = CocoIndex.build(ann, coco_mini / "val2017", use_cache=False, box_only="drop_images")
    assert first["id"] not in kept.image_ids.tolist()
    counts = kept.dropped_counts
    # Every annotation is in the index or counted with its reason.
    assert kept.num_instances + kept.num_crowd + counts["box_only"] + counts["annotation_of_box_only_image"] == len(
        data["annotations"])
    assert counts["box_only"] == 2 and counts["image_box_only_dropped"] == 1


# ---------------------------------------------------------------------------------------- nothing to learn


def test_a_renamed_labels_folder_stops_setup_naming_where_labels_were_looked_for(coco_mini: Path,
                                                                                  tmp_path: Path) -> None:
    root = tmp_path / "yolo"
    yaml = _yolo(coco_mini, root)
    (root / "labels").rename(root / "Labels")
    first = sorted((root / "images" / "val").iterdir())[0]
    with pytest.raises(LabelsNotFoundError) as caught:
        _dm(tmp_path, dataset=str(yaml)).setup("fit")
    message = str(caught.value)
    assert message.startswith(f"{yaml} [train]: none of its 24 images has a label file")
    assert f"{root / 'labels' / 'val' / first.stem}.txt for {first}" in message
    assert f"{root} has no labels/ but has Labels/: rename it labels" in message
    assert "allow_no_targets" in message
    # Chosen on purpose: through, and the scan says why it trains on nothing.
    dm = _dm(tmp_path, dataset=str(yaml), allow_no_targets=True)
    dm.setup("fit")
    assert dm.sources.scans["train"].labels_missing == 24 and dm.sources.scans["train"].instances == 0


def test_nearest_folder_matches_case_then_close_names(tmp_path: Path) -> None:
    (tmp_path / "Labels").mkdir()
    (tmp_path / "other").mkdir()
    assert nearest_folder(tmp_path / "labels" / "val" / "1.txt") == (tmp_path, "labels", tmp_path / "Labels")
    (tmp_path / "Labels").rename(tmp_path / "label")
    assert nearest_folder(tmp_path / "labels" / "val" / "1.txt")[2] == tmp_path / "label"
    (tmp_path / "label").rename(tmp_path / "annotations")
    assert nearest_folder(tmp_path / "labels" / "val" / "1.txt") == (tmp_path, "labels", None)
    (tmp_path / "labels" / "train").mkdir(parents=True)
    hint = labels_not_found_hint(str(tmp_path / "images" / "val" / "1.jpg"))
    assert hint.endswith(f"{tmp_path / 'labels'} has no folder val/")
    assert "beside the image" in labels_not_found_hint(str(tmp_path / "pics" / "1.jpg"))


def test_a_train_file_of_crowd_regions_stops_setup_and_crowd_as_instances_trains(coco_mini: Path,
                                                                                   tmp_path: Path) -> None:
    ann = _subset(coco_mini, tmp_path / "cvat.json", crowd=True)
    total = len(json.loads(ann.read_text())["annotations"])
    images = str(coco_mini / "val2017")
    with pytest.warns(UserWarning), pytest.raises(NothingToLearnError) as caught:
        _dm(tmp_path, train_ann=str(ann), train_images=images).setup("fit")
    message = str(caught.value)
    assert message.startswith(f"{ann}: no target instance to train on: all {total} of its annotations are crowd")
    assert "crowd_as_instances: true" in message and "allow_no_targets: true" in message
    dm = _dm(tmp_path, train_ann=str(ann), train_images=images, crowd_as_instances=True, mosaic=0.0)
    dm.setup("fit")
    assert dm.sources.scans["train"].instances == dm.sources.scans["train"].converted == total
    assert sum(len(b.labels) for b in dm.train_dataloader()) > 0
    report = dm.report()
    assert f"train_index: {total} crowd regions converted to instances (crowd_as_instances); nothing skipped" in report
    assert "trained as instances" in report


def test_a_file_without_annotations_has_nothing_to_learn(coco_mini: Path, tmp_path: Path) -> None:
    ann = _subset(coco_mini, tmp_path / "none.json", annotations=False)
    with pytest.raises(NothingToLearnError, match="it has no annotation"):
        _dm(tmp_path, train_ann=str(ann), train_images=str(coco_mini / "val2017")).setup("fit")
    # As a test split it is an image-info file (COCO test-dev): not scored, by design, and not refused.
    dm = _dm(tmp_path, test_ann=str(ann), test_images=str(coco_mini / "val2017"))
    dm.setup("test")
    assert dm.sources.scans["test"].instances == 0


def test_all_boxes_dropped_on_purpose_still_has_nothing_to_learn(coco_mini: Path, tmp_path: Path) -> None:
    root = tmp_path / "yolo"
    yaml = _yolo(coco_mini, root, limit=3)
    total = sum(_as_boxes(label) for label in (root / "labels" / "val").glob("*.txt"))
    with pytest.raises(NothingToLearnError, match=f"all {total} of its annotations are boxes without a mask"):
        _dm(tmp_path, dataset=str(yaml), box_only="drop").setup("fit")


# ---------------------------------------------------------------------------------------- evaluation


def test_a_crowd_only_validation_file_is_named_at_setup_and_scored_with_crowd_as_instances(
        coco_mini: Path, tmp_path: Path) -> None:
    ann = _subset(coco_mini, tmp_path / "cvat.json", crowd=True)
    images = str(coco_mini / "val2017")
    with pytest.warns(UserWarning), pytest.raises(NothingToScoreError) as caught:
        _dm(tmp_path, val_ann=str(ann), val_images=images).setup("validate")
    assert "no instance for COCO AP to score (val)" in str(caught.value)
    assert "crowd_as_instances: true" in str(caught.value) and "-1" in str(caught.value)

    dm = _dm(tmp_path, val_ann=str(ann), val_images=images, crowd_as_instances=True)
    dm.setup("validate")
    scored = dm.evaluation_file("validate")
    assert scored != str(ann)
    truth = json.loads(Path(scored).read_text())
    assert truth["annotations"] and not any(a["iscrowd"] for a in truth["annotations"])
    # Independent reference: pycocotools scores the ground truth given back as results AP 1, where the
    # file as exported scores -1 (nothing but crowd regions to match).
    results = [{"image_id": a["image_id"], "category_id": a["category_id"], "score": 1.0,
                "segmentation": mask_utils.frPyObjects(a["segmentation"], *a["segmentation"]["size"])}
               for a in json.loads(ann.read_text())["annotations"]]
    for path, expected in ((scored, 1.0), (str(ann), -1.0)):
        with contextlib.redirect_stdout(io.StringIO()):
            gt = COCO(path)
            evaluator = COCOeval(gt, gt.loadRes([dict(r) for r in results]), "segm")
            evaluator.evaluate(), evaluator.accumulate(), evaluator.summarize()
        assert evaluator.stats[0] == pytest.approx(expected)
    assert "scored as instances: crowd_as_instances" in dm.sources.scans["val"].line()


def test_a_validation_split_without_label_files_is_named(coco_mini: Path, tmp_path: Path) -> None:
    root = tmp_path / "yolo"
    yaml = _yolo(coco_mini, root, limit=4)
    shutil.rmtree(root / "labels")
    with pytest.raises(LabelsNotFoundError, match=r"\[val\]: none of its 4 images has a label file, so `validate` has "
                                                  r"nothing to score .*--data.val_split SPLIT, one with labels"):
        _dm(tmp_path, dataset=str(yaml), train_split=None).setup("validate")
    with pytest.raises(LabelsNotFoundError, match=r"\[train\]: none of its 4 images has a label file, so it would "
                                                  r"train on nothing"):
        _dm(tmp_path, dataset=str(yaml), val_split=None).setup("fit")


def test_scan_index_counts_backgrounds_and_labels_missing(coco_mini: Path, tmp_path: Path) -> None:
    root = tmp_path / "yolo"
    yaml = _yolo(coco_mini, root, limit=6)
    labels = sorted((root / "labels" / "val").glob("*.txt"))
    labels[0].unlink()
    labels[1].write_text("")
    scan = scan_index("val", "here", build_yolo_index(yaml, "val", use_cache=False))
    assert (scan.images, scan.backgrounds, scan.labels_missing) == (6, 2, 1)
    assert "2 backgrounds, 1 without a label file" in scan.line()


# ---------------------------------------------------------------------------------------- skipped as bad


def test_an_image_whose_every_annotation_was_skipped_is_left_out_not_a_background(coco_mini: Path,
                                                                                   tmp_path: Path) -> None:
    data = json.loads(_subset(coco_mini, tmp_path / "s.json").read_text())
    first, second = sorted(im["id"] for im in data["images"])[:2]
    bad = [a for a in data["annotations"] if a["image_id"] == first and not a["iscrowd"]]
    crowd = sum(1 for a in data["annotations"] if a["image_id"] == first and a["iscrowd"])
    for a in bad:
        a["segmentation"] = [[1.0, 1.0, 5.0, 5.0]]  # two points: polygon_too_few_points
    one = next(a for a in data["annotations"] if a["image_id"] == second and not a["iscrowd"])
    one["segmentation"] = [[1.0, 1.0, 5.0, 5.0]]  # one of several: its image keeps the others
    ann = tmp_path / "bad.json"
    ann.write_text(json.dumps(data))
    index = CocoIndex.build(ann, coco_mini / "val2017", use_cache=False, on_bad_sample="skip")
    assert first not in index.image_ids.tolist() and second in index.image_ids.tolist()
    assert index.skip_counts == {"polygon_too_few_points": len(bad) + 1, "image_all_annotations_skipped": 1}
    assert index.dropped_counts["crowd_dropped"] == crowd
    # Every annotation is in the index or counted with its reason.
    assert index.num_instances + index.num_crowd + len(bad) + 1 + crowd == len(data["annotations"])
    scan = scan_index("train", str(ann), index)
    assert scan.left_out["image_all_annotations_skipped"] == 1 and "image_all_annotations_skipped 1" in scan.line()


def test_a_label_file_whose_every_line_was_skipped_leaves_its_image_out(coco_mini: Path, tmp_path: Path) -> None:
    root = tmp_path / "yolo"
    yaml = _yolo(coco_mini, root, limit=4)
    labels = sorted((root / "labels" / "val").glob("*.txt"))
    lines = [line for line in labels[0].read_text().split("\n") if line.strip()]
    labels[0].write_text("".join(f"999 {line.split(' ', 1)[1]}\n" for line in lines))  # every class out of range
    index = build_yolo_index(yaml, "val", use_cache=False, on_bad_sample="skip")
    names = [index.file_name(i) for i in range(len(index))]
    assert f"{labels[0].stem}.jpg" not in names and len(names) == 3
    assert index.skip_counts == {"label_bad_class": len(lines), "image_all_annotations_skipped": 1}
