"""LVIS through the data path: federated lists in samples and batches, mosaics, and a DataModule
run with repeat-factor sampling and LVIS AP (in process and through configs/lvis.yaml)."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lightning.pytorch import Callback, LightningModule, Trainer

from _datasets import make_dataset
from seg_datamodule import DetectionCollate, EpochShardSampler
from seg_datamodule.data.samples.targets import federated_labels
from seg_datamodule.data.datamodule import COCOSegDataModule
from seg_datamodule.data.loaders.repeat_factors import scheduled_steps
from seg_datamodule.io.coco import CocoIndex
from seg_datamodule.models import YolactLite
from _lvis import load_json, write_images, write_v1

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lvis_v1(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The v1-style copy of lvis_val_100.json and a COCO root with generated images."""
    root = tmp_path_factory.mktemp("lvis")
    ann = write_v1(root / "lvis_v1_val_100.json")
    write_images(load_json(ann), root / "coco", from_url=True)
    return ann, root / "coco"


class _Lists:
    """A federated index of three images."""

    neg = [np.array([1, 4, 7]), np.array([4, 7, 9]), np.array([0, 4, 7])]
    ne = [np.array([2]), np.array([], np.int64), np.array([3, 2])]

    def neg_labels(self, i: int) -> np.ndarray:
        return self.neg[i]

    def not_exhaustive_labels(self, i: int) -> np.ndarray:
        return np.unique(self.ne[i])


def test_a_mosaic_is_negative_only_where_every_tile_is() -> None:
    neg, ne = federated_labels(_Lists(), np.array([0, 1, 2, 0]))
    assert neg.tolist() == [4, 7] and ne.tolist() == [2, 3]
    neg, ne = federated_labels(_Lists(), np.array([1]))
    assert neg.tolist() == [4, 7, 9] and ne.tolist() == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 12), max_size=6, unique=True),
                          st.lists(st.integers(0, 12), max_size=6, unique=True)), min_size=1, max_size=5))
def test_the_lists_equal_pairwise_intersection_and_union(lists) -> None:
    # Reference: the pairwise intersect1d / union1d over the tiles, in tile order.
    index = _Lists()
    index.neg = [np.array(sorted(n), np.int64) for n, _ in lists]
    index.ne = [np.array(sorted(e), np.int64) for _, e in lists]
    ids = np.arange(len(lists))
    want_neg, want_ne = index.neg_labels(0), index.not_exhaustive_labels(0)
    for i in ids[1:]:
        want_neg = np.intersect1d(want_neg, index.neg_labels(int(i)))
        want_ne = np.union1d(want_ne, index.not_exhaustive_labels(int(i)))
    neg, ne = federated_labels(index, ids)
    assert neg.dtype == ne.dtype == np.int64
    assert np.array_equal(neg, want_neg) and np.array_equal(ne, want_ne)


@pytest.mark.parametrize("train", [True, False])
def test_samples_and_batches_carry_the_lists_as_labels(lvis_v1: tuple[Path, Path], train: bool) -> None:
    ann, images = lvis_v1
    index = CocoIndex.build(ann, images, use_cache=False)
    ds = make_dataset(index, image_size=96, train=train, mosaic=0.0, seed=1)
    picks = [0, 5, 17, 42]
    samples = [ds[(0, i)] for i in picks]
    for i, sample in zip(picks, samples):
        assert np.array_equal(sample.neg_labels, index.neg_labels(i))
        assert np.array_equal(sample.not_exhaustive_labels, index.not_exhaustive_labels(i))
    batch = DetectionCollate(mask_stride=4, shared_memory=True)(samples)
    per = batch.neg_labels.split(batch.neg_labels_per_image.tolist())
    assert [p.tolist() for p in per] == [index.neg_labels(i).tolist() for i in picks]
    per = batch.not_exhaustive_labels.split(batch.not_exhaustive_labels_per_image.tolist())
    assert [p.tolist() for p in per] == [index.not_exhaustive_labels(i).tolist() for i in picks]
    assert batch.neg_labels.dtype == torch.int64 and batch.to("cpu").neg_labels is not None


def test_mosaic_samples_keep_a_subset_of_their_first_tiles_negatives(lvis_v1: tuple[Path, Path]) -> None:
    ann, images = lvis_v1
    index = CocoIndex.build(ann, images, use_cache=False)
    ds = make_dataset(index, image_size=96, mosaic=1.0, seed=1, mosaic_partners="uniform")
    for i in (1, 2, 3):
        sample = ds[(0, i)]
        assert set(sample.neg_labels.tolist()) <= set(index.neg_labels(i).tolist())
        assert set(index.not_exhaustive_labels(i).tolist()) <= set(sample.not_exhaustive_labels.tolist())


def test_repeat_factors_need_the_loader_reloaded_each_epoch(lvis_v1: tuple[Path, Path], tmp_path: Path) -> None:
    ann, images = lvis_v1
    dm = COCOSegDataModule(train_ann=str(ann), train_images=str(images), image_size=64, num_workers=0,
                           cache_dir=str(tmp_path), repeat_factor_threshold=0.05)
    dm.trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match="reload_dataloaders_every_n_epochs=1"):
        dm.setup("fit")
    with pytest.raises(ValueError, match="repeat_factor_threshold must be in"):
        COCOSegDataModule(train_ann=str(ann), train_images=str(images), repeat_factor_threshold=0.0)
    with pytest.raises(ValueError, match="needs train_ann"):
        COCOSegDataModule(train_stream="local:/nowhere", repeat_factor_threshold=0.001)


