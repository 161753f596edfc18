"""The DataModule's data sources: the demo data, the indices, the categories, the test and predict splits.

A mixin of :class:`~seg_datamodule.data.datamodule.COCOSegDataModule` (its ``__init__`` sets the
attributes read here); kept apart so each module holds one concern.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seg_datamodule.data.dataset import SegDataset
from seg_datamodule.data.options import AugmentOptions, StreamOptions
from seg_datamodule.data.predict import PredictDataset
from seg_datamodule.data.splits import build_predict_images, build_test_index
from seg_datamodule.demo.data import ensure_demo_dataset
from seg_datamodule.io.coco import CocoIndex, IndexOptions

__all__ = ["DataSources"]


class DataSources:
    """Builds the indices and held-out datasets of a ``COCOSegDataModule`` from its paths and options."""

    train_ann: str | None
    train_images: str | None
    val_ann: str | None
    val_images: str | None
    test_ann: str | None
    test_images: str | None
    predict_images: str | None
    predict_ann: str | None
    train_stream: str | None
    demo_dir: str | None
    seed: int
    index_options: IndexOptions
    augment: AugmentOptions
    stream_options: StreamOptions | None
    stream_meta: dict[str, Any] | None
    train_index: CocoIndex | None
    val_index: CocoIndex | None
    test_index: CocoIndex | None
    test_dataset: SegDataset | None
    predict_dataset: PredictDataset | None

    def _resolve_paths(self) -> None:
        """Fill in the demo dataset's paths when no training data was given."""
        if self.train_ann is not None or self.train_stream is not None:
            return
        demo = ensure_demo_dataset(self.demo_dir)
        self.train_ann, self.train_images = str(demo.train_ann), str(demo.train_images)
        if self.val_ann is None:
            self.val_ann, self.val_images = str(demo.val_ann), str(demo.val_images)

    def _build_indices(self) -> None:
        self._resolve_paths()
        if self.train_stream is not None and self.stream_meta is None:
            from seg_datamodule.io.stream import check_stream_source  # LitData is an optional extra

            # Metadata and index.json checked before LitData reads anything (issue 29).
            assert self.stream_options is not None
            self.stream_meta = check_stream_source(self.train_stream, self.stream_options.storage_options)
        elif self.train_stream is None and self.train_index is None:
            self.train_index = CocoIndex.build(self.train_ann, self.train_images, self.index_options)
        if self.val_ann is not None and self.val_index is None:
            # Validation keeps its negatives: dropping them would bias the evaluation.
            self.val_index = CocoIndex.build(self.val_ann, self.val_images, self.index_options, drop_empty=False)
            train_ids, val_ids = np.asarray(self._train_categories()[0]), self.val_index.category_ids
            if not np.array_equal(train_ids, val_ids):
                # Labels are positions in each file's sorted category ids: they must agree.
                raise ValueError(
                    f"{self.val_ann}: category ids {val_ids.tolist()} differ from those of "
                    f"{self.train_ann or self.train_stream}: {train_ids.tolist()}; validation labels would not match"
                )

    def _train_categories(self) -> tuple[list[int], list[str]]:
        if self.stream_meta is not None:
            return list(self.stream_meta["category_ids"]), list(self.stream_meta["class_names"])
        assert self.train_index is not None
        return self.train_index.category_ids.tolist(), self.train_index.class_names

    @property
    def category_ids(self) -> list[int]:
        """COCO category id of each label ``0..C-1`` (the training data's ids, sorted)."""
        self._build_indices()
        return [int(c) for c in self._train_categories()[0]]

    @property
    def num_classes(self) -> int:
        """C, the number of categories (contiguous labels ``0..C-1``) of the training data."""
        self._build_indices()
        return len(self._train_categories()[0])

    @property
    def class_names(self) -> list[str]:
        """Category names in label order."""
        self._build_indices()
        return self._train_categories()[1]

    def _setup_test(self) -> None:
        if self.test_ann is None or self.test_dataset is not None:
            return
        train = str(self.train_ann or self.train_stream)
        self.test_index = build_test_index(self.test_ann, self.test_images, self.index_options, self.category_ids,
                                           train)
        self.test_dataset = SegDataset(self.test_index, self.augment, train=False, seed=self.seed)

    def _setup_predict(self) -> None:
        if self.predict_images is None or self.predict_dataset is not None:
            return
        images = build_predict_images(self.predict_images, self.predict_ann, self.index_options, self.category_ids,
                                      str(self.train_ann or self.train_stream))
        self.predict_dataset = PredictDataset(images, image_size=self.image_size, on_bad_sample=self.on_bad_sample)
