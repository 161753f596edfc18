"""What the CLI tells a newcomer (issue 37): its help names every command, and a resumed fit with
nothing left to train says so instead of ending silently with an empty run folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from _cli import run_commands

ROOT = Path(__file__).resolve().parents[1]
HINT = "nothing left to train"


def _cli(args: list[str], cwd: Path) -> str:
    # This checkout first: the package under test, whatever the environment has installed.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "seg_datamodule", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_help_names_convert_and_loader_bench(tmp_path: Path) -> None:
    out = " ".join(_cli(["--help"], tmp_path).split())  # the help is wrapped to the terminal's width
    for command in ("fit", "validate", "test", "predict", "seg-datamodule convert", "seg-datamodule loader-bench"):
        assert command in out, out


@pytest.mark.slow
def test_a_resume_with_nothing_left_to_train_says_so(coco_mini: Path, tmp_path: Path) -> None:
    data = ["--data.train_ann", str(coco_mini / "annotations" / "instances_train2017.json"),
            "--data.train_images", str(coco_mini / "train2017"), "--data.val_ann", "null", "--data.val_images", "null",
            "--data.image_size", "128", "--data.batch_size", "4", "--data.num_workers", "0",
            "--data.cache_dir", str(tmp_path / "cache")]
    small = ["--config", str(ROOT / "configs" / "coco.yaml"), *data, "--model.init_args.width", "8",
             "--model.init_args.num_prototypes", "8", "--trainer.precision", "32-true", "--trainer.accelerator", "cpu",
             "--trainer.devices", "1", "--trainer.strategy", "auto", "--trainer.logger", "false",
             "--trainer.limit_val_batches", "0"]
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    # One interpreter runs the three in turn (a CLI start is ~6 s of imports).
    first, finished, more = run_commands([
        ["fit", *small, "--trainer.max_steps", "2"],
        ["fit", *small, "--trainer.max_steps", "2", "--ckpt_path", str(ckpt)],  # nothing left: said
        ["fit", *small, "--trainer.max_steps", "3", "--ckpt_path", str(ckpt)],  # one step left: not said
    ], tmp_path)
    assert (first.code, finished.code, more.code) == (0, 0, 0), more.stderr[-3000:]
    assert HINT not in first.output
    assert HINT in finished.output and "--trainer.max_epochs" in finished.output, finished.output[-2000:]
    assert finished.output.count(HINT) == 1, finished.output[-2000:]
    assert HINT not in more.output, more.output[-2000:]
