"""Each CLI stage from a checkpoint with a DataModule naming only its own split (issue 35), on coco-mini.

A checkpoint of ``configs/coco.yaml`` is validated with only ``val_ann`` / ``val_images``, tested
with only ``test_ann`` / ``test_images``, and predicts a folder with no annotation file at all
(the categories then come from the checkpoint); a checkpoint whose categories differ from the
split's file is refused in one named error.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _readme import WARNINGS_AS_ERRORS  # a shipped config's warnings fail the run, as in the docs test

ROOT = Path(__file__).resolve().parents[1]
NO_TRAIN = ["--data.train_ann", "null", "--data.train_images", "null", "--data.val_ann", "null",
            "--data.val_images", "null"]


def _cli(args: list[str], cwd: Path, ok: bool = True, strict: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    flags = WARNINGS_AS_ERRORS if strict else []
    proc = subprocess.run([sys.executable, *flags, "-m", "seg_datamodule", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=400)
    assert (proc.returncode == 0) == ok, proc.stderr[-3000:]
    return proc


def _metrics(path: Path, key: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return [row for row in csv.DictReader(f) if row.get(key)]


@pytest.mark.slow
def test_validate_test_and_predict_from_a_checkpoint_with_only_their_split(coco_mini: Path, tmp_path: Path) -> None:
    ann = {s: str(coco_mini / "annotations" / f"instances_{s}2017.json") for s in ("train", "val")}
    images = {s: str(coco_mini / f"{s}2017") for s in ("train", "val")}
    small = ["--model.init_args.width", "8", "--model.init_args.num_prototypes", "8", "--data.image_size", "96",
             "--data.num_workers", "0", "--data.cache_dir", str(tmp_path / "cache"), "--trainer.precision", "32-true",
             "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto"]
    coco = ["--config", str(ROOT / "configs" / "coco.yaml"), *small]
    _cli(["fit", *coco, "--data.train_ann", ann["train"], "--data.train_images", images["train"], "--data.val_ann",
          "null", "--data.val_images", "null", "--data.batch_size", "4", "--trainer.max_steps", "1",
          "--trainer.logger", "false"], tmp_path)
    ckpt = str(tmp_path / "checkpoints" / "last.ckpt")

    # validate: only the validation split (it failed on the demo training set's categories before).
    _cli(["validate", *coco, "--ckpt_path", ckpt, *NO_TRAIN, "--data.val_ann", ann["val"], "--data.val_images",
          images["val"], "--trainer.limit_val_batches", "2"], tmp_path)
    rows = _metrics(tmp_path / "runs" / "coco" / "version_0" / "metrics.csv", "val/segm_AP")
    assert len(rows) == 1 and 0.0 <= float(rows[0]["val/segm_AP"]) <= 1.0

    # test: only the test split.
    _cli(["test", *coco, "--ckpt_path", ckpt, *NO_TRAIN, "--data.test_ann", ann["val"], "--data.test_images",
          images["val"], "--trainer.limit_test_batches", "2"], tmp_path)
    rows = _metrics(tmp_path / "runs" / "coco" / "version_1" / "metrics.csv", "test/segm_AP")
    assert len(rows) == 1 and 0.0 <= float(rows[0]["test/segm_AP"]) <= 1.0

    # predict: a folder and nothing else; the categories are the checkpoint's. No warning either
    # (the checkpoint holds coco.yaml's ModelCheckpoint state, which predict has nothing to restore into).
    _cli(["predict", "--config", str(ROOT / "configs" / "predict.yaml"), *small, "--ckpt_path", ckpt, *NO_TRAIN[:4],
          "--data.predict_images", images["val"]], tmp_path, strict=True)
    info = json.loads((tmp_path / "runs" / "predict" / "results_images.json").read_text())
    coco_categories = json.loads(Path(ann["val"]).read_text())["categories"]
    assert [c["id"] for c in info["categories"]] == sorted(c["id"] for c in coco_categories)
    assert info["info"]["images_predicted"] == len(list(Path(images["val"]).glob("*.jpg")))

    # A split whose categories are not the checkpoint's: one named error, not a crash later.
    data = json.loads(Path(ann["val"]).read_text())
    dropped = data["categories"][0]["id"]
    data["categories"] = data["categories"][1:]
    data["annotations"] = [a for a in data["annotations"] if a["category_id"] != dropped]
    fewer = tmp_path / "fewer_categories.json"
    fewer.write_text(json.dumps(data))
    proc = _cli(["validate", *coco, "--ckpt_path", ckpt, *NO_TRAIN, "--data.val_ann", str(fewer),
                 "--data.val_images", images["val"], "--trainer.limit_val_batches", "1"], tmp_path, ok=False)
    assert "fewer_categories.json: category ids" in proc.stderr


# LightningCLI's own call of a jsonargparse API that jsonargparse deprecates (add_instantiator).
@pytest.mark.filterwarnings("ignore::jsonargparse._deprecated.JsonargparseDeprecationWarning")
def test_options_typed_with_ckpt_path_win_over_the_checkpoints_hyperparameters(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # Lightning >= 2.6 builds the model from the checkpoint's hyperparameters, and replaced a typed
    # `--model.init_args.width` by them silently; a config file's values still give way to them.
    import lightning as L
    import torch
    from lightning.pytorch.cli import LightningCLI

    from seg_datamodule import COCOSegDataModule
    from seg_datamodule.cli import SegCLI, typed_model_keys

    assert typed_model_keys(["--model.init_args.conf", "0", "--model.iou=0.5", "--model", "x.yaml", "--data.model.a",
                             "--trainer.max_epochs", "1"]) == {"model.init_args.conf", "model.init_args.iou", "model"}
    if not hasattr(LightningCLI, "_parse_ckpt_path"):
        pytest.skip("this Lightning does not read --ckpt_path hyperparameters into the config")
    ckpt = tmp_path / "hparams.ckpt"
    torch.save({"hyper_parameters": {"_class_path": "seg_datamodule.demo.model.YolactLite", "width": 8,
                                     "num_prototypes": 12, "lr": 0.5}}, ckpt)
    seen = {}

    class Parsed(SegCLI):
        def instantiate_classes(self) -> None:
            seen.update(self.config[self.subcommand]["model"]["init_args"])
            raise SystemExit(0)

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    with pytest.raises(SystemExit):
        Parsed(L.LightningModule, COCOSegDataModule, subclass_mode_model=True, args=[
            "predict", "--config", str(ROOT / "configs" / "predict.yaml"), "--ckpt_path", str(ckpt),
            "--model.init_args.width", "24", "--model.lr=0.25"])
    # typed: 24 and 0.25; from the checkpoint over predict.yaml's 32: num_prototypes 12
    assert (seen["width"], seen["lr"], seen["num_prototypes"]) == (24, 0.25, 12)
