"""The CLI on an Ultralytics dataset (a data.yaml of coco-mini images): fit, validate, test, predict and convert,
one command each, as a user coming from Ultralytics runs them."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from pathlib import Path

import pytest
from pycocotools.coco import COCO

from _cli import run_commands
from _yolo import write_data_yaml, write_yolo_split

ROOT = Path(__file__).resolve().parents[1]



@pytest.mark.slow
def test_fit_validate_test_predict_and_convert_on_a_data_yaml(coco_mini: Path, tmp_path: Path) -> None:
    root = tmp_path / "dataset"
    for split in ("train2017", "val2017"):
        names = write_yolo_split(coco_mini / "annotations" / f"instances_{split}.json", coco_mini / split, root, split,
                                 limit=8)
    yaml = write_data_yaml(root, names, train="images/train2017", val="images/val2017", test="images/val2017")
    demo = ["--config", str(ROOT / "configs" / "demo.yaml"), "--data.dataset", str(yaml)]
    small = ["--model.init_args.width", "8", "--model.init_args.num_prototypes", "8", "--data.image_size", "128",
             "--data.num_workers", "0", "--data.cache_dir", str(tmp_path / "cache"), "--trainer.accelerator", "cpu"]
    log = tmp_path / "runs" / "demo" / "version_0"
    ckpt = str(log / "checkpoints" / "last.ckpt")
    # One interpreter runs the four in turn (a CLI start is ~6 s of imports). `test` reads the
    # data.yaml's test: split with no key set (issue 60).
    ran = run_commands([
        ["fit", *demo, *small, "--data.batch_size", "4", "--trainer.max_epochs", "1",
         "--trainer.check_val_every_n_epoch", "1", "--trainer.limit_val_batches", "2"],
        ["validate", *demo, *small, "--ckpt_path", ckpt, "--data.train_split", "null"],
        ["test", *demo, *small, "--ckpt_path", ckpt, "--data.train_split", "null"],
        ["predict", "--config", str(ROOT / "configs" / "predict.yaml"), *small, "--ckpt_path", ckpt,
         "--model.init_args.width", "8", "--data.train_ann", "null", "--data.train_images", "null",
         "--data.dataset", str(yaml), "--data.train_split", "null", "--data.predict_images",
         str(root / "images" / "val2017")],
        ["convert", str(yaml), str(tmp_path / "chunks"), "--split", "val", "--num-workers", "1"],
    ], tmp_path)
    assert [r.code for r in ran] == [0, 0, 0, 0, 0], ran[-1].stderr[-3000:]
    with open(log / "metrics.csv", newline="") as f:
        assert any(row.get("val/segm_AP") for row in csv.DictReader(f))
    assert "val/segm_AP" in ran[1].output
    assert "test/segm_AP" in ran[2].output
    results = tmp_path / "runs" / "predict" / "results.json"
    ground_truth = next((tmp_path / "cache" / "ground_truth").glob("data-*.json"))
    with contextlib.redirect_stdout(io.StringIO()):
        loaded = COCO(str(ground_truth)).loadRes(str(results))  # ids are the images' stems on both sides
    assert {a["image_id"] for a in loaded.anns.values()} == {int(p.stem) for p in (root / "images/val2017").iterdir()}

    meta = json.loads((tmp_path / "chunks" / "seg_datamodule_stream.json").read_text())
    assert meta["num_records"] == 8 and meta["ann_file"] == str(yaml) and "8 images" in ran[4].output
