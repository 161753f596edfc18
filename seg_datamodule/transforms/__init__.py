"""Augmentation: the steps a training sample goes through, and the pure geometry under them.

- the step kinds and the recipe: ``steps`` (a layout, canvas steps, pixel steps, group steps, and
  the canvas they work on), ``recipe`` (one ordered, checked list of steps);
- ``layouts/``: ``plan`` (pure tile placement), ``mosaic`` (mosaic with a random affine,
  ``MosaicAffine``; the ``Letterbox``), ``lsj`` (large-scale jitter);
- ``geometric/``: canvas steps, ``flips`` (left-right, up-down) and ``turns`` (90 degrees);
- ``pixel/``: ``hsv`` (YOLO's HSV jitter, its numpy kernel in the workers and its torch kernel on
  the device), ``albu`` (the user's albumentations pipeline);
- ``group/``: ``sample_mixing`` (copy-paste and MixUp across a batch) over ``copy_paste`` and ``mixup``;
- ``kernels/``: ``warp`` (one resample per pixel), ``polygons`` (transport, clipping, drop reasons),
  ``box_only`` (box-only instances through the geometry).

Steps are thin classes that hold parameters and draw randomness from a generator passed in
(``draw``), then apply what they drew (``apply``); the pipeline that runs them is
:mod:`~seg_datamodule.data.samples.pipeline`, described once in the docs' package layout page.
"""

from typing import Any

from seg_datamodule.transforms.pixel.albu import RANDOM_HSV_REMOVED, AlbumentationsTransform, load_transforms
from seg_datamodule.transforms.pixel.hsv import HSVJitter, hsv_jitter, hsv_jitter_batch_
from seg_datamodule.transforms.steps import Canvas, CanvasStep, DrawPhase, GroupStep, Layout
from seg_datamodule.transforms.layouts.mosaic import GlobalDraw, Letterbox, MosaicAffine, RandomAffine
from seg_datamodule.transforms.group.copy_paste import paste_instances, paste_mask
from seg_datamodule.transforms.layouts.lsj import LargeScaleJitter, LSJDraw, lsj_layout
from seg_datamodule.transforms.group.sample_mixing import MixDraw, MixResult, SampleMixing
from seg_datamodule.transforms.group.mixup import mixup_samples
from seg_datamodule.transforms.geometric.flips import MirrorStep, RandomFlipLR, RandomFlipUD, flip_canvas
from seg_datamodule.transforms.geometric.turns import RandomRotate90
from seg_datamodule.transforms.recipe import Recipe, RecipeError, Step
from seg_datamodule.transforms.kernels.plan import TilePlan, choose_reduce, letterbox_layout, mosaic_layout, snap_for_resize
from seg_datamodule.transforms.kernels.polygons import (DROP_REASONS, drop_reasons, transform_polygons,
                                                transform_polygons_batch)
from seg_datamodule.transforms.kernels.warp import FILL_VALUE, warp_tiles

__all__ = [
    "AlbumentationsTransform",
    "Canvas",
    "CanvasStep",
    "DROP_REASONS",
    "DrawPhase",
    "FILL_VALUE",
    "GlobalDraw",
    "GroupStep",
    "HSVJitter",
    "LSJDraw",
    "LargeScaleJitter",
    "Layout",
    "Letterbox",
    "MixDraw",
    "MirrorStep",
    "MixResult",
    "MosaicAffine",
    "RandomAffine",
    "RandomFlipLR",
    "RandomFlipUD",
    "RandomRotate90",
    "Recipe",
    "RecipeError",
    "SampleMixing",
    "Step",
    "TilePlan",
    "choose_reduce",
    "drop_reasons",
    "flip_canvas",
    "hsv_jitter",
    "hsv_jitter_batch_",
    "letterbox_layout",
    "load_transforms",
    "lsj_layout",
    "mixup_samples",
    "mosaic_layout",
    "paste_instances",
    "paste_mask",
    "snap_for_resize",
    "transform_polygons",
    "transform_polygons_batch",
    "warp_tiles",
]


def __getattr__(name: str) -> Any:
    # A YAML class_path or an import of the removed RandomHSV gets the pointer, not a bare AttributeError.
    if name == "RandomHSV":
        raise AttributeError(f"seg_datamodule.transforms.RandomHSV: {RANDOM_HSV_REMOVED}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
