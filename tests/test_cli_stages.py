"""Each CLI stage from a checkpoint with a DataModule naming only its own split (issue 35), on coco-mini.

A checkpoint of ``configs/coco.yaml`` is validated with only ``val_ann`` / ``val_images``, tested
with only ``test_ann`` / ``test_images``, and predicts a folder with no annotation file at all
(the categories then come from the checkpoint); a checkpoint whose categories differ from the
split's file is refused in one named error.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
from _cli import run_commands
from _readme import WARNINGS_AS_ERRORS  # a shipped config's warnings fail the run, as in the docs test

ROOT = Path(__file__).resolve().parents[1]
NO_TRAIN = ["--data.train_ann", "null", "--data.train_images", "null", "--data.val_ann", "null",
            "--data.val_images", "null"]



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
    ckpt = str(tmp_path / "checkpoints" / "last.ckpt")
    # A split whose categories are not the checkpoint's (the last command): one named error, not a crash later.
    data = json.loads(Path(ann["val"]).read_text())
    dropped = data["categories"][0]["id"]
    data["categories"] = data["categories"][1:]
    data["annotations"] = [a for a in data["annotations"] if a["category_id"] != dropped]
    fewer = tmp_path / "fewer_categories.json"
    fewer.write_text(json.dumps(data))
    # One interpreter runs them in turn (a CLI start is ~6 s of imports), every warning an error: the
    # predict from a checkpoint holding coco.yaml's ModelCheckpoint state must restore nothing loudly.
    # (A fit without validation hears torchmetrics' empty-state gather once; that is not what this checks.)
    quiet = [*WARNINGS_AS_ERRORS, "-W", "ignore:Total length of `list` across ranks is zero:UserWarning"]
    ran = run_commands([
        ["fit", *coco, "--data.train_ann", ann["train"], "--data.train_images", images["train"], "--data.val_ann",
         "null", "--data.val_images", "null", "--data.batch_size", "4", "--trainer.max_steps", "1",
         "--trainer.logger", "false"],
        # validate: only the validation split (it failed on the demo training set's categories before).
        ["validate", *coco, "--ckpt_path", ckpt, *NO_TRAIN, "--data.val_ann", ann["val"], "--data.val_images",
         images["val"], "--trainer.limit_val_batches", "2"],
        # test: only the test split.
        ["test", *coco, "--ckpt_path", ckpt, *NO_TRAIN, "--data.test_ann", ann["val"], "--data.test_images",
         images["val"], "--trainer.limit_test_batches", "2"],
        # predict: a folder and nothing else; the categories are the checkpoint's.
        ["predict", "--config", str(ROOT / "configs" / "predict.yaml"), *small, "--ckpt_path", ckpt, *NO_TRAIN[:4],
         "--data.predict_images", images["val"]],
        ["validate", *coco, "--ckpt_path", ckpt, *NO_TRAIN, "--data.val_ann", str(fewer),
         "--data.val_images", images["val"], "--trainer.limit_val_batches", "1"],
    ], tmp_path, flags=quiet)
    for each in ran[:4]:
        assert each.code == 0, (each.args[0], each.stderr[-3000:])
    assert len(ran) == 5, ran[-1].stderr[-3000:]
    wrong = ran[4]
    rows = _metrics(tmp_path / "runs" / "coco" / "version_0" / "metrics.csv", "val/segm_AP")
    assert len(rows) == 1 and 0.0 <= float(rows[0]["val/segm_AP"]) <= 1.0
    rows = _metrics(tmp_path / "runs" / "coco" / "version_1" / "metrics.csv", "test/segm_AP")
    assert len(rows) == 1 and 0.0 <= float(rows[0]["test/segm_AP"]) <= 1.0
    info = json.loads((tmp_path / "runs" / "predict" / "results_images.json").read_text())
    coco_categories = json.loads(Path(ann["val"]).read_text())["categories"]
    assert [c["id"] for c in info["categories"]] == sorted(c["id"] for c in coco_categories)
    assert info["info"]["images_predicted"] == len(list(Path(images["val"]).glob("*.jpg")))
    assert wrong.code == 2 and "fewer_categories.json: category ids" in wrong.stderr, wrong.stderr[-3000:]


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
