"""The DataModule's flat YAML keys as frozen, typed option objects, built once at the edge.

``COCOSegDataModule`` keeps its flat keyword arguments (they are what users write in YAML);
:class:`~seg_datamodule.data.config.keys.DataModuleOptions` turns them into these objects in its
``__init__``, which hands the objects to the layers below, so options travel as one checked value
instead of ``**kwargs`` dicts or tuples read by position.

* :class:`~seg_datamodule.io.coco.IndexOptions` (in ``io``, where the index is built): how an
  annotation file becomes a ``CocoIndex`` (bad entries, crowd, empty images, the cache);
* :class:`AugmentOptions`: what a training sample draws (the geometry, which also fixes the
  canvas size, mosaic, copy-paste, MixUp, the user's albumentations pipeline, HSV jitter); it
  builds the two inputs of the pipeline: the :class:`~seg_datamodule.transforms.recipe.Recipe` and
  the :class:`SampleOptions`, the sample-level numbers that are not steps;
* :class:`LoaderOptions`: what every DataLoader of the module shares;
* :class:`StreamOptions`: where a LitData chunk set streams from.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import albumentations as A
from lightning.fabric.utilities.data import suggested_max_num_workers

from seg_datamodule.ops.checks import check_bool, check_choice, check_int, check_number
from seg_datamodule.transforms.pixel.albu import AlbumentationsTransform, load_transforms, refuse_resizing
from seg_datamodule.transforms.geometric.flips import MirrorStep
from seg_datamodule.transforms.layouts.mosaic import MosaicAffine
from seg_datamodule.transforms.pixel.hsv import HSVJitter
from seg_datamodule.transforms.group.sample_mixing import SampleMixing
from seg_datamodule.transforms.recipe import Recipe, RecipeError
from seg_datamodule.transforms.steps import Layout

__all__ = ["MAX_AUTO_WORKERS", "AugmentOptions", "LoaderOptions", "SampleOptions", "StreamOptions",
           "auto_num_workers"]


@dataclass(frozen=True)
class SampleOptions:
    """The numbers a training sample uses that are not steps of its recipe (checked by
    :class:`AugmentOptions`, which builds them).

    Attributes:
        mosaic (float): probability of a 4-image mosaic per sample (a layout that can build one).
        mosaic_partners (str): ``"batch"`` (the batch's other images) or ``"uniform"`` (the dataset).
        min_area_ratio (float): drop an instance keeping less than this fraction of its area.
        min_box_size (float): drop an instance whose box is narrower or lower than this.
        pixels_on_device (bool): training samples ship JPEG bytes and plans; the device decodes,
            warps and flips them.
    """

    mosaic: float = 1.0
    mosaic_partners: Literal["batch", "uniform"] = "uniform"
    min_area_ratio: float = 0.1
    min_box_size: float = 2.0
    pixels_on_device: bool = False


@dataclass(frozen=True)
class AugmentOptions:
    """What a training sample draws; validation reads only the canvas size from it.

    Attributes:
        geometry (Layout): the tile layout: the mosaic recipe's random affine (``MosaicAffine``)
            or large-scale jitter (``LargeScaleJitter``, ``recipe == "lsj"``); its ``image_size``
            is the canvas side ``s`` (the one place it is given), its ``flip`` the flip step.
        mosaic (float): probability of a 4-image mosaic per training sample (mosaic recipe).
        close_mosaic (int): switch mosaic off for the last ``close_mosaic`` epochs.
        mosaic_partners (str): ``"batch"`` (the batch's other images, one decode per output
            image) or ``"uniform"`` (over the dataset).
        copy_paste (float): probability of copy-paste per sample.
        copy_paste_mode (str): ``"flip"`` (the sample's mirror image) or ``"batch"``.
        mixup (float): probability of MixUp per sample, with another sample of the batch.
        min_area_ratio (float): drop an instance keeping less than this fraction of its area.
        min_box_size (float): drop an instance whose box is narrower or lower than this.
        transforms (albumentations.BaseCompose | str | None): the user's per-sample pipeline, or
            a file ``A.load`` reads.
        hsv (HSVJitter | None): YOLO's HSV gain jitter, in the workers or on the accelerator.
        steps (Recipe | None): a recipe given as a list of steps (:meth:`from_recipe`); then
            ``geometry`` is its layout and ``transforms`` and ``hsv`` are None (they are steps of
            it); ``copy_paste`` / ``mixup`` add their group step to a list without one. None: the
            recipe is the flat fields' (:meth:`build_recipe`).
        pixels_on_device (bool): training samples ship their JPEG bytes and plans, and the
            accelerator decodes, warps, flips and jitters them (``on_after_batch_transfer``). Only
            steps the device runs may join it: a layout, flips, HSV on the device; albumentations,
            90-degree turns, copy-paste and MixUp (their pixels are the workers') are refused.

    Raises:
        TypeError: a field has the wrong type.
        ValueError: a field is out of range, ``transforms`` resizes; with ``steps``, ``geometry`` is not its layout or ``transforms`` /
            ``hsv`` are set, or ``copy_paste`` / ``mixup`` are set beside its group step (a
            :class:`~seg_datamodule.transforms.recipe.RecipeError`).
        FileNotFoundError: ``transforms`` names a file that does not exist.
    """

    geometry: Layout = field(default_factory=MosaicAffine)
    mosaic: float = 1.0
    close_mosaic: int = 0
    mosaic_partners: Literal["batch", "uniform"] = "uniform"
    copy_paste: float = 0.0
    copy_paste_mode: Literal["flip", "batch"] = "flip"
    mixup: float = 0.0
    min_area_ratio: float = 0.1
    min_box_size: float = 2.0
    transforms: A.BaseCompose | str | None = None
    hsv: HSVJitter | None = None
    steps: Recipe | None = None
    pixels_on_device: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.geometry, Layout):
            raise TypeError(f"geometry must be a Layout (MosaicAffine, LargeScaleJitter), got "
                            f"{type(self.geometry).__name__}")
        check_number("mosaic", self.mosaic, 0.0, 1.0)
        check_int("close_mosaic", self.close_mosaic, minimum=0)
        check_choice("mosaic_partners", self.mosaic_partners, ("batch", "uniform"))
        check_number("min_area_ratio", self.min_area_ratio, 0.0, 1.0)
        check_number("min_box_size", self.min_box_size)
        if self.hsv is not None and not isinstance(self.hsv, HSVJitter):
            raise TypeError(f"hsv must be an HSVJitter or None, got {type(self.hsv).__name__}")
        # Checked now, by the objects that own each check, not when setup builds the samples:
        # LightningCLI then reports a bad value before anything runs.
        mixing = SampleMixing(self.copy_paste, self.copy_paste_mode, self.mixup, self.min_area_ratio,
                              self.min_box_size)
        pipeline = load_transforms(self.transforms)
        refuse_resizing(pipeline)
        if self.steps is not None:
            if not isinstance(self.steps, Recipe):
                raise TypeError(f"steps must be a Recipe or None, got {type(self.steps).__name__}")
            if self.geometry is not self.steps.layout:
                raise RecipeError("geometry must be the recipe's layout (recipe step 0) when steps is given")
            if self.transforms is not None or self.hsv is not None:
                raise RecipeError("transforms and hsv are steps of a recipe list (AlbumentationsTransform, "
                                  "HSVJitter): leave them None when steps is given")
            if self.steps.group is not None and mixing.enabled:
                raise RecipeError(f"copy_paste / mixup are set but the recipe list ends with a group step "
                                  f"({type(self.steps.group).__name__}): give them in one place")
        if not isinstance(self.pixels_on_device, bool):
            raise TypeError(f"pixels_on_device must be a bool, got {self.pixels_on_device!r}")
        if self.pixels_on_device:
            problem = self._device_pixels_problem(mixing.enabled, pipeline is not None)
            if problem is not None:
                raise RecipeError(f"pixels_on_device is True but {problem}: the device makes the pixels, and "
                                  "only a layout, flips and HSV on the device run there")

    def _device_pixels_problem(self, mixing: bool, albumentations: bool) -> str | None:
        """What in the recipe needs the workers' pixels, in words; None when nothing does."""
        if self.steps is None:
            if albumentations:
                return "transforms is set (albumentations runs on the workers' pixels)"
            if mixing:
                return "copy_paste or mixup is set (they mix the workers' pixels)"
            if self.hsv is not None and not self.hsv.on_device:
                return "hsv runs in the workers (hsv_on_device is False)"
            return None
        group = self.steps.group
        if group is None and mixing:  # the flat keys' group step joins the list at build_recipe
            return ("copy_paste or mixup is set (they join the recipe list as its group step and mix the "
                    "workers' pixels)")
        steps = [*self.steps.canvas_steps, *self.steps.pixel_steps,
                 *([group] if group is not None and getattr(group, "enabled", True) else [])]
        for step in steps:
            if isinstance(step, MirrorStep) or (isinstance(step, HSVJitter) and step.on_device):
                continue
            if isinstance(step, HSVJitter):
                return "the recipe's HSVJitter has on_device False"
            return f"the recipe has {type(step).__name__}, which needs the workers' pixels"
        return None

    @classmethod
    def from_recipe(cls, recipe: Recipe, **fields: object) -> AugmentOptions:
        """The options of a recipe list: its layout as ``geometry``, the other fields as given."""
        return cls(recipe.layout, steps=recipe, **fields)  # type: ignore[arg-type]

    def build_recipe(self) -> Recipe:
        """The steps a training sample runs: ``steps``, or the flat fields' recipe (the layout, its
        flip, the albumentations pipeline if any, HSV if set, copy-paste / MixUp). The group step of
        the ``copy_paste`` / ``mixup`` keys joins a list without one. Builds the pipeline's step:
        call once."""
        mixing = SampleMixing(self.copy_paste, self.copy_paste_mode, self.mixup, self.min_area_ratio,
                              self.min_box_size)
        if self.steps is not None:
            return self.steps if self.steps.group is not None or not mixing.enabled else replace(
                self.steps, group=mixing)
        return Recipe.from_flat(self.geometry, AlbumentationsTransform(self.transforms), self.hsv, mixing)

    @property
    def sampling(self) -> SampleOptions:
        """The sample-level numbers the pipeline reads beside the recipe."""
        return SampleOptions(self.mosaic, self.mosaic_partners, self.min_area_ratio, self.min_box_size,
                             self.pixels_on_device)

    @property
    def image_size(self) -> int:
        """The canvas side ``s`` (square ``s x s``), the geometry's."""
        return int(self.geometry.image_size)

    @property
    def recipe(self) -> str:
        """The layout's recipe name: ``"mosaic"`` or ``"lsj"``."""
        return self.geometry.recipe


#: ``num_workers: auto`` never starts more workers than this per rank (Ultralytics' cap too): each
#: worker holds a few hundred MiB; ``seg-datamodule loader-bench`` measures how many a run needs.
MAX_AUTO_WORKERS = 8


def auto_num_workers(local_ranks: int) -> int:
    """``num_workers: auto``: the cores this process may use, shared by the ranks of its node.

    Lightning's ``suggested_max_num_workers`` (the affinity mask's cores per rank, less one for the
    training process; at least 1), capped at :data:`MAX_AUTO_WORKERS`. Neither torch's "suggested
    max number of worker" warning nor Lightning's "does not have many workers" fires at that count.

    Args:
        local_ranks: processes on this node (the Trainer's ``num_devices``).
    """
    return min(MAX_AUTO_WORKERS, suggested_max_num_workers(max(1, int(local_ranks))))


@dataclass(frozen=True)
class LoaderOptions:
    """What every DataLoader of the module shares (pinning is decided per run: CUDA only).

    ``num_workers`` is an int or ``"auto"`` (:func:`auto_num_workers`, resolved per node by
    :meth:`for_node` when the loaders are made).
    """

    batch_size: int = 16
    val_batch_size: int = 16
    num_workers: int | Literal["auto"] = "auto"
    mask_stride: int = 4
    pin_memory: bool = True
    persistent_workers: bool = True
    prefetch_factor: int | None = 2
    mask_fill: Literal["centre", "ultralytics"] = "centre"

    def __post_init__(self) -> None:
        check_choice("mask_fill", self.mask_fill, ("centre", "ultralytics"))
        for name, minimum in (("batch_size", 1), ("val_batch_size", 1), ("mask_stride", 1)):
            check_int(name, getattr(self, name), minimum)
        if self.num_workers != "auto":
            try:
                check_int("num_workers", self.num_workers, 0)
            except TypeError:
                raise TypeError(f"num_workers must be an int >= 0 or 'auto', got {self.num_workers!r}") from None
        check_int("prefetch_factor", self.prefetch_factor, 1, allow_none=True)
        check_bool("pin_memory", self.pin_memory)
        check_bool("persistent_workers", self.persistent_workers)

    def for_node(self, local_ranks: int) -> LoaderOptions:
        """These options with ``num_workers: auto`` resolved for ``local_ranks`` processes on the node."""
        if self.num_workers != "auto":
            return self
        return replace(self, num_workers=auto_num_workers(local_ranks))

    @property
    def prefetch(self) -> int | None:
        """The DataLoader's ``prefetch_factor`` (None without workers, where it must be)."""
        return self.prefetch_factor if self.num_workers == "auto" or self.num_workers > 0 else None


@dataclass(frozen=True)
class StreamOptions:
    """A LitData chunk set to stream training from (``seg-datamodule convert`` writes one).

    Attributes:
        source (str): local folder or ``s3://`` / ``gs://`` URI of the chunk set.
        cache_dir (str | None): where LitData caches the chunks of a remote source.
        max_cache_size (str | None): LitData's cache limit (e.g. ``"50GB"``).
        storage_options (dict): passed to LitData's storage client (endpoint, credentials);
            kept out of checkpoints and of ``repr``.
    """

    source: str
    cache_dir: str | None = None
    max_cache_size: str | None = None
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise TypeError(f"train_stream must be a non-empty str, got {self.source!r}")
        if not isinstance(self.storage_options, dict):
            raise TypeError(f"stream_storage_options must be a dict, got {type(self.storage_options).__name__}")
