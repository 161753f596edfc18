"""The DataModule's data sources: which splits a stage builds, the categories, the demo data, the held-out sets.

A mixin of :class:`~seg_datamodule.data.datamodule.COCOSegDataModule` (its ``__init__`` sets the
attributes read here); kept apart so each module holds one concern.

Each stage builds only the splits it reads (:data:`STAGE_SPLITS`): ``validate``, ``test`` and
``predict`` work from a DataModule naming only their own split. The demo dataset stands in only
when no split at all is named. The DataModule's categories (label ``k`` is the ``k``-th smallest
id) are those of the first split named of train (its file or stream), val, test and predict's
JSON; without one (a folder to predict) they come from the checkpoint restored
(:meth:`DataSources.restore_categories`). Every source must agree, or setup raises a
:class:`~seg_datamodule.data.splits.CategoryMismatchError` naming both.

A split comes from a COCO JSON and its image folder (:meth:`~seg_datamodule.io.coco.CocoIndex.build`)
or from an Ultralytics ``data.yaml`` (``dataset`` with ``train_split`` / ``val_split`` /
``test_split``, :func:`~seg_datamodule.io.yolo.build_yolo_index`, its categories its ``names``);
both give the same index. Which COCO file scores a stage is :meth:`DataSources.evaluation_file`
(for a data.yaml split, a ground truth written from its labels).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from seg_datamodule.data.dataset import SegDataset
from seg_datamodule.data.options import AugmentOptions, StreamOptions
from seg_datamodule.data.predict import PredictDataset
from seg_datamodule.data.splits import CategoryMismatchError, check_categories, check_split_images
from seg_datamodule.demo.data import ensure_demo_dataset
from seg_datamodule.errors import UserInputError
from seg_datamodule.io.coco import CocoIndex, IndexOptions
from seg_datamodule.io.predict_source import images_from_index, list_image_folder
from seg_datamodule.io.yolo import DatasetYaml, build_yolo_index, ground_truth, read_dataset_yaml

__all__ = ["CategoriesUnknownError", "DataSources", "MissingSplitError", "SPLITS", "STAGE_SPLITS"]

#: The splits, in the order their files name the DataModule's categories.
SPLITS: tuple[str, ...] = ("train", "val", "test", "predict")
#: What each Lightning stage reads.
STAGE_SPLITS: dict[str, tuple[str, ...]] = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",),
                                            "predict": ("predict",)}


class CategoriesUnknownError(UserInputError, ValueError):
    """No split names the categories (a folder to predict) and no checkpoint was restored."""


class MissingSplitError(UserInputError, ValueError):
    """A stage whose split the DataModule does not name (``test`` without ``test_ann``)."""


class DataSources:
    """Builds the indices and held-out datasets of a ``COCOSegDataModule`` from its paths and options."""

    trainer: Any
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
    dataset_yaml: DatasetYaml | None = None  # the data.yaml, once read
    demo_dir: str | None
    seed: int
    image_size: int
    on_bad_sample: str
    index_options: IndexOptions
    augment: AugmentOptions
    stream_options: StreamOptions | None
    stream_meta: dict[str, Any] | None
    train_index: CocoIndex | None
    val_index: CocoIndex | None
    test_index: CocoIndex | None
    val_dataset: SegDataset | None
    test_dataset: SegDataset | None
    predict_dataset: PredictDataset | None
    _predict_index: CocoIndex | None
    _checkpoint_categories: tuple[list[int], list[str]] | None
    _checked_splits: set[str]

    # ------------------------------------------------------------------ which splits

    def _resolve_paths(self) -> None:
        """The demo dataset's train and val splits, when no split at all was named."""
        named = (self.train_ann, self.train_stream, self.val_ann, self.test_ann, self.predict_images, self.dataset)
        if any(value is not None for value in named):
            return
        demo = ensure_demo_dataset(self.demo_dir)
        self.train_ann, self.train_images = str(demo.train_ann), str(demo.train_images)
        self.val_ann, self.val_images = str(demo.val_ann), str(demo.val_images)

    def _stage(self) -> str | None:
        """The Trainer's stage (``"fit"``, ``"validate"``, ...), or None without a Trainer."""
        fn = None if self.trainer is None else self.trainer.state.fn
        return None if fn is None else str(getattr(fn, "value", fn))

    def _build_indices(self, stage: str | None = None) -> None:
        """Build (once) the indices ``stage`` reads; ``None``: every split named.

        Raises:
            MissingSplitError: ``fit`` without training data, ``validate`` / ``test`` without their split.
        """
        self._resolve_paths()
        if stage == "fit" and self._named("train") is None and self.train_stream is None:
            raise MissingSplitError("fit needs train_ann and train_images (or train_stream, or a data.yaml's "
                                    "train_split); this DataModule names only held-out splits")
        for split, what in (("val", "validate"), ("test", "test")):
            if stage == what and self._named(split) is None:
                raise MissingSplitError(f"{what} needs {split}_ann and {split}_images (or a data.yaml's {split}_split)")
        for split in STAGE_SPLITS.get(stage or "", SPLITS):
            self._split_index(split)

    def _split_index(self, split: str) -> CocoIndex | None:
        """The split's index, built once (its JSON only), its categories checked; None when not named."""
        if split == "train" and self.train_stream is not None:
            self._stream()
            return None
        ann = self._named(split)
        attribute = "_predict_index" if split == "predict" else f"{split}_index"
        if ann is None or getattr(self, attribute) is not None:
            return getattr(self, attribute)
        # Held-out splits keep their negatives: dropping them would bias the evaluation.
        extra = {} if split == "train" else {"drop_empty": False}
        if self.dataset is not None and split != "predict":
            index = build_yolo_index(self.dataset, getattr(self, f"{split}_split"), self.index_options, **extra)
        else:
            index = CocoIndex.build(ann, getattr(self, f"{split}_images"), self.index_options, **extra)
        reference = self._categories(before=split)
        if reference is not None:
            check_categories(ann, index.category_ids, reference[0], reference[2])
        setattr(self, attribute, index)
        return index

    def _named(self, split: str) -> str | None:
        """What names ``split``: its COCO JSON, or ``"<data.yaml> [<split name>]"``; None when not named."""
        if self.dataset is None or split == "predict":  # predict_ann: a COCO JSON's images, either way
            return getattr(self, f"{split}_ann")
        name = getattr(self, f"{split}_split")
        return None if name is None else f"{self.dataset} [{name}]"

    def _stream(self) -> dict[str, Any]:
        if self.stream_meta is None:
            from seg_datamodule.io.stream import check_stream_source  # LitData is an optional extra

            # Metadata and index.json checked before LitData reads anything (issue 29).
            assert self.stream_options is not None and self.train_stream is not None
            self.stream_meta = check_stream_source(self.train_stream, self.stream_options.storage_options)
        return self.stream_meta

    def _check_images(self, stage: str) -> None:
        """Each split ``stage`` reads, once: stop on no image to use, warn on many missing (issue 35)."""
        for split in STAGE_SPLITS.get(stage, ()):
            index = None if split == "train" and self.train_stream is not None else self._split_index(split)
            if index is None or split in self._checked_splits:
                continue
            self._checked_splits.add(split)
            warning = check_split_images(index, f"{split}_split" if self.dataset is not None else f"{split}_images")
            if warning is not None:
                rank_zero_warn(warning)

    # ------------------------------------------------------------------ categories

    def _categories(self, before: str | None = None) -> tuple[list[int], list[str], str] | None:
        """``(ids, names, source)``: the first split named (before ``before``), else the checkpoint's."""
        self._resolve_paths()
        if self.dataset is not None and self.train_stream is None:  # every split of a data.yaml: its names
            if self.dataset_yaml is None:
                self.dataset_yaml = read_dataset_yaml(self.dataset)
            names = list(self.dataset_yaml.class_names)
            return list(range(len(names))), names, str(self.dataset)
        for split in SPLITS:
            if split == before:
                break
            if split == "train" and self.train_stream is not None:
                meta = self._stream()
                return [int(c) for c in meta["category_ids"]], list(meta["class_names"]), self.train_stream
            index = self._split_index(split)
            if index is not None:
                return index.category_ids.tolist(), index.class_names, str(self._named(split))
        if self._checkpoint_categories is not None:
            return (*self._checkpoint_categories, "the checkpoint restored")
        return None

    def _known_categories(self) -> tuple[list[int], list[str], str]:
        categories = self._categories()
        if categories is None:
            raise CategoriesUnknownError(
                f"no split names the categories (predict_images {self.predict_images!r} is a folder): restore a "
                "checkpoint saved by this DataModule (ckpt_path), or give predict_ann or train_ann")
        return categories

    @property
    def category_ids(self) -> list[int]:
        """COCO category id of each label ``0..C-1`` (sorted; see the module docstring for the source)."""
        return [int(c) for c in self._known_categories()[0]]

    @property
    def num_classes(self) -> int:
        """C, the number of categories (contiguous labels ``0..C-1``)."""
        return len(self._known_categories()[0])

    @property
    def class_names(self) -> list[str]:
        """Category names in label order."""
        return list(self._known_categories()[1])

    @property
    def category_source(self) -> str | None:
        """Where the categories come from (a file, the stream, ``"the checkpoint restored"``), or None yet."""
        categories = self._categories()
        return None if categories is None else categories[2]

    def categories_state(self) -> dict[str, Any]:
        """``{"categories": {"ids", "names"}}`` for a checkpoint; empty while none are known."""
        categories = self._categories()
        return {} if categories is None else {"categories": {"ids": categories[0], "names": categories[1]}}

    def restore_categories(self, state: dict[str, Any]) -> None:
        """Take a checkpoint's categories (:meth:`categories_state`), or check them against the files'.

        Raises:
            CategoryMismatchError: the files' category ids differ from the checkpoint's.
        """
        saved = state.get("categories")
        if not isinstance(saved, dict):
            return  # saved before categories were kept: the files' stand
        ids, names = [int(c) for c in saved["ids"]], [str(n) for n in saved["names"]]
        self._checkpoint_categories = None
        files = self._categories()
        if files is not None and files[0] != ids:
            raise CategoryMismatchError(
                f"{files[2]}: category ids {files[0]} differ from those the checkpoint was trained on: {ids}; "
                "labels would not match")
        self._checkpoint_categories = (ids, names)

    def evaluation_file(self, stage: str) -> str | None:
        """The COCO / LVIS JSON that scores ``stage``: ``val_ann`` for fit and validate, ``test_ann``
        for test; None for predict, or a stage without one (what every model's metric reads).

        For a data.yaml split, a COCO ground truth written from the split's index
        (:func:`~seg_datamodule.io.yolo.ground_truth`, in the index cache's folder), once the
        stage is set up: the same COCO AP as for a COCO file.
        """
        self._resolve_paths()
        if self.dataset is not None:
            index = {"fit": self.val_index, "validate": self.val_index, "test": self.test_index}.get(stage)
            options = self.index_options
            return None if index is None else str(ground_truth(index, options.cache_dir, options.use_cache))
        return {"fit": self.val_ann, "validate": self.val_ann, "test": self.test_ann}.get(stage)

    # ------------------------------------------------------------------ held-out datasets

    def _setup_val(self) -> None:
        if self.val_index is not None and self.val_dataset is None:
            self.val_dataset = SegDataset(self.val_index, self.augment, train=False, seed=self.seed)

    def _setup_test(self) -> None:
        if self.test_dataset is None and self._split_index("test") is not None:
            assert self.test_index is not None
            self.test_dataset = SegDataset(self.test_index, self.augment, train=False, seed=self.seed)

    def _setup_predict(self) -> None:
        if self.predict_images is None or self.predict_dataset is not None:
            return
        index = self._split_index("predict")
        images = (list_image_folder(self.predict_images) if index is None else
                  images_from_index(index, self.predict_images, str(self.predict_ann)))
        self.predict_dataset = PredictDataset(images, image_size=self.image_size, on_bad_sample=self.on_bad_sample)
