"""The CLI's test and predict subcommands on coco-mini: configs/coco.yaml to train, configs/predict.yaml to predict."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pycocotools.coco import COCO

ROOT = Path(__file__).resolve().parents[1]


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # This checkout first: the package under test, whatever the environment has installed.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "seg_datamodule", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
@pytest.mark.extended  # default tier: the test-and-predict guide's runs, tests/data/test_predict_coco_ids.py
def test_fit_then_test_and_predict_from_the_configs(coco_mini: Path, tmp_path: Path) -> None:
    ann = {s: str(coco_mini / "annotations" / f"instances_{s}2017.json") for s in ("train", "val")}
    images = {s: str(coco_mini / f"{s}2017") for s in ("train", "val")}
    small = ["--model.init_args.width", "8", "--model.init_args.num_prototypes", "8", "--data.image_size", "128",
             "--data.num_workers", "0", "--data.cache_dir", str(tmp_path / "cache"), "--trainer.precision", "32-true",
             "--trainer.accelerator", "cpu", "--trainer.devices", "1"]
    _cli(["fit", "--config", str(ROOT / "configs" / "coco.yaml"), *small, "--data.train_ann", ann["train"],
          "--data.train_images", images["train"], "--data.val_ann", ann["val"], "--data.val_images", images["val"],
          "--data.batch_size", "4", "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0",
          "--trainer.strategy", "auto", "--trainer.logger", "false"], tmp_path)  # no logger: see issue 26
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()

    _cli(["test", "--config", str(ROOT / "configs" / "coco.yaml"), *small, "--ckpt_path", str(ckpt),
          "--data.train_ann", ann["train"], "--data.train_images", images["train"], "--data.val_ann", "null",
          "--data.val_images", "null", "--data.test_ann", ann["val"], "--data.test_images", images["val"],
          "--trainer.strategy", "auto"], tmp_path)
    with open(tmp_path / "runs" / "coco" / "version_0" / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("test/segm_AP")]
    assert len(rows) == 1 and 0.0 <= float(rows[0]["test/segm_AP"]) <= 1.0

    _cli(["predict", "--config", str(ROOT / "configs" / "predict.yaml"), *small, "--ckpt_path", str(ckpt),
          "--data.train_ann", ann["train"], "--data.train_images", images["train"],
          "--data.predict_images", images["val"]], tmp_path)
    results = tmp_path / "runs" / "predict" / "results.json"
    info = json.loads((tmp_path / "runs" / "predict" / "results_images.json").read_text())
    # Folder ids are hashes of the file names: the image file beside the results is their COCO file.
    with contextlib.redirect_stdout(io.StringIO()):
        loaded = COCO(str(results.with_name("results_images.json"))).loadRes(str(results))
        coco = COCO(ann["val"])
    images_in_folder = len(coco.imgs)  # 79 in coco-mini
    assert len(loaded.anns) == info["info"]["detections"] == images_in_folder
    assert info["info"]["images_predicted"] == images_in_folder
    assert {i["file_name"] for i in info["images"]} == {img["file_name"] for img in coco.dataset["images"]}
