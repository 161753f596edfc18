"""Exact counts (issue 35): evaluation counts are the batches the loop consumed, for any
``num_workers``; the report tells what augmentation cropped out from what was lost, per recipe.

The reference is the batches themselves: each carries its own counts, recorded as the loop takes it.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import lightning as L
import pytest

from seg_datamodule import COCOSegDataModule
from seg_datamodule.data.counts import ConsumedCounts, DeliveredCounts, format_report
from seg_datamodule.data.samples.dataset import COUNT_KEYS
from seg_datamodule.models import YolactLite


class _Consumed(L.Callback):
    """The counts of every evaluation batch the loops ran, per loop run."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, collections.Counter]] = []

    def _add(self, trainer: L.Trainer, batch: Any, batch_idx: int, name: str) -> None:
        if batch_idx == 0:
            self.runs.append((name, collections.Counter()))
        self.runs[-1][1].update(batch.counts)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._add(trainer, batch, batch_idx, "sanity" if trainer.sanity_checking else "val")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._add(trainer, batch, batch_idx, "test")


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_evaluation_counts_are_the_consumed_batches(demo_dir: Path, tmp_path: Path, workers: int) -> None:
    demo = demo_dir / "annotations" / "instances_val2017.json"
    dm = COCOSegDataModule(demo_dir=str(demo_dir), image_size=96, batch_size=4, val_batch_size=3,
                           num_workers=workers, persistent_workers=False, cache_dir=str(tmp_path / "cache"))
    consumed = _Consumed()
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=1, limit_val_batches=2,
                        limit_test_batches=2, num_sanity_val_steps=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, callbacks=[consumed])
    model = YolactLite(num_classes=dm.num_classes, width=4, num_prototypes=4)
    trainer.fit(model, datamodule=dm)
    (sanity, first), (val, second) = consumed.runs
    assert sanity == "sanity" and val == "val" and first["samples"] == 3 and second["samples"] == 6
    # The last validation run's two batches, not the sanity check's nor what workers built ahead.
    assert dm.skip_counts["val"] == {key: second.get(key, 0) for key in COUNT_KEYS}
    assert dm.skip_counts["val"]["kept"] > 0

    dm.test_ann, dm.test_images = str(demo), str(demo_dir / "val2017")
    trainer.test(model, datamodule=dm, verbose=False)
    name, tested = consumed.runs[-1]
    assert name == "test" and dm.skip_counts["test"] == {key: tested.get(key, 0) for key in COUNT_KEYS}


def test_a_second_validate_call_reports_its_own_counts(demo_dir: Path, tmp_path: Path) -> None:
    """Two ``trainer.validate`` calls on one Trainer (same step, same epoch): the report after the
    second holds the second call's batches alone, not the sum of both."""
    dm = COCOSegDataModule(demo_dir=str(demo_dir), image_size=96, val_batch_size=3, num_workers=0,
                           cache_dir=str(tmp_path / "cache"))
    consumed = _Consumed()
    trainer = L.Trainer(accelerator="cpu", limit_val_batches=2, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[consumed])
    model = YolactLite(num_classes=dm.num_classes, width=4, num_prototypes=4)
    trainer.validate(model, datamodule=dm, verbose=False)
    trainer.validate(model, datamodule=dm, verbose=False)
    (_, first), (_, second) = consumed.runs
    assert first["samples"] == second["samples"] == 6
    assert dm.skip_counts["val"] == {key: second.get(key, 0) for key in COUNT_KEYS}
    assert dm.skip_counts["val"]["kept"] == second["kept"] > 0


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_loop_of_ones_own_counts_what_lightning_counts(demo_dir: Path, tmp_path: Path, workers: int) -> None:
    """Issue 52: iterating ``dm.val_dataloader()`` by hand left ``skip_counts["val"]`` at 0."""
    demo = demo_dir / "annotations" / "instances_val2017.json"
    dm = COCOSegDataModule(demo_dir=str(demo_dir), image_size=96, val_batch_size=3, num_workers=workers,
                           persistent_workers=False, cache_dir=str(tmp_path / "cache"))
    for split in ("val", "test"):
        if split == "test":  # the demo's val file as a test split, as above
            dm.test_ann, dm.test_images = str(demo), str(demo_dir / "val2017")
        dm.setup("validate" if split == "val" else "test")
        loader = dm.val_dataloader() if split == "val" else dm.test_dataloader()
        taken: collections.Counter[str] = collections.Counter()
        first: dict[str, int] = {}
        for k, batch in enumerate(loader):
            taken.update(batch.counts)
            first = first or dict(batch.counts)
            if k == 1:  # mid-pass: what was handed out so far, not what workers built ahead
                assert dm.skip_counts[split] == {key: taken.get(key, 0) for key in COUNT_KEYS}
        by_hand = dm.skip_counts[split]
        assert by_hand == {key: taken.get(key, 0) for key in COUNT_KEYS} and by_hand["kept"] > 0
        for _ in zip(range(1), loader):  # a new pass starts afresh
            pass
        assert dm.skip_counts[split] == {key: first.get(key, 0) for key in COUNT_KEYS}

        # Lightning's loop over the whole split: the same numbers
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
        model = YolactLite(num_classes=dm.num_classes, width=4, num_prototypes=4)
        (trainer.validate if split == "val" else trainer.test)(model, datamodule=dm, verbose=False)
        assert dm.skip_counts[split] == by_hand


