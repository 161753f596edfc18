"""The DataModule's data sources: the demo data, the indices, the categories, the test and predict splits.

A mixin of :class:`~seg_datamodule.data.datamodule.COCOSegDataModule` (its ``__init__`` sets the
attributes read here); kept apart so each module holds one concern.

A split comes from a COCO JSON (``train_ann`` / ``val_ann`` / ``test_ann`` and their image
folders, :meth:`~seg_datamodule.io.coco.CocoIndex.build`) or from an Ultralytics ``data.yaml``
(``dataset`` with ``train_split`` / ``val_split`` / ``test_split``,
:func:`~seg_datamodule.io.yolo.build_yolo_index`); both give the same index. Which COCO
ground-truth file scores a stage is :meth:`DataSources.evaluation_file`.
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
from seg_datamodule.io.yolo import DatasetYaml, build_yolo_index, ground_truth, read_dataset_yaml

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
    dataset: str | None
    train_split: str | None
    val_split: str | None
    test_split: str | None
    dataset_yaml: DatasetYaml | None
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
        if self.train_ann is not None or self.train_stream is not None or self.dataset is not None:
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
        elif self.train_stream is None and self.train_index is None and self._has_split("train"):
            self.train_index = self._split_index("train")
        if self._has_split("val") and self.val_index is None:
            # Validation keeps its negatives: dropping them would bias the evaluation.
            self.val_index = self._split_index("val", drop_empty=False)
            train_ids, val_ids = np.asarray(self._train_categories()[0]), self.val_index.category_ids
            if not np.array_equal(train_ids, val_ids):
                # Labels are positions in each file's sorted category ids: they must agree.
                raise ValueError(
                    f"{self.val_ann}: category ids {val_ids.tolist()} differ from those of "
                    f"{self.train_ann or self.train_stream}: {train_ids.tolist()}; validation labels would not match"
                )

    def _has_split(self, which: str) -> bool:
        """Whether split ``which`` (``"train"``, ``"val"``, ``"test"``) is given, as a COCO JSON or a data.yaml split."""
        if self.dataset is not None:
            return {"train": self.train_split, "val": self.val_split, "test": self.test_split}[which] is not None
        return {"train": self.train_ann, "val": self.val_ann, "test": self.test_ann}[which] is not None

    def _split_index(self, which: str, **fields: object) -> CocoIndex:
        """The index of split ``which``: a data.yaml split, or a COCO JSON and its folder."""
        if self.dataset is not None:
            split = {"train": self.train_split, "val": self.val_split, "test": self.test_split}[which]
            return build_yolo_index(self.dataset, str(split), self.index_options, **fields)
        ann, images = {"train": (self.train_ann, self.train_images), "val": (self.val_ann, self.val_images),
                       "test": (self.test_ann, self.test_images)}[which]
        return CocoIndex.build(ann, images, self.index_options, **fields)

    def evaluation_file(self, stage: str) -> str | None:
        """The COCO JSON whose annotations score ``stage``, or None when it has no annotated split.

        ``"fit"`` and ``"validate"``: the validation split's, ``"test"``: the test split's. A COCO
        split's is its own file (``val_ann``, ``test_ann``); an Ultralytics split's is a COCO
        ground truth written from its index (:func:`~seg_datamodule.io.yolo.ground_truth`, in the
        index cache's folder), so ``val/segm_AP`` is the same COCO AP either way. Call it after
        ``setup(stage)``.
        """
        which = "test" if stage == "test" else "val"
        if self.dataset is None:
            return self.test_ann if which == "test" else self.val_ann
        index = self.test_index if which == "test" else self.val_index
        if index is None:
            return None
        options = self.index_options
        return str(ground_truth(index, options.cache_dir, options.use_cache))

    def _train_categories(self) -> tuple[list[int], list[str]]:
        if self.stream_meta is not None:
            return list(self.stream_meta["category_ids"]), list(self.stream_meta["class_names"])
        if self.dataset is not None:  # every split of a data.yaml has its names
            if self.dataset_yaml is None:
                self.dataset_yaml = read_dataset_yaml(self.dataset)
            names = self.dataset_yaml.class_names
            return list(range(len(names))), list(names)
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
        if not self._has_split("test") or self.test_dataset is not None:
            return
        if self.dataset is not None:
            self.test_index = self._split_index("test", drop_empty=False)
        else:
            train = str(self.train_ann or self.train_stream)
            self.test_index = build_test_index(self.test_ann, self.test_images, self.index_options,
                                               self.category_ids, train)
        self.test_dataset = SegDataset(self.test_index, self.augment, train=False, seed=self.seed)

    def _setup_predict(self) -> None:
        if self.predict_images is None or self.predict_dataset is not None:
            return
        images = build_predict_images(self.predict_images, self.predict_ann, self.index_options, self.category_ids,
                                      str(self.train_ann or self.train_stream or self.dataset))
        self.predict_dataset = PredictDataset(images, image_size=self.image_size, on_bad_sample=self.on_bad_sample)
