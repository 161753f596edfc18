"""``InterruptCheckpoint``: a fit stopped by Ctrl-C or an exception leaves a checkpoint that resumes (issue 40).

Before, ``configs/coco.yaml`` checkpointed every 1,000 steps and nothing on an interrupt: a Ctrl-C
at step 999 lost 999 steps. Here a fit is stopped in the middle of a step (an exception in the
backward hook), resumed from the checkpoint it left, and compared with the same fit run through:
the same batches from the stopped step on, the same weights at the end, the same counts. The
shipped configs are checked end to end with a real SIGINT through the CLI.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, Trainer

from seg_datamodule import COCOSegDataModule, InterruptCheckpoint
from seg_datamodule.models import YolactLite

ROOT = Path(__file__).resolve().parents[1]
STEPS = 6


class _Record(Callback):
    """Each trained batch's step, image ids and an image hash; raises mid-step at ``fail_at``."""

    def __init__(self, fail_at: int | None = None, error: BaseException | None = None) -> None:
        self.rows: list[tuple[int, list[int], str]] = []
        self.fail_at, self.error = fail_at, error

    def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        digest = hashlib.sha256(batch.images.numpy().tobytes()).hexdigest()[:16]
        self.rows.append((trainer.global_step, batch.image_ids.tolist(), digest))

    def on_before_backward(self, trainer: Trainer, pl_module: Any, loss: torch.Tensor) -> None:
        if trainer.global_step == self.fail_at:  # the batch is fetched and forwarded, not trained on
            raise self.error or RuntimeError("stopped in the middle of a step")


def _fit(demo_dir: Path, root: Path, record: _Record, ckpt: str | None = None) -> tuple[Trainer, Any, Any]:
    dm = COCOSegDataModule(demo_dir=str(demo_dir), image_size=96, batch_size=4, num_workers=0,
                           cache_dir=str(root / "index"), seed=5)
    trainer = Trainer(accelerator="cpu", max_steps=STEPS, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0,
                      num_sanity_val_steps=0, default_root_dir=str(root), callbacks=[record, InterruptCheckpoint()])
    torch.manual_seed(0)
    model = YolactLite(num_classes=dm.num_classes, width=8, num_prototypes=4)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
    return trainer, model, dm


@pytest.mark.slow
def test_an_exception_mid_step_leaves_a_checkpoint_that_resumes_exactly(
    demo_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, through, dm_through = _fit(demo_dir, tmp_path / "through", whole := _Record())
    stopped = _Record(fail_at=3)
    with caplog.at_level(logging.INFO), pytest.raises(RuntimeError, match="middle of a step"):
        _fit(demo_dir, tmp_path / "stopped", stopped)
    ckpt = tmp_path / "stopped" / "checkpoints" / "interrupted.ckpt"
    assert ckpt.is_file() and torch.load(ckpt, weights_only=False)["global_step"] == 3
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert f"RuntimeError at step 3: saved {ckpt}; resume with --ckpt_path {ckpt}" in messages
    assert "where the annotations went (by reason), until RuntimeError stopped fit" in messages  # the report too
    assert stopped.rows == whole.rows[:4]  # step 3's batch was fetched, then the step failed

    trainer, resumed_model, dm = _fit(demo_dir, tmp_path / "resumed", resumed := _Record(), ckpt=str(ckpt))
    assert trainer.global_step == STEPS
    assert resumed.rows == whole.rows[3:]  # the failed step's batch again, then the rest
    # The trained weights are the uninterrupted run's, bit for bit. Batch-norm statistics are not:
    # the stopped step's forward had updated them before the exception, and they were saved so.
    differ = [k for (k, a), b in zip(resumed_model.named_parameters(), through.parameters()) if not torch.equal(a, b)]
    assert differ == [], differ
    assert dm.skip_counts["train"] == dm_through.skip_counts["train"]
    assert not (tmp_path / "resumed" / "checkpoints" / "interrupted.ckpt").exists()  # a finished fit writes none


@pytest.mark.slow
def test_nothing_is_saved_before_the_first_step(demo_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        _fit(demo_dir, tmp_path, _Record(fail_at=0))
    assert not (tmp_path / "checkpoints").exists()


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="filename must be a non-empty file name"):
        InterruptCheckpoint(filename="")
    with pytest.raises(ValueError, match="filename must be a non-empty file name"):
        InterruptCheckpoint(filename="a/b")
    with pytest.raises(TypeError, match="dirpath must be a folder path or None, got 3"):
        InterruptCheckpoint(dirpath=3)  # type: ignore[arg-type]
    assert InterruptCheckpoint().ckpt_path is None and InterruptCheckpoint("x").ckpt_path == os.path.join("x", "interrupted.ckpt")


# ------------------------------------------------------------------------------ the shipped configs


def _cli(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "seg_datamodule", *args], cwd=cwd, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=path, MPLBACKEND="Agg", **env), timeout=900)


@pytest.mark.slow
def test_ctrl_c_in_a_shipped_config_leaves_a_checkpoint_that_resumes(demo_dir: Path, tmp_path: Path) -> None:
    small = ["--data.demo_dir", str(demo_dir), "--data.cache_dir", str(tmp_path / "index"), "--data.image_size",
             "128", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "6",
             "--trainer.limit_val_batches", "1", "--trainer.check_val_every_n_epoch", "1",
             "--model.init_args.width", "8", "--model.init_args.num_prototypes", "4",
             "--trainer.callbacks+=_sigint.SigintAt"]  # a real SIGINT, which the run sends itself at step 3
    proc = _cli(["fit", "--config", str(ROOT / "configs" / "demo.yaml"), *small], tmp_path, SIGINT_AT_STEP="3")
    run = tmp_path / "runs" / "demo" / "version_0"
    ckpt = run / "checkpoints" / "interrupted.ckpt"
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Detected KeyboardInterrupt" in output, output[-3000:]
    assert ckpt.is_file() and torch.load(ckpt, weights_only=False)["global_step"] == 3
    assert f"resume with --ckpt_path {ckpt.relative_to(tmp_path)}" in output
    assert "until KeyboardInterrupt stopped fit" in output  # the DataModule's report
    report = json.loads((run / "step_time.json").read_text())  # and the profiler's, partial
    assert report["partial"] is True and report["stopped_by"].startswith("KeyboardInterrupt")

    again = _cli(["fit", "--config", str(run / "config.yaml"), "--ckpt_path", str(ckpt)], tmp_path)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert "Restored all states from the checkpoint" in again.stdout + again.stderr
    resumed = torch.load(tmp_path / "runs" / "demo" / "version_1" / "checkpoints" / "last.ckpt", weights_only=False)
    assert resumed["global_step"] == 6
