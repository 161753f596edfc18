"""What a CLI run writes and prints by default: its own folder only, no tips, a precision that fits (issue 40).

Before: ``predict --config configs/predict.yaml`` (``trainer.logger: false``) replaced the user's own
``./config.yaml``: without a logger Lightning's log dir is the working directory, and the CLI saved
its config there with ``overwrite=True``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from jsonargparse import Namespace
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from seg_datamodule.cli_defaults import (
    KNOWN_THIRD_PARTY_WARNINGS, RunFolderConfig, RunFolderError, default_precision, quiet_console,
)

ROOT = Path(__file__).resolve().parents[1]


def _config_callback() -> RunFolderConfig:
    parser = LightningArgumentParser()
    parser.add_argument("--x", type=int, default=1)
    return RunFolderConfig(parser, Namespace(x=1))


def _trainer(tmp_path: Path, logger: object) -> Trainer:
    return Trainer(accelerator="cpu", logger=logger, default_root_dir=str(tmp_path), enable_progress_bar=False,
                   enable_model_summary=False, enable_checkpointing=False)


# Lightning's own call of a jsonargparse API that jsonargparse deprecates (save's skip_none).
@pytest.mark.filterwarnings("ignore::jsonargparse._deprecated.JsonargparseDeprecationWarning")
def test_the_config_goes_into_the_run_folder(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, CSVLogger(str(tmp_path / "runs"), name="x"))
    _config_callback().setup(trainer, LightningModule(), "fit")
    assert (tmp_path / "runs" / "x" / "version_0" / "config.yaml").read_text().strip() == "x: 1"


def test_without_a_logger_no_config_is_written(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("mine: true\n")
    callback = _config_callback()
    callback.setup(_trainer(tmp_path, False), LightningModule(), "fit")
    assert callback.already_saved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
    assert (tmp_path / "config.yaml").read_text() == "mine: true\n"


def test_an_existing_config_in_the_run_folder_is_never_replaced(tmp_path: Path) -> None:
    folder = tmp_path / "runs" / "x" / "version_3"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("earlier: run\n")
    trainer = _trainer(tmp_path, CSVLogger(str(tmp_path / "runs"), name="x", version=3))
    with pytest.raises(RunFolderError, match=r"version_3/config.yaml exists \(an earlier run's\)"):
        _config_callback().setup(trainer, LightningModule(), "fit")
    assert (folder / "config.yaml").read_text() == "earlier: run\n"


def test_default_precision_fits_the_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert [default_precision(a) for a in ("auto", "gpu", "cuda", "cpu")] == [None] * 4
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert [default_precision(a) for a in ("auto", "gpu", "cuda", "cpu", "mps")] == ["16-mixed"] * 3 + [None] * 2


def test_quiet_console_drops_tips_and_known_third_party_warnings(caplog: pytest.LogCaptureFixture) -> None:
    loggers = [logging.getLogger(n) for n in ("lightning.pytorch.utilities.rank_zero",
                                              "lightning.fabric.utilities.rank_zero")]
    before = [list(logger.filters) for logger in loggers]
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            quiet_console()
            quiet_console()  # idempotent
            with caplog.at_level(logging.INFO):
                rank_zero_info("💡 Tip: For seamless cloud logging, try installing [litlogger]")
                rank_zero_info("GPU available: False, used: False")
            message, category, _ = KNOWN_THIRD_PARTY_WARNINGS[0]
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", category)
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", UserWarning)  # another category: kept
        assert [r.getMessage() for r in caplog.records] == ["GPU available: False, used: False"]
        assert [type(w.message) for w in seen] == [UserWarning]
        assert all(sum(type(f).__name__ == "_DropTips" for f in logger.filters) == 1 for logger in loggers)
    finally:
        for logger, filters in zip(loggers, before):
            logger.filters[:] = filters


@pytest.mark.slow
def test_predict_beside_a_users_config_writes_only_its_results(coco_mini: Path, tmp_path: Path) -> None:
    mine = "# the user's own training config\ntrainer: {max_epochs: 300}\n"
    (tmp_path / "config.yaml").write_text(mine)
    val_ann, val_images = coco_mini / "annotations" / "instances_val2017.json", coco_mini / "val2017"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "seg_datamodule", "predict", "--config", str(ROOT / "configs" / "predict.yaml"),
         "--data.train_ann", str(val_ann), "--data.train_images", str(val_images),
         "--data.predict_images", str(val_images), "--data.image_size", "128", "--data.val_batch_size", "2",
         "--data.cache_dir", str(tmp_path / "cache"), "--trainer.limit_predict_batches", "1",
         "--model.init_args.width", "8", "--model.init_args.num_prototypes", "4"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "config.yaml").read_text() == mine  # was replaced by the predict run's config
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()
                     and not p.is_relative_to(tmp_path / "cache"))
    assert written == ["config.yaml", "runs/predict/results.json", "runs/predict/results_images.json"]