def test_consumed_counts_start_afresh_per_run() -> None:
    counts = ConsumedCounts()
    counts.add("val", "sanity", {"kept": 5})
    counts.add("val", ("fit", 10, 0), {"kept": 2})
    counts.add("val", ("fit", 10, 0), {"kept": 3, "image_missing": 1})
    counts.add("test", ("test", 10, 0), {"kept": 7})
    assert counts.counts("val") == {"kept": 5, "image_missing": 1} and counts.counts("test") == {"kept": 7}
    counts.reset("val")
    assert counts.counts("val") == {} and counts.counts("other") == {}
    counts.start("test", "empty pass")  # a pass that yields nothing reports nothing, not the last pass
    assert counts.counts("test") == {}


def test_the_annotations_page_quotes_the_reports_train_line(demo_dir: Path, tmp_path: Path) -> None:
    """docs/concepts/annotations.md quotes the train line of three demo steps of 4 images at 128 px."""
    page = (Path(__file__).resolve().parents[2] / "docs/concepts/annotations.md").read_text()
    quoted = " ".join(page.split("Three demo steps of 4 images at 128 px: `")[1].split("`")[0].split())
    dm = COCOSegDataModule(demo_dir=str(demo_dir), image_size=128, batch_size=4, num_workers=0,
                           cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    for _, _batch in zip(range(3), dm.train_dataloader()):
        pass
    assert quoted.startswith("train: ") and quoted in dm.report().splitlines()


def test_the_report_tells_crops_from_losses_per_recipe(demo_dir: Path, tmp_path: Path) -> None:
    lines = {}
    for recipe in ("mosaic", "lsj"):
        dm = COCOSegDataModule(demo_dir=str(demo_dir), image_size=96, batch_size=8, num_workers=0, recipe=recipe,
                               cache_dir=str(tmp_path / "cache"))
        dm.setup("fit")
        for _, _batch in zip(range(3), dm.train_dataloader()):
            pass
        lines[recipe] = dm.report()
    mosaic, lsj = lines["mosaic"], lines["lsj"]
    # The crop is the augmentation working: named as such, apart from what was lost.
    assert "cropped out by the mosaic / affine crop:" in mosaic and "outside the canvas" in mosaic
    assert "; nothing lost" in mosaic.splitlines()[-2] and "dropped by augmentation or loading" not in mosaic
    assert "recipe='mosaic', mosaic_partners='uniform'" in mosaic  # the default, named
    assert "cropped out by the LSJ crop:" in lsj and "mosaic_partners" not in lsj and "recipe='lsj'" in lsj


def test_format_report_by_hand() -> None:
    report = format_report({
        "train_index": {"polygon_too_few_points": 2},
        "train": {"kept": 10, "outside": 6, "clipped": 1, "degenerate": 1, "bad_image": 3, "image_missing": 1,
                  "pasted": 2},
        "val": {"kept": 4},
    }, recipe="lsj")
    assert report.splitlines() == [
        "train_index: skipped 2 annotations (polygon_too_few_points 2)",
        "train: 10 annotations delivered as targets (2 pasted); cropped out by the LSJ crop: 7 (outside the canvas 6, "
        "clipped below min_area_ratio 1); lost 1 image (image_missing 1) and 4 annotations (bad_image 3, degenerate 1)",
        "val: 4 annotations delivered as targets; nothing lost",
    ]


def test_delivered_counts_resumed_on_another_world_size_keep_the_runs_total() -> None:
    saved = [{"kept": 5, "clipped": 1}, {"kept": 7}]  # two ranks' consumed counts
    one = DeliveredCounts()
    one.load(saved, rank=0, world_size=1)  # both ranks' counts on the one rank left
    assert dict(one.total) == {"kept": 12, "clipped": 1}
    four = [DeliveredCounts() for _ in range(4)]
    for rank, counts in enumerate(four):
        counts.load(saved, rank=rank, world_size=4)
    assert [dict(c.total) for c in four] == [{"kept": 5, "clipped": 1}, {"kept": 7}, {}, {}]
    same = DeliveredCounts()
    same.load(saved, rank=1)  # the saving run's world size: this rank's own
    assert dict(same.total) == {"kept": 7}
    with pytest.raises(ValueError, match="holds counts of 2 ranks, this is rank 2 of 2"):
        DeliveredCounts().load(saved, rank=2)
