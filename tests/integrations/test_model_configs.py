"""Every shipped model config through every CLI stage, on COCO JSON and on a data.yaml (issue 50).

``configs/yolo11n_seg.yaml`` (COCO JSON), ``configs/yolo11n_seg_data_yaml.yaml`` (a data.yaml) and
``configs/maskrcnn.yaml`` (both layouts) each run ``fit``, then ``validate``, ``test`` and ``predict``
from the run's own ``config.yaml`` and last checkpoint, as the guides show. One interpreter per
config runs the four commands through the console script's own ``main`` (importing torch,
Lightning and Ultralytics once, not four times), with every warning a user would see as an error,
as the docs' runs of shipped configs. The runs are small (a few 128 px batches); the weights the
configs start from are stand-ins of the real files' layout (``tests/_pretrained.py``).

Checked per run: ``val/segm_AP`` after fit and after validate, ``test/segm_AP``, a results file that pycocotools' ``loadRes`` and ``COCOeval`` accept
against the split's ground truth, and the predictions drawn with class names.
"""

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
from pycocotools.cocoeval import COCOeval

from _pretrained import write_pretrained_weights
from _readme import MASK_RCNN_LIMITS, WARNINGS_AS_ERRORS
from _yolo import write_data_yaml, write_yolo_split


pytestmark = pytest.mark.needs("ultralytics")

ROOT = Path(__file__).resolve().parents[2]
#: Runs the CLI commands given as a JSON list of argument lists, in order, in one interpreter.
#: ``sys.argv`` is emptied first: LightningCLI warns when it is given args while ``sys.argv`` holds others.
_DRIVER = ("import json, sys\nfrom seg_datamodule.cli import main\ncommands = json.loads(sys.argv.pop(1))\n"
           "for args in commands:\n    print('== ' + args[0], flush=True)\n    main(args)\n")
_FIT = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2",
        "--trainer.check_val_every_n_epoch", "1", "--trainer.num_sanity_val_steps", "0",
        "--trainer.log_every_n_steps", "1", "--data.batch_size", "2", "--data.val_batch_size", "2"]
_SMALL = ["--data.image_size", "128", "--data.num_workers", "1", "--trainer.accelerator", "cpu"]


@pytest.fixture(scope="module")
def layouts(coco_mini: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, list[str]], Path]:
    """(the data keys of each layout, the data.yaml's root): coco-mini's COCO JSON files, and its first
    8 train and val images as a data.yaml (its val images also the test split)."""
    root = tmp_path_factory.mktemp("yolo")
    for split in ("train2017", "val2017"):
        names = write_yolo_split(coco_mini / "annotations" / f"instances_{split}.json", coco_mini / split, root, split,
                                 limit=8)
    yaml = write_data_yaml(root, names, train="images/train2017", val="images/val2017", test="images/val2017")
    ann = {s: str(coco_mini / "annotations" / f"instances_{s}2017.json") for s in ("train", "val")}
    coco = [x for s in ("train", "val") for x in (f"--data.{s}_ann", ann[s], f"--data.{s}_images",
                                                   str(coco_mini / f"{s}2017"))]
    no_coco = [x for s in ("train", "val") for x in (f"--data.{s}_ann", "null", f"--data.{s}_images", "null")]
    return {"coco": coco, "data.yaml": [*no_coco, "--data.dataset", str(yaml)]}, root


