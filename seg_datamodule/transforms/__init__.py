"""Augmentation: tile plans (mosaic, letterbox, LSJ), single-resample warps, polygon transport, draws,
copy-paste and MixUp.

``plan`` -> ``warp`` (pixels) and ``polygons`` (instances) are pure functions; ``steps`` names the
step kinds (a layout, canvas steps, group steps) and the canvas they work on; ``augment``, ``lsj``,
``albu`` and ``hsv`` hold the steps, thin classes that hold parameters and draw randomness from a
generator passed in (``hsv`` also applies recorded gains to a batch on its device).
"""

from seg_datamodule.transforms.albu import AlbumentationsTransform, RandomHSV, load_transforms
from seg_datamodule.transforms.hsv import HSVJitter, hsv_jitter, hsv_jitter_batch_
from seg_datamodule.transforms.steps import Canvas, CanvasStep, DrawPhase, GroupStep, Layout
from seg_datamodule.transforms.augment import GlobalDraw, Letterbox, MosaicAffine, RandomAffine, RandomFlipLR
from seg_datamodule.transforms.copy_paste import paste_instances, paste_mask
from seg_datamodule.transforms.lsj import LargeScaleJitter, LSJDraw, lsj_layout
from seg_datamodule.transforms.mixing import MixDraw, MixResult, SampleMixing
from seg_datamodule.transforms.mixup import mixup_samples
from seg_datamodule.transforms.orient import MirrorStep, RandomFlipUD, RandomRotate90, flip_canvas
from seg_datamodule.transforms.recipe import Recipe, RecipeError, Step
from seg_datamodule.transforms.plan import TilePlan, choose_reduce, letterbox_layout, mosaic_layout, snap_for_resize
from seg_datamodule.transforms.polygons import (DROP_REASONS, drop_reasons, transform_polygons,
                                                transform_polygons_batch)
from seg_datamodule.transforms.warp import FILL_VALUE, warp_tiles

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
    "RandomHSV",
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
