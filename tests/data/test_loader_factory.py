"""The loader factory alone (issue 36): built from option objects and an index on coco-mini, no DataModule.

The references: the DataModule's own batches for the same keys (the factory is what it uses, so
the two must agree field by field), the factory's own uninterrupted run for a resumed loader, and
coco-mini's file for the order of the validation batches.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from seg_datamodule import COCOSegDataModule
from seg_datamodule.data.loaders.build import AUTO_CACHE_MAX_IMAGES, LoaderContext, LoaderFactory
from seg_datamodule.data.config.options import AugmentOptions, LoaderOptions
from seg_datamodule.io.coco import CocoIndex, IndexOptions
from seg_datamodule.transforms.layouts.mosaic import MosaicAffine

SIZE, BATCH = 96, 4


def _files(coco_mini: Path) -> tuple[str, str]:
    return str(coco_mini / "annotations" / "instances_val2017.json"), str(coco_mini / "val2017")


def _factory(coco_mini: Path, tmp_path: Path) -> tuple[LoaderFactory, CocoIndex]:
    ann, images = _files(coco_mini)
    index = CocoIndex.build(ann, images, IndexOptions(cache_dir=str(tmp_path / "cache")))
    augment = AugmentOptions(MosaicAffine(image_size=SIZE, degrees=5.0), mosaic=1.0, mixup=0.5)
    options = LoaderOptions(batch_size=BATCH, val_batch_size=5, num_workers=0, pin_memory=False,
                            persistent_workers=False)
    return LoaderFactory(augment, options, seed=3), index


def _same(a: Any, b: Any) -> bool:
    """Every field of two ``DetectionBatch`` equal (tensors exactly)."""
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.shape == y.shape and torch.equal(x, y)):
                return False
        elif x != y:
            return False
    return True


def _take(loader: Any, n: int) -> list[Any]:
    it = iter(loader)
    return [next(it) for _ in range(n)]


def test_the_factory_alone_makes_the_datamodules_batches(coco_mini: Path, tmp_path: Path) -> None:
    factory, index = _factory(coco_mini, tmp_path)
    dataset = factory.setup_train(index, cache_images=None, max_epochs=None)
    assert dataset.cache_images == (len(index) if len(index) <= AUTO_CACHE_MAX_IMAGES else 0)
    alone = _take(factory.train_loader_for(LoaderContext()), 3)

    ann, images = _files(coco_mini)
    dm = COCOSegDataModule(train_ann=ann, train_images=images, image_size=SIZE, degrees=5.0, mixup=0.5,
                           batch_size=BATCH, num_workers=0, pin_memory=False, persistent_workers=False, seed=3,
                           cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    assert dm.loaders.train_dataset is dm.train_dataset  # the DataModule's loaders are its factory's
    held = _take(dm.train_dataloader(), 3)
    assert all(_same(a, b) for a, b in zip(alone, held, strict=True))
    assert sum(int(b.boxes_per_image.sum()) for b in alone) > 0  # batches with targets, not empty ones

    # The loader options have one home: a new value (as loader-bench sets num_workers) reaches the loaders.
    dm.loader_options = dataclasses.replace(dm.loader_options, batch_size=2)
    assert dm.loaders.loader_options.batch_size == 2 and dm.batch_size == 2
    assert len(next(iter(dm.train_dataloader())).image_ids) == 2


def test_a_kept_loader_state_resumes_where_the_run_stopped(coco_mini: Path, tmp_path: Path) -> None:
    factory, index = _factory(coco_mini, tmp_path)
    factory.setup_train(index, cache_images=0, max_epochs=None)
    assert factory.loader_state() == {}  # no loader yet
    whole = _take(factory.train_loader_for(LoaderContext()), 4)

    stopped, _ = _factory(coco_mini, tmp_path)
    stopped.setup_train(index, cache_images=0, max_epochs=None)
    _take(stopped.train_loader_for(LoaderContext()), 2)
    state = stopped.loader_state()

    resumed, _ = _factory(coco_mini, tmp_path)
    resumed.setup_train(index, cache_images=0, max_epochs=None)
    resumed.keep_loader_state(state)
    again = _take(resumed.train_loader_for(LoaderContext()), 2)
    assert all(_same(a, b) for a, b in zip(whole[2:], again, strict=True))


def test_the_validation_loader_keeps_the_files_order(coco_mini: Path, tmp_path: Path) -> None:
    factory, index = _factory(coco_mini, tmp_path)
    assert factory.eval_loader("val", LoaderContext()) == []  # not set up: nothing to validate
    factory.setup_eval("val", index)
    ids = [int(i) for batch in factory.eval_loader("val", LoaderContext()) for i in batch.image_ids]
    assert ids == [int(i) for i in index.image_ids]
    listed = {image["id"] for image in json.loads(Path(_files(coco_mini)[0]).read_text())["images"]}
    assert set(ids) <= listed


def test_predict_without_images_is_refused(coco_mini: Path, tmp_path: Path) -> None:
    factory, _ = _factory(coco_mini, tmp_path)
    assert factory.setup_predict(None, "raise") is None
    with pytest.raises(ValueError, match="predict needs predict_images"):
        factory.predict_loader(LoaderContext())
    with pytest.raises(RuntimeError, match="setup_train"):
        factory.train_loader_for(LoaderContext())