def _metric_rows(path: Path, key: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return [row for row in csv.DictReader(f) if row.get(key)]


CASES = [("yolo11n_seg.yaml", "coco"), ("yolo11n_seg_data_yaml.yaml", "data.yaml"), ("maskrcnn.yaml", "coco"),
         ("maskrcnn.yaml", "data.yaml")]


@pytest.mark.slow
@pytest.mark.parametrize(("config", "layout"), CASES, ids=[f"{c.removesuffix('.yaml')}-{lay}" for c, lay in CASES])
def test_a_shipped_model_config_fits_validates_tests_and_predicts(config: str, layout: str, coco_mini: Path,
                                                                 layouts: tuple[dict[str, list[str]], Path],
                                                                 tmp_path: Path) -> None:
    data_keys, yolo_root = layouts
    torch_home = tmp_path / "torch_home"
    write_pretrained_weights([ROOT / "configs" / config], tmp_path, torch_home)
    model = MASK_RCNN_LIMITS if config == "maskrcnn.yaml" else []
    cache = ["--data.cache_dir", str(tmp_path / "cache")]
    fit = ["fit", "--config", str(ROOT / "configs" / config), *data_keys[layout], *_FIT, *_SMALL, *model, *cache]
    run = tmp_path / "runs" / config.removesuffix(".yaml") / "version_0"
    again = ["--config", str(run / "config.yaml"), "--ckpt_path", str(run / "checkpoints" / "last.ckpt"), *cache]
    if layout == "coco":
        val_ann, val_images = str(coco_mini / "annotations" / "instances_val2017.json"), str(coco_mini / "val2017")
        test_split = ["--data.test_ann", val_ann, "--data.test_images", val_images]
        predict_images = val_images
    else:
        test_split = []  # the config's own test_split: the data.yaml's test: (labelled here)
        predict_images = str(yolo_root / "images" / "val2017")
    # The stand-in weights score below the configs' thresholds; a results file needs detections to check.
    keep_all = (["--model.init_args.box_score_thresh", "0.0"] if config == "maskrcnn.yaml"
                else ["--model.init_args.conf", "0.0", "--model.init_args.max_det", "20"])
    results, pictures = tmp_path / "predict" / "results.json", tmp_path / "predict" / "pictures"
    commands = [
        fit,
        ["validate", *again, "--trainer.limit_val_batches", "2"],
        ["test", *again, *test_split, "--trainer.limit_test_batches", "2"],
        ["predict", *again, *keep_all, "--data.predict_images", predict_images, "--trainer.limit_predict_batches", "2",
         "--trainer.callbacks+=seg_datamodule.COCOResultsWriter", "--trainer.callbacks.output", str(results),
         "--trainer.callbacks.draw_dir", str(pictures)],
    ]
    env = dict(os.environ, TORCH_HOME=str(torch_home),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, *WARNINGS_AS_ERRORS, "-c", _DRIVER, json.dumps(commands)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])

    # fit: validation scored, a checkpoint written, the run pictures drawn (issue 51); then validate
    # (version_1) and test (version_2) score it.
    assert _metric_rows(run / "metrics.csv", "val/segm_AP")
    drawn_at_fit = {"labels_train.png", "labels_val.png", "train_batch0.jpg", "train_batch1.jpg", "val_batch0_labels.jpg",
                "val_batch0_pred.jpg", "results.png", "MaskPR_curve.png", "BoxPR_curve.png", "confusion_matrix.png"}
    assert drawn_at_fit <= {p.name for p in run.iterdir()}
    validated = _metric_rows(run.parent / "version_1" / "metrics.csv", "val/segm_AP")
    assert len(validated) == 1 and 0.0 <= float(validated[0]["val/segm_AP"]) <= 1.0
    tested = _metric_rows(run.parent / "version_2" / "metrics.csv", "test/segm_AP")
    assert len(tested) == 1 and 0.0 <= float(tested[0]["test/segm_AP"]) <= 1.0
    for key in ("test/bbox_AP", "test/segm_AP50"):
        assert 0.0 <= float(tested[0][key]) <= 1.0, key

    # predict: a results file pycocotools accepts against the split's ground truth, and its pictures.
    if layout == "coco":
        truth = coco_mini / "annotations" / "instances_val2017.json"
    else:  # the ground truth the index writes from the val labels, the file `evaluation_file` names
        truth = next((tmp_path / "cache" / "ground_truth").glob("data-*.json"))
    detections = json.loads(results.read_text())
    assert detections, "no detection in the results file"
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(truth))
        evaluation = COCOeval(gt, gt.loadRes(str(results)), "segm")
        evaluation.params.imgIds = sorted({d["image_id"] for d in detections})
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    assert 0.0 <= evaluation.stats[0] <= 1.0
    for d in detections:  # masks at the original image's resolution
        image = gt.imgs[d["image_id"]]
        assert d["segmentation"]["size"] == [image["height"], image["width"]]
    drawn = sorted(pictures.glob("*.jpg"))
    assert drawn and {int(p.stem) for p in drawn} <= {d["image_id"] for d in detections} | set(gt.imgs)
