"""The DataModule's flat YAML keys: checked into typed options, and read back as its attributes.

``COCOSegDataModule.__init__`` is the YAML surface (flat keyword arguments, one docstring entry
each); it hands those keys, as one mapping, to :meth:`DataModuleOptions.from_keys`, which runs
every check they need and builds the frozen option objects of :mod:`~seg_datamodule.data.config.options`
(plus ``SplitPaths`` and ``IndexOptions``) once, at the edge. The DataModule builds its
collaborators from the result. A value a collaborator keeps is read back through the DataModule
by the descriptors here (:class:`Forward`, :class:`PathKey`), so each has one home.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Any, Mapping

from seg_datamodule.data.config.options import AugmentOptions, LoaderOptions, StreamOptions
from seg_datamodule.data.splits.sources import SplitPaths
from seg_datamodule.data.splits.checks import check_dataset_keys, check_pair
from seg_datamodule.io.coco import IndexOptions
from seg_datamodule.io.paths import check_input_path
from seg_datamodule.ops.checks import check_bool, check_choice, check_int, check_number
from seg_datamodule.transforms import HSVJitter, LargeScaleJitter, MosaicAffine, Recipe, RecipeError

__all__ = ["DataModuleOptions", "Forward", "PathKey"]

#: The flat geometry keys a recipe list does not read: ``key -> (layout whose default it shares,
#: that layout's argument, the list step that takes the value, that step's init_args name)``.
_LIST_GEOMETRY = {
    "degrees": (MosaicAffine, "degrees", "MosaicAffine", "degrees"),
    "translate": (MosaicAffine, "translate", "MosaicAffine", "translate"),
    "scale": (MosaicAffine, "scale", "MosaicAffine", "scale"),
    "shear": (MosaicAffine, "shear", "MosaicAffine", "shear"),
    # In a list the flip is a step of its own; the layout's flip_lr is not read there.
    "flip_lr": (MosaicAffine, "flip_lr", "RandomFlipLR", "p"),
    "lsj_scale": (LargeScaleJitter, "scale", "LargeScaleJitter", "scale"),
}


@dataclass(frozen=True)
class DataModuleOptions:
    """The DataModule's flat keys as checked, typed options, one object per layer.

    Attributes:
        paths (SplitPaths): the split keys (COCO files and folders, the data.yaml and its splits,
            the stream), as given.
        index (IndexOptions): how an annotation file becomes an index.
        loader (LoaderOptions): what every DataLoader shares (``val_batch_size`` resolved).
        augment (AugmentOptions): what a training sample draws (the layout fixes the canvas).
        stream (StreamOptions | None): the LitData chunk set training streams from, or None.
        seed (int): base seed of shuffling and augmentation.
        cache_images (int | None): decoded images kept per worker; None sizes it by the dataset.
        on_resume_mismatch (str): ``"raise"`` or ``"restart"``.
        repeat_factor_threshold (float | None): repeat-factor sampling's ``t``, or None (off).
        allow_no_targets (bool): let a split without a target instance through setup.
        plots (bool): draw the label pictures and first training batches at fit start.
    """

    paths: SplitPaths
    index: IndexOptions
    loader: LoaderOptions
    augment: AugmentOptions
    stream: StreamOptions | None
    seed: int
    cache_images: int | None
    on_resume_mismatch: str
    repeat_factor_threshold: float | None
    allow_no_targets: bool = False
    plots: bool = True

    @classmethod
    def from_keys(cls, keys: Mapping[str, Any]) -> DataModuleOptions:
        """Check the DataModule's flat keys and build its options (what its ``__init__`` does).

        Args:
            keys: every keyword argument of ``COCOSegDataModule.__init__`` by name (the DataModule
                passes its own; other entries are not read).

        Raises:
            KeyError: a key is missing from ``keys``.
            TypeError, ValueError: a key has the wrong type or value, or keys that go together
                are given apart (the message names them); the option objects' own errors.
            InputPathError: a file or folder key names nothing there.
            RecipeError: a recipe list that cannot run, or a flat key it does not read set beside it.
        """
        # 1. The keys the DataModule owns and those that go together, in the order always checked.
        seed = check_int("seed", keys["seed"], 0)
        check_int("cache_images", keys["cache_images"], 0, allow_none=True)
        on_resume_mismatch = check_choice("on_resume_mismatch", keys["on_resume_mismatch"], ("raise", "restart"))
        _check_splits(keys)
        # 2. One typed object per layer; each checks its own fields.
        paths = SplitPaths(*(keys[name] for name in (
            "train_ann", "train_images", "val_ann", "val_images", "test_ann", "test_images", "predict_images",
            "predict_ann", "dataset", "train_split", "val_split", "test_split", "train_stream")))
        index = IndexOptions(keys["on_bad_sample"], keys["drop_crowd"], keys["drop_empty"], keys["verify_images"],
                             keys["cache_dir"], keys["use_cache"], crowd_as_instances=keys["crowd_as_instances"],
                             box_only=keys["box_only"], index_check=keys["index_check"])
        batch_size, val_batch_size = keys["batch_size"], keys["val_batch_size"]
        loader = LoaderOptions(batch_size, batch_size if val_batch_size is None else val_batch_size,
                               keys["num_workers"], keys["mask_stride"], keys["pin_memory"],
                               keys["persistent_workers"], keys["prefetch_factor"], keys["mask_fill"])
        augment = _augment_options(keys)
        train_stream = keys["train_stream"]
        stream = None if train_stream is None else StreamOptions(
            train_stream, keys["stream_cache_dir"], keys["stream_max_cache_size"],
            dict(keys["stream_storage_options"] or {}))
        return cls(paths, index, loader, augment, stream, seed, keys["cache_images"], on_resume_mismatch,
                   keys["repeat_factor_threshold"], check_bool("allow_no_targets", keys["allow_no_targets"]),
                   check_bool("plots", keys["plots"]))


def _check_splits(keys: Mapping[str, Any]) -> None:
    """The split keys given together or not at all, the repeat-factor threshold, the paths there."""
    train_ann, train_images, train_stream = keys["train_ann"], keys["train_images"], keys["train_stream"]
    if (train_ann is None) != (train_images is None):
        raise ValueError("give both train_ann and train_images, or neither (the demo dataset)")
    if train_stream is not None and train_ann is not None:
        raise ValueError("give train_stream or train_ann / train_images, not both")
    check_dataset_keys(keys["dataset"], (keys["train_split"], keys["val_split"], keys["test_split"]),
                       (train_ann, keys["val_ann"], keys["test_ann"]), train_stream)
    check_pair("val", keys["val_ann"], keys["val_images"])
    threshold = keys["repeat_factor_threshold"]
    if threshold is not None:
        check_number("repeat_factor_threshold", threshold, 0.0, 1.0)
        if threshold <= 0 or train_stream is not None:
            raise ValueError("repeat_factor_threshold must be in (0, 1] and needs train_ann (not "
                             f"train_stream), got {threshold!r}")
    check_pair("test", keys["test_ann"], keys["test_images"])
    if keys["predict_ann"] is not None and keys["predict_images"] is None:
        raise ValueError("predict_ann needs predict_images, the folder its file_name values are in")
    storage = keys["stream_storage_options"]
    if storage is not None and not isinstance(storage, dict):
        raise TypeError(f"stream_storage_options must be a dict, got {type(storage).__name__}")
    # Paths now, not at setup: LightningCLI builds the DataModule before the model (issue 40).
    for split in ("train", "val", "test", "predict"):
        check_input_path(f"{split}_ann", keys[f"{split}_ann"], "file")
        check_input_path(f"{split}_images", keys[f"{split}_images"], "folder")


def _augment_options(keys: Mapping[str, Any]) -> AugmentOptions:
    """The layout (from ``recipe`` and the geometry keys, or a recipe list's step 0), HSV, the rest."""
    recipe, image_size = keys["recipe"], keys["image_size"]
    listed = None if isinstance(recipe, str) else Recipe.from_steps(recipe, image_size)  # a YAML list of steps
    if listed:
        _refuse_geometry_keys(keys)
    check_choice("recipe", "mosaic" if listed else recipe, ("mosaic", "lsj"))
    flip_lr = keys["flip_lr"]
    geometry = listed.layout if listed else (
        LargeScaleJitter(image_size, tuple(keys["lsj_scale"]), flip_lr) if recipe == "lsj" else
        MosaicAffine(image_size=image_size, degrees=keys["degrees"], translate=keys["translate"],
                     scale=tuple(keys["scale"]), shear=keys["shear"], flip_lr=flip_lr))
    hsv = keys["hsv"]
    if hsv is None and keys["hsv_on_device"] is True:
        # Nothing would read it: there is no flat jitter to move (a list's HSVJitter step has its own).
        raise RecipeError("hsv_on_device is True beside a recipe list, which does not read it: give it in the "
                          "init_args of the list's HSVJitter step (on_device), or leave hsv_on_device at its "
                          "default False" if listed else
                          "hsv_on_device is True but hsv is None: there is no HSV jitter to move to the "
                          "accelerator; set hsv (Ultralytics' gains: [0.015, 0.7, 0.4]) or leave hsv_on_device "
                          "at its default False")
    # With the pixels made on the device, the flat jitter runs there too (nothing else could).
    on_device = keys["hsv_on_device"] or keys["pixels_on_device"] is True
    jitter = None if hsv is None else HSVJitter(hsv, on_device=on_device)
    return AugmentOptions(geometry, keys["mosaic"], keys["close_mosaic"], _mosaic_partners(keys), keys["copy_paste"],
                          keys["copy_paste_mode"], keys["mixup"], keys["min_area_ratio"], keys["min_box_size"],
                          keys["transforms"], jitter, listed, keys["pixels_on_device"])


def _mosaic_partners(keys: Mapping[str, Any]) -> str:
    """``mosaic_partners`` resolved: None is ``"uniform"`` (it trains best, see the train-parity
    benchmark) for map-style data and ``"batch"`` for a stream, which holds only the batch's records.

    Raises:
        ValueError: ``"uniform"`` given with ``train_stream``.
    """
    partners, stream = keys["mosaic_partners"], keys["train_stream"]
    if partners is None:
        return "uniform" if stream is None else "batch"
    if partners == "uniform" and stream is not None:
        raise ValueError(f"mosaic_partners 'uniform' draws partners over the whole dataset, which a stream "
                         f"({stream}) cannot read at random: give mosaic_partners 'batch' (or leave it unset)")
    return partners


def _refuse_geometry_keys(keys: Mapping[str, Any]) -> None:
    """Raise :class:`RecipeError` for a flat geometry key set beside a recipe list (which would not read it).

    A key at its default (the layout's, which is the DataModule's) is not set: shipped configs spell
    the defaults out.
    """
    for key, (layout, argument, step, init_arg) in _LIST_GEOMETRY.items():
        value, default = keys[key], inspect.signature(layout).parameters[argument].default
        if not _is_default(value, default):
            raise RecipeError(f"{key} is {value!r} beside a recipe list, which does not read the flat geometry "
                              f"keys: give it in the init_args of the list's {step} step ({init_arg}), or leave "
                              f"{key} at its default {default!r}")


def _is_default(value: Any, default: Any) -> bool:
    if isinstance(default, tuple):  # a pair: YAML gives a list
        return isinstance(value, (list, tuple)) and tuple(value) == default
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == default


class Forward:
    """An attribute of the DataModule kept by one of its collaborators (``owner``), read and written there."""

    def __init__(self, owner: str) -> None:
        self.owner = owner

    def __set_name__(self, cls: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, cls: type | None = None) -> Any:
        return self if obj is None else getattr(getattr(obj, self.owner), self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(getattr(obj, self.owner), self.name, value)


class PathKey(Forward):
    """A split path key, kept in the sources' frozen :class:`~seg_datamodule.data.splits.sources.SplitPaths`."""

    def __init__(self) -> None:
        super().__init__("sources")

    def __get__(self, obj: Any, cls: type | None = None) -> Any:
        return self if obj is None else getattr(obj.sources.paths, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        obj.sources.paths = replace(obj.sources.paths, **{self.name: value})
