"""A training sample's augmentation as one ordered list of steps, checked entirely when it is built.

A :class:`Recipe` is a :class:`~seg_datamodule.transforms.steps.Layout` followed by canvas steps:
first those that draw before decode (``phase == "plan"``: the flip), then those that draw after it
(``phase == "pixels"``: albumentations, HSV), each drawn and applied in list order. It comes from
the DataModule's flat keys (:meth:`Recipe.from_flat`, the same draws and batches as they always
gave) or from a YAML list of LightningCLI ``class_path`` / ``init_args`` entries
(:meth:`Recipe.from_steps`)::

    recipe:
      - class_path: seg_datamodule.transforms.MosaicAffine
        init_args: {image_size: 640, degrees: 10.0}
      - class_path: seg_datamodule.transforms.RandomFlipLR
        init_args: {p: 0.5}
      - class_path: seg_datamodule.transforms.HSVJitter

Whatever cannot run is refused here, before anything is decoded: a list without a layout first, a
second layout, a plan-phase step after a pixel step (its draw would have to move before decode,
changing every later draw), two HSV steps, or HSV beside an albumentations ``RandomHSV``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

from seg_datamodule.errors import UserInputError
from seg_datamodule.transforms.albu import AlbumentationsTransform, refuse_random_hsv
from seg_datamodule.transforms.hsv import HSVJitter
from seg_datamodule.transforms.steps import CanvasStep, Layout

__all__ = ["Recipe", "RecipeError", "Step"]

#: What a recipe list holds.
Step = Union[Layout, CanvasStep]


class RecipeError(UserInputError, ValueError):
    """A recipe that cannot run; the message names the step (position and class) and why."""


def _named(i: int, step: object) -> str:
    return f"recipe step {i} ({type(step).__name__})"


@dataclass(frozen=True)
class Recipe:
    """A layout, the canvas steps drawn before decode, and the pixel steps drawn after it.

    Attributes:
        layout (Layout): places the tiles (and fixes the canvas size).
        canvas_steps (tuple[CanvasStep, ...]): plan-phase steps, drawn right after the layout,
            applied right after the warp.
        pixel_steps (tuple[CanvasStep, ...]): drawn and applied after decode, in order.

    Raises:
        RecipeError: see :meth:`from_steps` (the same checks run on the fields).
    """

    layout: Layout
    canvas_steps: tuple[CanvasStep, ...] = ()
    pixel_steps: tuple[CanvasStep, ...] = ()

    def __post_init__(self) -> None:
        _check(self.steps)

    @property
    def steps(self) -> tuple[Step, ...]:
        """Every step in order: the layout, the canvas steps, the pixel steps."""
        return (self.layout, *self.canvas_steps, *self.pixel_steps)

    @property
    def hsv(self) -> HSVJitter | None:
        """The HSV step, if the recipe has one."""
        return next((s for s in self.pixel_steps if isinstance(s, HSVJitter)), None)

    @classmethod
    def from_steps(cls, steps: Sequence[Step], image_size: int | None = None) -> Recipe:
        """The recipe of an ordered list of steps (a YAML ``recipe:`` list), checked.

        Args:
            steps: a :class:`Layout`, then canvas steps: plan-phase ones, then pixel ones.
            image_size: the canvas side the layout must have (the DataModule's ``image_size``),
                or None.

        Raises:
            RecipeError: the list is empty, its first step is not a :class:`Layout` (or is one of
                another ``image_size``), it holds a second layout or something that is not a step,
                a plan-phase step comes after a pixel step, or two HSV jitters would run.
        """
        items = list(steps) if isinstance(steps, Sequence) and not isinstance(steps, str) else None
        if not items:
            raise RecipeError(f"recipe must be a non-empty list of steps, a Layout first; got {steps!r}")
        _check(tuple(items))
        if image_size is not None and items[0].image_size != image_size:
            raise RecipeError(f"image_size is {image_size} but {_named(0, items[0])} has {items[0].image_size}: "
                              "the layout fixes the canvas, give both the same")
        rest = items[1:]
        first_pixel = next((i for i, s in enumerate(rest) if s.phase != "plan"), len(rest))
        return cls(items[0], tuple(rest[:first_pixel]), tuple(rest[first_pixel:]))

    @classmethod
    def from_flat(cls, layout: Layout, transforms: AlbumentationsTransform | None, hsv: HSVJitter | None) -> Recipe:
        """What the flat keys always built: the layout, its flip, the pipeline (if any), HSV (if set)."""
        pixel = tuple(s for s in (transforms if transforms else None, hsv) if s is not None)
        return cls(layout, (layout.flip,), pixel)


def _check(steps: tuple[object, ...]) -> None:
    """Raise :class:`RecipeError` for the first thing in ``steps`` that cannot run."""
    for i, step in enumerate(steps):
        if not isinstance(step, (Layout, CanvasStep)):
            raise RecipeError(f"{_named(i, step)} is neither a Layout nor a CanvasStep")
        if i == 0 and not isinstance(step, Layout):
            raise RecipeError(f"{_named(i, step)} must be a Layout (MosaicAffine, LargeScaleJitter): "
                              "the tiles are placed before any other step")
        if i > 0 and isinstance(step, Layout):
            raise RecipeError(f"{_named(i, step)} is a second Layout: a recipe places its tiles once, in step 0")
    canvas = list(enumerate(steps))[1:]
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
    for i, step in canvas:
        if hsv and isinstance(step, AlbumentationsTransform):
            try:
                refuse_random_hsv(step.transforms)
            except ValueError as err:
                raise RecipeError(f"{_named(i, step)}: {err}") from err
