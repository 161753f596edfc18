"""The split sources alone (issue 36): built from paths and index options on coco-mini, no DataModule.

The references: coco-mini's own JSON files (their category ids and images), a fallback that
records its calls, and the checkpoint state the sources save.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from seg_datamodule import COCOSegDataModule
from seg_datamodule.data.splits.sources import CategoriesUnknownError, MissingSplitError, SplitPaths, SplitSources
from seg_datamodule.data.splits.checks import CategoryMismatchError
from seg_datamodule.demo.data import ensure_demo_dataset
from seg_datamodule.io.coco import IndexOptions


class _Paths(NamedTuple):
    train_ann: str
    train_images: str
    val_ann: str
    val_images: str


def _val(coco_mini: Path) -> tuple[str, str]:
    return str(coco_mini / "annotations" / "instances_val2017.json"), str(coco_mini / "val2017")


def _options(tmp_path: Path) -> IndexOptions:
    return IndexOptions(cache_dir=str(tmp_path / "cache"))


def test_a_stage_builds_only_its_splits_with_the_files_categories(coco_mini: Path, tmp_path: Path) -> None:
    ann, images = _val(coco_mini)
    sources = SplitSources(SplitPaths(val_ann=ann, val_images=images, test_ann=ann, test_images=images),
                           _options(tmp_path))
    sources.build("validate")
    assert sources.val_index is not None and sources.test_index is None and sources.train_index is None
    data = json.loads(Path(ann).read_text())
    assert sources.category_ids == sorted(c["id"] for c in data["categories"])
    assert sources.num_classes == len(data["categories"]) and sources.category_source == ann
    assert set(sources.val_index.image_ids.tolist()) <= {image["id"] for image in data["images"]}
    assert sources.evaluation_file("validate") == ann and sources.evaluation_file("test") == ann
    with pytest.raises(MissingSplitError, match="fit needs train_ann"):
        sources.build("fit")


def test_the_fallback_stands_in_only_when_no_split_is_named(coco_mini: Path, tmp_path: Path) -> None:
    ann, images = _val(coco_mini)
    calls: list[Any] = []

    def fallback(demo_dir: str | None) -> _Paths:
        calls.append(demo_dir)
        return _Paths(ann, images, ann, images)

    named = SplitSources(SplitPaths(val_ann=ann, val_images=images), _options(tmp_path), fallback=fallback)
    named.build("validate")
    assert calls == [] and named.paths.train_ann is None
    empty = SplitSources(SplitPaths(), _options(tmp_path), fallback=fallback, demo_dir="somewhere")
    empty.build("fit")
    assert calls == ["somewhere"] and empty.paths.train_ann == ann and empty.train_index is not None
    with pytest.raises(MissingSplitError):  # without a fallback nothing stands in
        SplitSources(SplitPaths(), _options(tmp_path)).build("fit")


def test_the_package_wires_the_demo_in() -> None:
    assert COCOSegDataModule.fallback_splits is ensure_demo_dataset


def test_checkpoint_categories_are_checked_or_taken(coco_mini: Path, tmp_path: Path) -> None:
    ann, images = _val(coco_mini)
    sources = SplitSources(SplitPaths(val_ann=ann, val_images=images), _options(tmp_path))
    state = sources.categories_state()
    assert state["categories"]["ids"] == sources.category_ids

    folder = SplitSources(SplitPaths(predict_images=images), _options(tmp_path))
    assert folder.categories_state() == {}
    with pytest.raises(CategoriesUnknownError, match="no split names the categories"):
        folder.known_categories()
    folder.restore_categories(state)
    assert folder.category_ids == sources.category_ids and folder.category_source == "the checkpoint restored"
    assert len(folder.predict_images() or []) > 0

    other = {"categories": {"ids": [1, 2], "names": ["a", "b"]}}
    with pytest.raises(CategoryMismatchError, match="differ from those the checkpoint"):
        sources.restore_categories(other)
