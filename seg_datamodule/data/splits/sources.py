"""Where a DataModule's data comes from: which splits a stage builds, the indices, the categories.

:class:`SplitSources` is a collaborator of :class:`~seg_datamodule.data.datamodule.COCOSegDataModule`,
built from the split paths (:class:`SplitPaths`) and the index options; it works alone too.

Each stage builds only the splits it reads (:data:`STAGE_SPLITS`): ``validate``, ``test`` and
``predict`` work from a DataModule naming only their own split. When no split at all is named,
the ``fallback`` given (the embedded demo dataset, for the DataModule) stands in. The
categories (label ``k`` is the ``k``-th smallest id) are those of the first split named of train
(its file or stream), val, test and predict's JSON; without one (a folder to predict) they come
from the checkpoint restored (:meth:`SplitSources.restore_categories`). Every source must agree,
or setup raises a :class:`~seg_datamodule.data.splits.checks.CategoryMismatchError` naming both.

A split comes from a COCO JSON and its image folder (:meth:`~seg_datamodule.io.coco.CocoIndex.build`)
or from an Ultralytics ``data.yaml`` (``dataset`` with ``train_split`` / ``val_split`` /
``test_split``, :func:`~seg_datamodule.io.yolo.build_yolo_index`, its categories its ``names``);
both give the same index. Which COCO file scores a stage is :meth:`SplitSources.evaluation_file`
(for a data.yaml split, a ground truth written from its labels).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from seg_datamodule.data.splits.scan import SplitScan, check_scan, scan_index
from seg_datamodule.data.splits.checks import CategoryMismatchError, check_categories, check_split_images
from seg_datamodule.errors import UserInputError
from seg_datamodule.io.coco import CocoIndex, IndexOptions
from seg_datamodule.io.predict_source import PredictImages, images_from_index, list_image_folder
from seg_datamodule.io.yolo import (DatasetYaml, build_yolo_index, crowd_as_instances_ground_truth, ground_truth,
                                    read_dataset_yaml)

__all__ = ["CategoriesUnknownError", "Fallback", "MissingSplitError", "SPLITS", "STAGE_SPLITS", "SplitPaths",
           "SplitSources"]

#: The splits, in the order their files name the DataModule's categories.
SPLITS: tuple[str, ...] = ("train", "val", "test", "predict")
#: What each Lightning stage reads.
STAGE_SPLITS: dict[str, tuple[str, ...]] = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",),
                                            "predict": ("predict",)}


class CategoriesUnknownError(UserInputError, ValueError):
    """No split names the categories (a folder to predict) and no checkpoint was restored."""


class MissingSplitError(UserInputError, ValueError):
    """A stage whose split the DataModule does not name (``test`` without ``test_ann``)."""


@dataclass(frozen=True)
class SplitPaths:
    """What names each split: the DataModule's path keys, as given (see its docstring for each)."""

    train_ann: str | None = None
    train_images: str | None = None
    val_ann: str | None = None
    val_images: str | None = None
    test_ann: str | None = None
    test_images: str | None = None
    predict_images: str | None = None
    predict_ann: str | None = None
    dataset: str | None = None
    train_split: str | None = "train"
    val_split: str | None = "val"
    test_split: str | None = "test"
    train_stream: str | None = None

    def names_a_split(self) -> bool:
        """Whether any split is named (else a fallback such as the demo dataset stands in)."""
        named = (self.train_ann, self.train_stream, self.val_ann, self.test_ann, self.predict_images, self.dataset)
        return any(value is not None for value in named)


#: What stands in when no split is named: ``fallback(demo_dir)`` returns an object with
#: ``train_ann``, ``train_images``, ``val_ann`` and ``val_images`` (the demo's ``DemoPaths``).
Fallback = Callable[[str | None], Any]


