"""The demo model with ``box_only: keep`` (issue 41): the class loss takes every target, the mask
loss only those with a mask; a real Trainer fits on box-only targets, in process and from the CLI."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from seg_datamodule import COCOSegDataModule
from seg_datamodule.models import YolactLite, mask_loss

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "io" / "coco"))
from test_coco_box_only import strip_segmentations  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stripped(coco_mini: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[int]]:
    return strip_segmentations(coco_mini, tmp_path_factory.mktemp("demo_box_only") / "val.json", every=2)


def test_the_mask_loss_skips_box_only_targets(stripped, coco_mini: Path, tmp_path: Path) -> None:
    ann, ids = stripped
    dm = COCOSegDataModule(train_ann=str(ann), train_images=str(coco_mini / "val2017"), image_size=96, batch_size=4,
                           num_workers=0, persistent_workers=False, box_only="keep", cache_dir=str(tmp_path / "c"))
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch.has_mask is not None and (~batch.has_mask).any() and batch.has_mask.any()
    model = YolactLite(num_classes=dm.num_classes, width=4, num_prototypes=4).eval()
    with torch.no_grad():
        losses, out = model.compute_losses(batch)
        m = batch.has_mask
        expected = mask_loss(out.mask_logits[m], batch.masks[m], batch.boxes[m], batch.mask_stride)
        everything = mask_loss(out.mask_logits, batch.masks, batch.boxes, batch.mask_stride)
        # Without the flag the all-False rows of box-only targets would be taken as empty masks.
        unflagged, _ = model.compute_losses(dataclasses.replace(batch, has_mask=None))
    torch.testing.assert_close(losses["mask_loss"], expected)
    torch.testing.assert_close(unflagged["mask_loss"], everything)
    assert not torch.isclose(expected, everything)
    # The class loss still takes every target, box-only ones included.
    torch.testing.assert_close(losses["cls_loss"], torch.nn.functional.cross_entropy(out.class_logits, batch.labels))


def test_a_trainer_fits_a_step_with_box_only_targets(stripped, coco_mini: Path, tmp_path: Path) -> None:
    ann, _ = stripped
    dm = COCOSegDataModule(train_ann=str(ann), train_images=str(coco_mini / "val2017"), image_size=96, batch_size=4,
                           num_workers=0, persistent_workers=False, box_only="keep", cache_dir=str(tmp_path / "c"))
    model = YolactLite(num_classes=80, width=4, num_prototypes=4)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = L.Trainer(accelerator="cpu", max_steps=1, limit_val_batches=0, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert dm.index_options.box_only == "keep"


@pytest.mark.slow
def test_the_key_works_through_the_cli(stripped, coco_mini: Path, tmp_path: Path) -> None:
    ann, _ = stripped
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    args = ["fit", "--config", str(ROOT / "configs" / "coco.yaml"), "--model.init_args.width", "4",
            "--model.init_args.num_prototypes", "4", "--data.image_size", "96", "--data.num_workers", "0",
            "--data.cache_dir", str(tmp_path / "cache"), "--trainer.precision", "32-true", "--trainer.accelerator", "cpu",
            "--trainer.devices", "1", "--data.train_ann", str(ann), "--data.train_images", str(coco_mini / "val2017"),
            "--data.val_ann", "null", "--data.val_images", "null", "--data.batch_size", "4",
            "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", "--trainer.strategy", "auto",
            "--trainer.logger", "false", "--data.box_only", "keep"]
    proc = subprocess.run([sys.executable, "-m", "seg_datamodule", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bad = subprocess.run([sys.executable, "-m", "seg_datamodule", *args[:-1], "sometimes"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=400)
    assert bad.returncode != 0 and "box_only" in bad.stderr