class _StepsProbe(LightningModule):
    """Records what a schedule would be sized to; trains on nothing (each epoch ends at once)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.sizes: tuple[int | float, int | float] | None = None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        self.sizes = (self.trainer.estimated_stepping_batches, scheduled_steps(self.trainer))
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def on_train_batch_start(self, batch, batch_idx) -> int:
        return -1

    def training_step(self, batch, batch_idx):  # never reached
        raise AssertionError

    def validation_step(self, batch, batch_idx) -> None:  # no validation split here
        pass


def test_a_schedule_sees_every_epochs_own_length(lvis_v1: tuple[Path, Path], tmp_path: Path) -> None:
    """Lightning's estimate is epoch 0's draw times max_epochs; the DataModule sums each epoch's
    own draw (issue 35), the reference being the sampler's epochs drawn independently here."""
    ann, images = lvis_v1
    dm = COCOSegDataModule(train_ann=str(ann), train_images=str(images), image_size=64, batch_size=3,
                           num_workers=0, mosaic=0.0, cache_dir=str(tmp_path), repeat_factor_threshold=0.05, seed=3)
    probe = _StepsProbe()
    trainer = Trainer(accelerator="cpu", max_epochs=5, reload_dataloaders_every_n_epochs=1, logger=False,
                      limit_val_batches=0, enable_progress_bar=False, enable_checkpointing=False,
                      enable_model_summary=False)
    trainer.fit(probe, datamodule=dm)
    lengths = []
    for epoch in range(5):
        sampler = EpochShardSampler(range(len(dm.train_index)), seed=3, repeat_factors=dm.repeat_factors)
        sampler.set_epoch(epoch)
        lengths.append(math.ceil(len(sampler) / 3))
    assert probe.sizes is not None and probe.sizes[0] == 5 * lengths[0]
    assert probe.sizes[1] == sum(lengths) != probe.sizes[0]


class _EpochBatches(Callback):
    """(epoch, image ids) of every trained batch."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, list[int]]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seen.append((trainer.current_epoch, batch.image_ids.tolist()))


@pytest.mark.slow
def test_a_run_trains_each_epoch_as_drawn_and_reports_lvis_ap(lvis_v1: tuple[Path, Path], tmp_path: Path,
                                                              capfd: pytest.CaptureFixture) -> None:
    ann, images = lvis_v1
    dm = COCOSegDataModule(train_ann=str(ann), train_images=str(images), val_ann=str(ann), val_images=str(images),
                           image_size=64, batch_size=16, num_workers=0, mosaic=0.0, cache_dir=str(tmp_path),
                           repeat_factor_threshold=0.05, seed=3)
    model = YolactLite(num_classes=dm.num_classes, num_prototypes=8, width=8)
    seen = _EpochBatches()
    trainer = Trainer(accelerator="cpu", max_epochs=2, reload_dataloaders_every_n_epochs=1, limit_val_batches=2,
                      logger=False, enable_progress_bar=False, enable_checkpointing=False,
                      enable_model_summary=False, callbacks=[seen], num_sanity_val_steps=0)
    trainer.fit(model, datamodule=dm)
    # Each epoch is exactly its own draw: the sampler's items, in batches.
    index = dm.train_index
    lengths = []
    for epoch in range(2):
        sampler = EpochShardSampler(range(len(index)), seed=3, repeat_factors=dm.repeat_factors)
        sampler.set_epoch(epoch)
        want = [int(index.image_ids[i]) for _, i, _ in sampler]
        got = [i for e, ids in seen.seen if e == epoch for i in ids]
        assert got == want, epoch
        lengths.append(len(want))
    assert len(set(lengths)) > 1 and min(lengths) > len(index)  # repeats, and a length per epoch
    logged = trainer.callback_metrics
    assert {"val/segm_AP", "val/segm_APr", "val/segm_APc", "val/segm_APf"} <= set(logged)
    report = dm.report()
    assert "repeat-factor sampling (threshold 0.05): 100 images" in report
    assert f"{lengths[-1]} drawn this epoch" in report


@pytest.mark.slow
def test_cli_fit_on_the_lvis_config(lvis_v1: tuple[Path, Path], tmp_path: Path) -> None:
    ann, images = lvis_v1
    args = ["fit", "--config", str(ROOT / "configs" / "lvis.yaml"),
            "--data.train_ann", str(ann), "--data.train_images", str(images),
            "--data.val_ann", str(ann), "--data.val_images", str(images),
            "--data.cache_dir", str(tmp_path / "index-cache"), "--data.image_size", "64", "--data.batch_size", "8",
            "--data.num_workers", "0", "--data.persistent_workers", "false", "--data.pin_memory", "false",
            "--data.repeat_factor_threshold", "0.05", "--model.init_args.width", "8",
            "--trainer.precision", "32", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
            "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2",
            "--trainer.log_every_n_steps", "1"]
    proc = subprocess.run([sys.executable, "-m", "seg_datamodule", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600,
                          # This checkout's package, whatever the interpreter has installed.
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "LVIS val segm AP" in out and "repeat-factor sampling (threshold 0.05)" in out
    with open(tmp_path / "runs" / "lvis" / "version_0" / "metrics.csv", newline="") as f:
        columns = next(csv.reader(f))
    assert {"val/segm_AP", "val/segm_APr", "val/bbox_APf"} <= set(columns)