class SplitSources:
    """Builds (once) and holds the indices of the splits a stage reads, and the categories.

    Args:
        paths (SplitPaths): what names each split.
        index_options (IndexOptions): how an annotation file becomes an index.
        storage_options (dict | None): boto3 arguments for an ``s3://`` ``train_stream``.
        fallback (Fallback | None): what stands in when no split is named; None: nothing.
        demo_dir (str | None): the folder handed to ``fallback``.
        allow_no_targets (bool): let a split without a target instance through
            (:func:`~seg_datamodule.data.splits.scan.check_scan`).
    """

    def __init__(self, paths: SplitPaths, index_options: IndexOptions, storage_options: dict[str, Any] | None = None,
                 fallback: Fallback | None = None, demo_dir: str | None = None, allow_no_targets: bool = False) -> None:
        self.paths, self.index_options, self.storage_options = paths, index_options, dict(storage_options or {})
        self.allow_no_targets = allow_no_targets
        #: Each split's scan, from its first check (:mod:`~seg_datamodule.data.splits.scan`).
        self.scans: dict[str, SplitScan] = {}
        self.fallback, self.demo_dir = fallback, demo_dir
        self.dataset_yaml: DatasetYaml | None = None  # the data.yaml, once read
        self.stream_meta: dict[str, Any] | None = None
        self.train_index: CocoIndex | None = None
        self.val_index: CocoIndex | None = None
        self.test_index: CocoIndex | None = None
        self.predict_index: CocoIndex | None = None
        self.checkpoint_categories: tuple[list[int], list[str]] | None = None
        self.checked_splits: set[str] = set()

    # ------------------------------------------------------------------ which splits

    def resolve_paths(self) -> SplitPaths:
        """The paths, with the fallback's train and val splits when no split at all was named."""
        if not self.paths.names_a_split() and self.fallback is not None:
            demo = self.fallback(self.demo_dir)
            self.paths = replace(self.paths, train_ann=str(demo.train_ann), train_images=str(demo.train_images),
                                 val_ann=str(demo.val_ann), val_images=str(demo.val_images))
        return self.paths

    def build(self, stage: str | None = None) -> None:
        """Build (once) the indices ``stage`` reads; ``None``: every split named.

        Raises:
            MissingSplitError: ``fit`` without training data, ``validate`` / ``test`` without their split.
        """
        paths = self.resolve_paths()
        if stage == "fit" and self.named("train") is None and paths.train_stream is None:
            raise MissingSplitError("fit needs train_ann and train_images (or train_stream, or a data.yaml's "
                                    "train_split); this DataModule names only held-out splits")
        for split, what in (("val", "validate"), ("test", "test")):
            if stage == what and self.named(split) is None:
                raise MissingSplitError(f"{what} needs {split}_ann and {split}_images (or a data.yaml's {split}_split)")
        for split in STAGE_SPLITS.get(stage or "", SPLITS):
            self.split_index(split)

    def split_index(self, split: str) -> CocoIndex | None:
        """The split's index, built once (its JSON only), its categories checked; None when not named."""
        paths = self.paths
        if split == "train" and paths.train_stream is not None:
            self.stream()
            return None
        ann = self.named(split)
        attribute = f"{split}_index"
        if ann is None or getattr(self, attribute) is not None:
            return getattr(self, attribute)
        # Held-out splits keep their negatives: dropping them would bias the evaluation.
        extra = {} if split == "train" else {"drop_empty": False}
        if paths.dataset is not None and split != "predict":
            index = build_yolo_index(paths.dataset, getattr(paths, f"{split}_split"), self.index_options, **extra)
        else:
            index = CocoIndex.build(ann, getattr(paths, f"{split}_images"), self.index_options, **extra)
        reference = self.categories(before=split)
        if reference is not None:
            check_categories(ann, index.category_ids, reference[0], reference[2])
        setattr(self, attribute, index)
        return index

    def named(self, split: str) -> str | None:
        """What names ``split``: its COCO JSON, or ``"<data.yaml> [<split name>]"``; None when not named."""
        paths = self.paths
        if paths.dataset is None or split == "predict":  # predict_ann: a COCO JSON's images, either way
            return getattr(paths, f"{split}_ann")
        name = getattr(paths, f"{split}_split")
        return None if name is None else f"{paths.dataset} [{name}]"

    def stream(self) -> dict[str, Any]:
        """The ``train_stream`` chunk set's metadata, checked (once) before LitData reads anything."""
        if self.stream_meta is None:
            from seg_datamodule.io.stream import check_stream_source  # LitData is an optional extra

            # Metadata and index.json checked before LitData reads anything (issue 29).
            assert self.paths.train_stream is not None
            self.stream_meta = check_stream_source(self.paths.train_stream, self.storage_options)
        return self.stream_meta

    def check_images(self, stage: str) -> list[SplitScan]:
        """Each split ``stage`` reads, once: stop on no image to use, warn on many missing (issue 35),
        scan it and stop it with nothing to learn or score (issue 49).

        Returns:
            the scans of the splits checked for the first time (to print).
        """
        new = []
        for split in STAGE_SPLITS.get(stage, ()):
            index = None if split == "train" and self.paths.train_stream is not None else self.split_index(split)
            if index is None or split in self.checked_splits:
                continue
            what = f"{split}_split" if self.paths.dataset is not None else f"{split}_images"
            warning = check_split_images(index, what)
            if warning is not None:
                rank_zero_warn(warning)
            if split != "predict":  # images to predict have nothing to learn or score
                scan = scan_index(split, str(self.named(split)), index)
                check_scan(scan, index, self.allow_no_targets)
                self.scans[split] = scan
                new.append(scan)
            self.checked_splits.add(split)
        return new

    def predict_images(self) -> PredictImages | None:
        """The images ``trainer.predict`` reads, in order; None without ``predict_images``."""
        paths = self.paths
        if paths.predict_images is None:
            return None
        index = self.split_index("predict")
        return (list_image_folder(paths.predict_images) if index is None else
                images_from_index(index, paths.predict_images, str(paths.predict_ann)))

    # ------------------------------------------------------------------ categories

    def categories(self, before: str | None = None) -> tuple[list[int], list[str], str] | None:
        """``(ids, names, source)``: the first split named (before ``before``), else the checkpoint's."""
        paths = self.resolve_paths()
        if paths.dataset is not None and paths.train_stream is None:  # every split of a data.yaml: its names
            if self.dataset_yaml is None:
                self.dataset_yaml = read_dataset_yaml(paths.dataset)
            names = list(self.dataset_yaml.class_names)
            return list(range(len(names))), names, str(paths.dataset)
        for split in SPLITS:
            if split == before:
                break
            if split == "train" and paths.train_stream is not None:
                meta = self.stream()
                return [int(c) for c in meta["category_ids"]], list(meta["class_names"]), paths.train_stream
            index = self.split_index(split)
            if index is not None:
                return index.category_ids.tolist(), index.class_names, str(self.named(split))
        if self.checkpoint_categories is not None:
            return (*self.checkpoint_categories, "the checkpoint restored")
        return None

    def known_categories(self) -> tuple[list[int], list[str], str]:
        """:meth:`categories`, which must be known.

        Raises:
            CategoriesUnknownError: no split names them and no checkpoint was restored.
        """
        categories = self.categories()
        if categories is None:
            raise CategoriesUnknownError(
                f"no split names the categories (predict_images {self.paths.predict_images!r} is a folder): restore "
                "a checkpoint saved by this DataModule (ckpt_path), or give predict_ann or train_ann")
        return categories

    @property
    def category_ids(self) -> list[int]:
        """COCO category id of each label ``0..C-1`` (sorted; see the module docstring for the source)."""
        return [int(c) for c in self.known_categories()[0]]

    @property
    def num_classes(self) -> int:
        """C, the number of categories (contiguous labels ``0..C-1``)."""
        return len(self.known_categories()[0])

    @property
    def class_names(self) -> list[str]:
        """Category names in label order."""
        return list(self.known_categories()[1])

    @property
    def category_source(self) -> str | None:
        """Where the categories come from (a file, the stream, ``"the checkpoint restored"``), or None yet."""
        categories = self.categories()
        return None if categories is None else categories[2]

    def categories_state(self) -> dict[str, Any]:
        """``{"categories": {"ids", "names"}}`` for a checkpoint; empty while none are known."""
        categories = self.categories()
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
        self.checkpoint_categories = None
        files = self.categories()
        if files is not None and files[0] != ids:
            raise CategoryMismatchError(
                f"{files[2]}: category ids {files[0]} differ from those the checkpoint was trained on: {ids}; "
                "labels would not match")
        self.checkpoint_categories = (ids, names)

    def evaluation_file(self, stage: str) -> str | None:
        """The COCO / LVIS JSON that scores ``stage``: ``val_ann`` for fit and validate, ``test_ann``
        for test; None for predict, or a stage without one (what every model's metric reads).

        For a data.yaml split, a COCO ground truth written from the split's index
        (:func:`~seg_datamodule.io.yolo.ground_truth`, in the index cache's folder), once the
        stage is set up: the same COCO AP as for a COCO file. With ``crowd_as_instances`` a COCO
        file's crowd regions are scored as instances, as they are trained
        (:func:`~seg_datamodule.io.yolo.crowd_as_instances_ground_truth`).
        """
        paths = self.resolve_paths()
        options = self.index_options
        if paths.dataset is not None:
            index = {"fit": self.val_index, "validate": self.val_index, "test": self.test_index}.get(stage)
            return None if index is None else str(ground_truth(index, options.cache_dir, options.use_cache))
        ann = {"fit": paths.val_ann, "validate": paths.val_ann, "test": paths.test_ann}.get(stage)
        if ann is None or not options.crowd_as_instances:
            return ann
        return str(crowd_as_instances_ground_truth(ann, options.cache_dir, options.use_cache))
