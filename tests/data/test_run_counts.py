"""Run counts alone (issue 36): built over sources and a loader factory on coco-mini, no DataModule.

The references: the counts each batch carries (summed here as the batches are taken) and the
index's own counts; nothing is lost: every annotation of a validation image is kept or counted
under a reason (compared with coco-mini's JSON).
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

from seg_datamodule.data.samples.dataset import COUNT_KEYS, DROP_REASONS
from seg_datamodule.data.loaders.build import LoaderContext, LoaderFactory
from seg_datamodule.data.config.options import AugmentOptions, LoaderOptions
from seg_datamodule.data.report import RunCounts
from seg_datamodule.data.splits.sources import SplitPaths, SplitSources
from seg_datamodule.io.coco import IndexOptions
from seg_datamodule.transforms.layouts.mosaic import MosaicAffine


def _counts(coco_mini: Path, tmp_path: Path) -> RunCounts:
    ann, images = str(coco_mini / "annotations" / "instances_val2017.json"), str(coco_mini / "val2017")
    sources = SplitSources(SplitPaths(train_ann=ann, train_images=images, val_ann=ann, val_images=images),
                           IndexOptions(cache_dir=str(tmp_path / "cache")))
    sources.build("fit")
    loaders = LoaderFactory(AugmentOptions(MosaicAffine(image_size=96)),
                            LoaderOptions(batch_size=4, val_batch_size=8, num_workers=0, pin_memory=False,
                                          persistent_workers=False))
    loaders.setup_train(sources.train_index, cache_images=0, max_epochs=None)
    loaders.setup_eval("val", sources.val_index)
    return RunCounts(sources, loaders)


def test_train_counts_are_the_batches_delivered(coco_mini: Path, tmp_path: Path) -> None:
    counts = _counts(coco_mini, tmp_path)
    assert counts.skip_counts()["train"] == dict.fromkeys(COUNT_KEYS, 0)  # nothing delivered yet
    taken: collections.Counter[str] = collections.Counter()
    for _, batch in zip(range(3), counts.loaders.train_loader_for(LoaderContext())):
        taken.update(batch.counts)
    out = counts.skip_counts()
    assert out["train"] == {key: taken.get(key, 0) for key in COUNT_KEYS} and taken["kept"] > 0
    index = counts.sources.train_index
    assert out["train_index"] == {**index.skip_counts, **index.dropped_counts}
    assert str(taken["kept"]) in counts.report()


def test_every_validation_annotation_is_kept_or_counted(coco_mini: Path, tmp_path: Path) -> None:
    counts = _counts(coco_mini, tmp_path)
    seen: list[int] = []
    for batch in counts.loaders.eval_loader("val", LoaderContext()):  # a loop of one's own: the loader counts
        seen += [int(i) for i in batch.image_ids]
    val = counts.skip_counts()["val"]
    data = json.loads((coco_mini / "annotations" / "instances_val2017.json").read_text())
    read = sum(1 for a in data["annotations"] if a["image_id"] in set(seen) and not a.get("iscrowd", 0))
    index = counts.sources.val_index
    left_out = index.dropped_counts["box_only"] + sum(index.skip_counts.values())  # left out at setup
    assert sum(val.get(reason, 0) for reason in {"kept", *DROP_REASONS}) + left_out == read and val["kept"] > 0
