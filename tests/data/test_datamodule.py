"""COCOSegDataModule: batches, determinism, sharding, resume, counts, the CLI and DDP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer

from _recorder import BatchRecorder, read_rows
from seg_datamodule import DetectionBatch
from seg_datamodule.data.datamodule import COCOSegDataModule
from seg_datamodule.data.config.options import MAX_AUTO_WORKERS, LoaderOptions, auto_num_workers
from seg_datamodule.models import YolactLite
from seg_datamodule.data.loaders.sampler import EpochShardSampler

ROOT = Path(__file__).resolve().parents[2]


def make_dm(demo_dir: Path, tmp_path: Path, **kwargs) -> COCOSegDataModule:
    defaults = dict(image_size=128, batch_size=4, num_workers=0, demo_dir=str(demo_dir),
                    cache_dir=str(tmp_path / "index-cache"), seed=3)
    return COCOSegDataModule(**(defaults | kwargs))


def batches(dm: COCOSegDataModule, n: int, epoch: int = 0) -> list[DetectionBatch]:
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(epoch)
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            break
    return out


def assert_same_batches(a: list[DetectionBatch], b: list[DetectionBatch]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for name in ("images", "boxes", "labels", "masks", "boxes_per_image", "image_ids", "ignore_masks"):
            assert torch.equal(getattr(x, name), getattr(y, name)), name


def test_demo_batches_and_validation_metadata(demo_dir, tmp_path):
    dm = make_dm(demo_dir, tmp_path)
    assert dm.num_classes == 4 and dm.class_names == ["disc", "square", "triangle", "star"]
    dm.setup("fit")
    assert dm.train_dataset.cache_images == 48  # a small dataset is cached whole by default
    (batch,) = batches(dm, 1)
    assert batch.images.shape == (4, 3, 128, 128) and batch.masks.shape[1:] == (32, 32)
    assert batch.masks.shape[0] == int(batch.boxes_per_image.sum()) == len(batch.labels)
    assert batch.labels.max() < 4
    val = next(iter(dm.val_dataloader()))
    sizes = {int(i): (int(h), int(w)) for i, h, w in
             zip(dm.val_index.image_ids, dm.val_index.heights, dm.val_index.widths)}
    for image_id, scale, pad, orig in zip(val.image_ids.tolist(), val.scales.tolist(), val.pads.tolist(),
                                          val.orig_sizes.tolist()):
        h, w = sizes[image_id]
        assert tuple(orig) == (h, w)
        assert scale == pytest.approx(128 / max(h, w), rel=1e-6)
        # Centred padding: the scaled image plus twice the pad fills the canvas.
        assert w * scale + 2 * pad[0] == pytest.approx(128, abs=1.01)
        assert h * scale + 2 * pad[1] == pytest.approx(128, abs=1.01)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        COCOSegDataModule(batch_size=0)
    with pytest.raises(TypeError, match="num_workers must be an int >= 0 or 'auto', got 1.5"):
        COCOSegDataModule(num_workers=1.5)
    with pytest.raises(TypeError, match="num_workers must be an int >= 0 or 'auto', got 'Auto'"):
        COCOSegDataModule(num_workers="Auto")
    with pytest.raises(ValueError, match="num_workers must be >= 0, got -1"):
        COCOSegDataModule(num_workers=-1)
    with pytest.raises(ValueError, match="cache_images must be >= 0, got -1"):
        COCOSegDataModule(cache_images=-1)
    with pytest.raises(ValueError, match="give both train_ann and train_images"):
        COCOSegDataModule(train_ann="x.json")
    with pytest.raises(ValueError, match=r"on_bad_sample must be one of \['raise', 'skip'\]"):
        COCOSegDataModule(on_bad_sample="ignore")


@pytest.mark.slow
@pytest.mark.parametrize("cores,ranks,expected", [(2, 1, 1), (1, 1, 1), (4, 1, 3), (16, 1, 8), (16, 2, 7), (16, 4, 3),
                                                   (16, 8, 1), (64, 1, 8)])
def test_auto_num_workers_fits_the_cores_per_rank(monkeypatch, cores, ranks, expected):
    # issue 40: num_workers: 8 in every config made torch warn twice per run on a 2-core machine.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert auto_num_workers(ranks) == expected == min(MAX_AUTO_WORKERS, max(1, cores // ranks - 1))
    options = LoaderOptions(num_workers="auto")
    assert options.for_node(ranks).num_workers == expected and options.prefetch == 2
    assert LoaderOptions(num_workers=3).for_node(ranks).num_workers == 3


def test_auto_num_workers_on_this_machine_warns_of_nothing(demo_dir, tmp_path):
    dm = make_dm(demo_dir, tmp_path, num_workers="auto", persistent_workers=False)
    expected = auto_num_workers(1)
    assert dm.num_workers == expected
    loader = dm.train_dataloader()
    assert loader.num_workers == expected
    next(iter(loader))  # torch's "suggested max number of worker" check runs here (warnings are errors)


def test_same_batches_for_any_num_workers(demo_dir, tmp_path):
    runs = []
    for workers in (0, 2):
        dm = make_dm(demo_dir, tmp_path, num_workers=workers, persistent_workers=False)
        dm.setup("fit")
        runs.append(batches(dm, 4, epoch=1))
    assert_same_batches(runs[0], runs[1])


def test_epochs_differ_and_seed_matters(demo_dir, tmp_path):
    dm = make_dm(demo_dir, tmp_path)
    dm.setup("fit")
    e0, e1 = batches(dm, 2, epoch=0), batches(dm, 2, epoch=1)
    assert e0[0].image_ids.tolist() != e1[0].image_ids.tolist()
    again = make_dm(demo_dir, tmp_path)
    again.setup("fit")
    assert_same_batches(e0, batches(again, 2, epoch=0))
    other = make_dm(demo_dir, tmp_path, seed=4)
    other.setup("fit")
    # The same image and epoch, augmented from another seed (not just shuffled differently).
    assert not np.array_equal(other.train_dataset[(0, 5)].image, dm.train_dataset[(0, 5)].image)
    assert np.array_equal(again.train_dataset[(0, 5)].image, dm.train_dataset[(0, 5)].image)


@pytest.mark.parametrize("n, replicas", [(10, 3), (48, 2), (7, 1), (5, 4)])
def test_sampler_shards_are_disjoint_and_complete(n, replicas):
    for epoch in (0, 1):
        shards = []
        for rank in range(replicas):
            sampler = EpochShardSampler(range(n), num_replicas=replicas, rank=rank, seed=9)
            sampler.set_epoch(epoch)
            items = list(sampler)
            assert all(e == epoch for e, _ in items)
            shards.append([i for _, i in items])
        flat = [i for shard in shards for i in shard]
        assert sorted(set(flat)) == list(range(n))  # nothing lost
        assert len(flat) - n == (-n) % replicas  # only the documented padding repeats
        assert len({len(s) for s in shards}) == 1
    orders = []
    for epoch in (0, 1):
        sampler = EpochShardSampler(range(n), num_replicas=1, rank=0, seed=9)
        sampler.set_epoch(epoch)
        orders.append([i for _, i in sampler])
    if n > 3:
        assert orders[0] != orders[1]  # reshuffled per epoch
    with pytest.raises(ValueError, match="rank must be in"):
        EpochShardSampler(range(n), num_replicas=replicas, rank=replicas)


def _fit(dm: COCOSegDataModule, root: Path, max_epochs: int, ckpt_path: str | None = None,
         ckpt_dir: Path | None = None) -> BatchRecorder:
    from lightning.pytorch.callbacks import ModelCheckpoint

    recorder = BatchRecorder(str(root / "rec"))
    trainer = Trainer(
        accelerator="cpu", devices=1, max_epochs=max_epochs, logger=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[recorder, ModelCheckpoint(dirpath=ckpt_dir or root / "ckpt", save_last=True)],
        limit_train_batches=3, limit_val_batches=0, num_sanity_val_steps=0,
    )
    torch.manual_seed(0)
    trainer.fit(YolactLite(num_classes=dm.num_classes, width=8, num_prototypes=4), datamodule=dm,
                ckpt_path=ckpt_path)
    return recorder


@pytest.mark.slow
def test_resumed_run_continues_with_the_same_batches(demo_dir, tmp_path):
    straight = _fit(make_dm(demo_dir, tmp_path), tmp_path / "a", max_epochs=3)
    _fit(make_dm(demo_dir, tmp_path), tmp_path / "b", max_epochs=2)
    resumed = _fit(make_dm(demo_dir, tmp_path), tmp_path / "c", max_epochs=3,
                   ckpt_path=str(tmp_path / "b" / "ckpt" / "last.ckpt"), ckpt_dir=tmp_path / "b" / "ckpt")
    want = [r for r in straight.rows if r["epoch"] == 2]
    got = resumed.rows
    assert len(got) == 3 and [r["epoch"] for r in got] == [2, 2, 2]
    key = ("image_ids", "boxes_sum", "masks_sum")
    assert [[r[k] for k in key] for r in got] == [[r[k] for k in key] for r in want]


def _broken_copy(demo_dir: Path, tmp_path: Path) -> Path:
    data = json.loads((demo_dir / "annotations" / "instances_train2017.json").read_text())
    image_id = data["images"][0]["id"]
    base = max(a["id"] for a in data["annotations"]) + 1
    data["annotations"] += [
        {"id": base, "image_id": image_id, "category_id": 1, "iscrowd": 0, "area": 1.0,
         "bbox": [0, 0, 4, 4], "segmentation": [[0, 0, 4, 4]]},  # fewer than 3 points
        {"id": base + 1, "image_id": image_id, "category_id": 999, "iscrowd": 0, "area": 16.0,
         "bbox": [0, 0, 4, 4], "segmentation": [[0, 0, 4, 0, 4, 4]]},  # unknown category
    ]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    return path


def test_bad_annotations_raise_or_are_counted(demo_dir, tmp_path):
    ann = _broken_copy(demo_dir, tmp_path)
    images = str(demo_dir / "train2017")
    strict = make_dm(demo_dir, tmp_path, train_ann=str(ann), train_images=images)
    with pytest.raises(ValueError, match=r"broken\.json.*annotation id"):
        strict.setup("fit")
    lenient = make_dm(demo_dir, tmp_path, train_ann=str(ann), train_images=images, on_bad_sample="skip")
    lenient.setup("fit")
    counts = lenient.skip_counts["train_index"]
    assert sum(counts.values()) == 2, counts
    assert "2 annotations" in lenient.report()


@pytest.mark.slow
@pytest.mark.extended  # default tier: tests/demo/test_model.py::test_model_learns_with_a_real_trainer
def test_demo_model_learns(demo_dir, tmp_path):
    dm = make_dm(demo_dir, tmp_path, image_size=192, batch_size=8, close_mosaic=0)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: F401

        recorder = BatchRecorder(str(tmp_path / "rec"))
        trainer = Trainer(accelerator="cpu", max_steps=90, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, enable_checkpointing=False, callbacks=[recorder],
                          limit_val_batches=0, num_sanity_val_steps=0, log_every_n_steps=1)
        torch.manual_seed(0)
        trainer.fit(YolactLite(num_classes=dm.num_classes, width=16), datamodule=dm)
    finally:
        torch.set_num_threads(before)
    losses = [r["mask_loss"] for r in recorder.rows if r["mask_loss"] is not None]
    first, last = np.mean(losses[:5]), np.mean(losses[-10:])
    assert last < 0.5 * first, f"mask loss {first:.3f} -> {last:.3f}"


def _run_cli(args: list[str], tmp_path: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, RECORDER_DIR=str(tmp_path / "rec"),
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "seg_datamodule", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _cli_args(demo_dir: Path, tmp_path: Path) -> list[str]:
    return ["fit", "--config", str(ROOT / "configs" / "demo.yaml"),
            "--data.demo_dir", str(demo_dir), "--data.cache_dir", str(tmp_path / "index-cache"),
            "--data.image_size", "128", "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "3",
            "--trainer.check_val_every_n_epoch", "1", "--trainer.limit_val_batches", "1.0",
            "--trainer.callbacks+=_recorder.BatchRecorder"]


@pytest.mark.slow
@pytest.mark.extended  # default tier: the quick start's fit --config configs/demo.yaml (test_readme.py)
def test_cli_fit_on_the_demo_config(demo_dir, tmp_path):
    proc = _run_cli(_cli_args(demo_dir, tmp_path), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "runs" / "demo" / "version_0"
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert (run_dir / "step_time.json").is_file()
    assert (run_dir / "metrics.csv").is_file()
    summary = json.loads((run_dir / "step_time.json").read_text())["summary"]
    assert "train_dataloader_next" in summary and "optimizer_step" in summary
    assert "train_dataloader_next" in proc.stdout + proc.stderr  # the console table
    rows = read_rows(tmp_path / "rec")
    assert len(rows) == 6


@pytest.mark.slow
def test_cli_print_config(tmp_path):
    proc = _run_cli(["fit", "--config", str(ROOT / "configs" / "demo.yaml"), "--print_config"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "class_path: seg_datamodule.models.YolactLite" in proc.stdout
    assert "mask_stride: 4" in proc.stdout


@pytest.mark.slow
def test_ddp_two_processes_see_disjoint_shards(demo_dir, tmp_path):
    args = _cli_args(demo_dir, tmp_path) + [
        "--trainer.accelerator", "cpu", "--trainer.strategy", "ddp", "--trainer.devices", "2",
        "--trainer.limit_train_batches", "1.0", "--trainer.max_epochs", "2", "--data.num_workers", "0",
        "--trainer.limit_val_batches", "0",
    ]
    proc = _run_cli(args, tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_rows(tmp_path / "rec")
    assert {r["rank"] for r in rows} == {0, 1}
    demo = json.loads((demo_dir / "annotations" / "instances_train2017.json").read_text())
    all_ids = sorted(im["id"] for im in demo["images"])
    for epoch in (0, 1):
        per_rank = [[i for r in rows if r["epoch"] == epoch and r["rank"] == rank for i in r["image_ids"]]
                    for rank in (0, 1)]
        assert not set(per_rank[0]) & set(per_rank[1])  # 48 images, 2 ranks: no padding needed
        assert sorted(per_rank[0] + per_rank[1]) == all_ids
    epoch_orders = [[i for r in rows if r["epoch"] == e and r["rank"] == 0 for i in r["image_ids"]] for e in (0, 1)]
    assert epoch_orders[0] != epoch_orders[1]


def test_validation_categories_must_match_training(demo_dir, tmp_path):
    data = json.loads((demo_dir / "annotations" / "instances_val2017.json").read_text())
    data["categories"] = data["categories"][1:]
    dropped = {c["id"] for c in json.loads(
        (demo_dir / "annotations" / "instances_val2017.json").read_text())["categories"]} - {
        c["id"] for c in data["categories"]}
    data["annotations"] = [a for a in data["annotations"] if a["category_id"] not in dropped]
    ann = tmp_path / "val_subset.json"
    ann.write_text(json.dumps(data))
    dm = make_dm(demo_dir, tmp_path, train_ann=str(demo_dir / "annotations" / "instances_train2017.json"),
                 train_images=str(demo_dir / "train2017"), val_ann=str(ann),
                 val_images=str(demo_dir / "val2017"))
    with pytest.raises(ValueError, match=r"val_subset\.json: category ids .* differ"):
        dm.setup("fit")


@pytest.mark.slow
def test_setup_before_fit_still_closes_mosaic(demo_dir, tmp_path):
    dm = make_dm(demo_dir, tmp_path, close_mosaic=1)
    dm.setup("fit")  # no Trainer yet: max_epochs unknown
    with pytest.raises(RuntimeError, match="close_mosaic=1 needs max_epochs"):
        dm.train_dataset.mosaic_active(0)
    _fit(dm, tmp_path, max_epochs=2)
    assert dm.train_dataset.mosaic_active(0) and not dm.train_dataset.mosaic_active(1)
