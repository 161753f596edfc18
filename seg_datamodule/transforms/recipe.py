"""A training sample's augmentation as one ordered list of steps, checked entirely when it is built.

A :class:`Recipe` is a :class:`~seg_datamodule.transforms.steps.Layout` followed by canvas steps:
first those that draw before decode (``phase == "plan"``: the flip), then those that draw after it
(``phase == "pixels"``: albumentations, HSV), each drawn and applied in list order; and, last, at
most one :class:`~seg_datamodule.transforms.steps.GroupStep` that mixes the built samples of a
batch (:class:`~seg_datamodule.transforms.group.sample_mixing.SampleMixing`: copy-paste, MixUp). It comes from
the DataModule's flat keys (:meth:`Recipe.from_flat`, the same draws and batches as they always
gave) or from a YAML list of LightningCLI ``class_path`` / ``init_args`` entries
(:meth:`Recipe.from_steps`)::

    recipe:
      - class_path: seg_datamodule.transforms.MosaicAffine
        init_args: {image_size: 640, degrees: 10.0}
      - class_path: seg_datamodule.transforms.RandomFlipLR
        init_args: {p: 0.5}
      - class_path: seg_datamodule.transforms.HSVJitter
      - class_path: seg_datamodule.transforms.SampleMixing
        init_args: {copy_paste: 0.5, mixup: 0.1}

Whatever cannot run is refused here, before anything is decoded: a list without a layout first, a
second layout, a plan-phase step after a pixel step (its draw would have to move before decode,
changing every later draw), two HSV steps, or a group
step that is not last or is a second one (it mixes samples every other step has built). A group
step's ``min_area_ratio`` / ``min_box_size`` (for the instances pasted objects occlude) are its own
``init_args``; the flat keys give it the DataModule's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

from seg_datamodule.errors import UserInputError
from seg_datamodule.transforms.pixel.albu import AlbumentationsTransform
from seg_datamodule.transforms.pixel.hsv import HSVJitter
from seg_datamodule.transforms.steps import CanvasStep, GroupStep, Layout

__all__ = ["Recipe", "RecipeError", "Step"]

#: What a recipe list holds.
Step = Union[Layout, CanvasStep, GroupStep]


class RecipeError(UserInputError, ValueError):
    """A recipe that cannot run; the message names the step (position and class) and why."""


def _named(i: int, step: object) -> str:
    return f"recipe step {i} ({type(step).__name__})"


@dataclass(frozen=True)
class Recipe:
    """A layout, the canvas steps drawn before decode, the pixel steps drawn after it, a group step.

    Attributes:
        layout (Layout): places the tiles (and fixes the canvas size).
        canvas_steps (tuple[CanvasStep, ...]): plan-phase steps, drawn right after the layout,
            applied right after the warp.
        pixel_steps (tuple[CanvasStep, ...]): drawn and applied after decode, in order.
        group (GroupStep | None): mixes the built samples of a batch (drawn after every other step).

    Raises:
        RecipeError: see :meth:`from_steps` (the same checks run on the fields).
    """

    layout: Layout
    canvas_steps: tuple[CanvasStep, ...] = ()
    pixel_steps: tuple[CanvasStep, ...] = ()
    group: GroupStep | None = None

    def __post_init__(self) -> None:
        _check(self.steps)

    @property
    def steps(self) -> tuple[Step, ...]:
        """Every step in order: the layout, the canvas steps, the pixel steps, the group step."""
        return (self.layout, *self.canvas_steps, *self.pixel_steps, *([] if self.group is None else [self.group]))

    @property
    def hsv(self) -> HSVJitter | None:
        """The HSV step, if the recipe has one."""
        return next((s for s in self.pixel_steps if isinstance(s, HSVJitter)), None)

    @property
    def albumentations(self) -> AlbumentationsTransform | None:
        """The albumentations step, if the recipe has one."""
        return next((s for s in self.pixel_steps if isinstance(s, AlbumentationsTransform)), None)

    @classmethod
    def from_steps(cls, steps: Sequence[Step], image_size: int | None = None) -> Recipe:
        """The recipe of an ordered list of steps (a YAML ``recipe:`` list), checked.

        Args:
            steps: a :class:`Layout`, then canvas steps: plan-phase ones, then pixel ones; then
                at most one :class:`GroupStep`.
            image_size: the canvas side the layout must have (the DataModule's ``image_size``),
                or None.

        Raises:
            RecipeError: the list is empty, its first step is not a :class:`Layout` (or is one of
                another ``image_size``), it holds a second layout or something that is not a step,
                a plan-phase step comes after a pixel step, two HSV jitters would run, or a group
                step is not last.
        """
        items = list(steps) if isinstance(steps, Sequence) and not isinstance(steps, str) else None
        if not items:
            raise RecipeError(f"recipe must be a non-empty list of steps, a Layout first; got {steps!r}")
        _check(tuple(items))
        if image_size is not None and items[0].image_size != image_size:
            raise RecipeError(f"image_size is {image_size} but {_named(0, items[0])} has {items[0].image_size}: "
                              "the layout fixes the canvas, give both the same")
        group = items.pop() if isinstance(items[-1], GroupStep) else None
        rest = items[1:]
        first_pixel = next((i for i, s in enumerate(rest) if s.phase != "plan"), len(rest))
        return cls(items[0], tuple(rest[:first_pixel]), tuple(rest[first_pixel:]), group)

    @classmethod
    def from_flat(cls, layout: Layout, transforms: AlbumentationsTransform | None, hsv: HSVJitter | None,
                  group: GroupStep | None = None) -> Recipe:
        """What the flat keys always built: the layout, its flip, the pipeline (if any), HSV (if set),
        and the copy-paste / MixUp step (``group``: the ``copy_paste``, ``copy_paste_mode`` and
        ``mixup`` keys' :class:`~seg_datamodule.transforms.group.sample_mixing.SampleMixing`)."""
        pixel = tuple(s for s in (transforms if transforms else None, hsv) if s is not None)
        return cls(layout, (layout.flip,), pixel, group)


def _check(steps: tuple[object, ...]) -> None:
    """Raise :class:`RecipeError` for the first thing in ``steps`` that cannot run."""
    for i, step in enumerate(steps):
        if not isinstance(step, (Layout, CanvasStep, GroupStep)):
            raise RecipeError(f"{_named(i, step)} is neither a Layout, a CanvasStep nor a GroupStep")
        if i == 0 and not isinstance(step, Layout):
            raise RecipeError(f"{_named(i, step)} must be a Layout (MosaicAffine, LargeScaleJitter): "
                              "the tiles are placed before any other step")
        if i > 0 and isinstance(step, Layout):
            raise RecipeError(f"{_named(i, step)} is a second Layout: a recipe places its tiles once, in step 0")
    groups = [(i, s) for i, s in enumerate(steps) if isinstance(s, GroupStep)]
    if len(groups) > 1:
        raise RecipeError(f"{_named(*groups[1])} is a second group step ({_named(*groups[0])} is one): "
                          "a recipe mixes its samples once")
    if groups and groups[0][0] != len(steps) - 1:
        raise RecipeError(f"{_named(*groups[0])} is a group step but comes before {_named(len(steps) - 1, steps[-1])}: "
                          "it mixes the samples every other step has built, so it comes last")
    canvas = [(i, s) for i, s in list(enumerate(steps))[1:] if not isinstance(s, GroupStep)]
    pixel = next(((i, s) for i, s in canvas if s.phase != "plan"), None)  # type: ignore[union-attr]
    for i, step in canvas:
        if pixel is not None and i > pixel[0] and step.phase == "plan":  # type: ignore[union-attr]
            raise RecipeError(
                f"{_named(i, step)} draws before decode (phase 'plan') but comes after "
                f"{_named(*pixel)}, which draws after it: move it up, right after the Layout")
    hsv = [(i, s) for i, s in canvas if isinstance(s, HSVJitter)]
    if len(hsv) > 1:
        raise RecipeError(f"{_named(*hsv[1])} is a second HSV step ({_named(*hsv[0])} is one): the colours "
                          "would be jittered twice")
