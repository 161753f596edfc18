"""The kinds of augmentation step a training sample goes through, and the canvas they work on.

Every step holds parameters (checked in ``__init__``) and draws its randomness only from the
sample's generator it is given, in a fixed count, so that a batch stays a pure function of
``(seed, epoch, indices)``; a pure kernel then applies what was drawn. The kinds, in the order a
sample meets them:

* :class:`Layout` places the tiles on the canvas (mosaic, letterbox, LSJ); it draws in the plan
  phase, before anything is decoded, and turns its draw and the images' sizes into the
  :class:`~seg_datamodule.transforms.kernels.plan.TilePlan` the single resample follows.
* A fused step is a matrix folded into that resample (:class:`~seg_datamodule.transforms.layouts.mosaic.RandomAffine`,
  drawn by its layout), so pixels are resampled once.
* :class:`CanvasStep` is exact on the output canvas (flips, drawn in the plan phase) or on its
  pixels (albumentations, HSV; drawn after decode, in list order).
* :class:`GroupStep` uses the other samples of the batch (copy-paste, MixUp), after every sample
  of the batch is built: a recipe's last step, at most one.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator, Literal, Sequence

import numpy as np

from seg_datamodule.errors import UserInputError
from seg_datamodule.structures import PendingTiles, Polygons, Sample
from seg_datamodule.transforms.kernels.plan import TilePlan

__all__ = ["Canvas", "CanvasStep", "DrawPhase", "GroupStep", "Layout", "MixResult", "StepTypeError",
           "StepValueError", "draw_canvas_steps", "step_arguments"]

#: When a step draws: ``"plan"`` before any decode (with the layout), ``"pixels"`` after decode.
DrawPhase = Literal["plan", "pixels"]


class StepValueError(UserInputError, ValueError):
    """A step's argument has a bad value; the message starts with the step's class name."""


class StepTypeError(UserInputError, TypeError):
    """A step's argument has the wrong type; the message starts with the step's class name."""


@contextlib.contextmanager
def step_arguments(step: str) -> Iterator[None]:
    """Around a step's ``__init__`` checks: a ``ValueError`` / ``TypeError`` they raise is re-raised as
    :class:`StepValueError` / :class:`StepTypeError` naming ``step``, so a YAML recipe's mistake
    reads ``RandomFlipLR: p must be ...`` on one line (an error already naming a step passes as is)."""
    try:
        yield
    except UserInputError:
        raise
    except TypeError as err:
        raise StepTypeError(f"{step}: {err}") from err
    except ValueError as err:
        raise StepValueError(f"{step}: {err}") from err


@dataclass(frozen=True)
class Canvas:
    """One sample on its output canvas, between the warp and the drops.

    Attributes:
        image (ndarray[H, W, 3] uint8): the RGB canvas (a step may overwrite it: it is the sample's own).
        polygons (Polygons): the instances, in canvas pixels, clipped to the canvas.
        crowd (ndarray[H, W] uint8 | None): crowd regions, if the index keeps them.
        area_before (ndarray[N] float64), area_after (ndarray[N] float64): per instance, the area
            its clips compare (for the ``min_area_ratio`` drop).
        hsv_gains (ndarray[3] float64 | None): HSV gains recorded for the device, not yet applied.
        pending (PendingTiles | None): ``pixels_on_device``: the pixels are made on the device
            from these tiles, and ``image`` is a read-only stand-in; a canvas step records its
            pixel work here (the flips), a pixel step must run on the device.
    """

    image: np.ndarray
    polygons: Polygons
    crowd: np.ndarray | None
    area_before: np.ndarray
    area_after: np.ndarray
    hsv_gains: np.ndarray | None = None
    pending: PendingTiles | None = None


class CanvasStep(abc.ABC):
    """A step exact on the output canvas or on its pixels: :meth:`draw`, then :meth:`apply`.

    A subclass sets :attr:`phase` and writes the two methods; ``draw`` takes every number it
    will ever need from ``rng`` (the same count whatever it drew, so the steps after it keep their
    draws), ``apply`` uses nothing but ``canvas`` and what ``draw`` returned.

    Attributes:
        phase (DrawPhase): ``"plan"``: drawn before decode, with the layout (geometric steps such as
            flips, whose draw must not depend on the pixels); ``"pixels"``: drawn after decode.
    """

    phase: ClassVar[DrawPhase] = "pixels"

    @abc.abstractmethod
    def draw(self, rng: np.random.Generator) -> Any:
        """This sample's parameters, drawn from ``rng`` (the sample's generator)."""

    @abc.abstractmethod
    def apply(self, canvas: Canvas, params: Any) -> Canvas:
        """``canvas`` with the step applied with ``params`` (from :meth:`draw`)."""


class Layout(abc.ABC):
    """Places a sample's tiles: which images (:meth:`draw_indices`), where (:meth:`draw`, :meth:`plan`).

    Attributes:
        image_size (int): ``s``, the side of the square output canvas.
        mosaic_capable (bool): whether the layout builds a 4-image mosaic when one is drawn.
        recipe (str): the DataModule's ``recipe`` key this layout answers to.
        letterbox: places one image for validation (``plan(image_size_hw)``).
        flip (CanvasStep): the horizontal flip its ``flip_lr`` key configures (a plan-phase step).
    """

    image_size: int
    mosaic_capable: ClassVar[bool]
    recipe: ClassVar[str]
    letterbox: Any
    flip: CanvasStep

    @abc.abstractmethod
    def draw_indices(self, rng: np.random.Generator, first: int, num_images: int) -> np.ndarray:
        """The tiles' image indices, ``first`` (the sample's own image) first, ``int64 (K,)``."""

    @abc.abstractmethod
    def draw(self, rng: np.random.Generator, mosaic: bool) -> Any:
        """The random part of the sample's placement (plan phase)."""

    @abc.abstractmethod
    def plan(self, draw: Any, image_sizes: np.ndarray, snap: bool = True) -> TilePlan:
        """Where each tile lands for ``draw`` and the tiles' original sizes ``(K, 2)`` (H, W)."""


@dataclass(frozen=True)
class MixResult:
    """A sample after a group step, and where its annotations went.

    Attributes:
        sample (Sample): the result.
        pasted (int): copies added by copy-paste.
        mixed_in (int): instances added by MixUp.
        occluded (int): the sample's instances dropped because pasted objects cover them.
    """

    sample: Sample
    pasted: int = 0
    mixed_in: int = 0
    occluded: int = 0


class GroupStep(abc.ABC):
    """A step over a whole batch (copy-paste, MixUp): draws per sample, then mixes with partners.

    It runs after every sample of the group is built, so it is the last step of a recipe; each
    sample draws from its own generator, after all its other draws, and partners are taken as
    they were before any mixing (the order in which samples are mixed does not matter).
    :class:`~seg_datamodule.transforms.group.sample_mixing.SampleMixing` (copy-paste and MixUp) is the one the
    flat keys build.
    """

    @property
    @abc.abstractmethod
    def enabled(self) -> bool:
        """Whether anything can happen (if not, nothing is drawn and samples pass through)."""

    @abc.abstractmethod
    def draw(self, rng: np.random.Generator, group_size: int) -> Any:
        """One sample's draws (a fixed count), from its own generator."""

    @abc.abstractmethod
    def mix_group(self, rngs: Sequence[np.random.Generator], samples: Sequence[Sample]) -> list[MixResult]:
        """Every sample of a batch mixed with partners from the same batch, as they were before."""

    @abc.abstractmethod
    def mix_one(self, rng: np.random.Generator, sample: Sample, group_size: int,
                partner: Callable[[int], Sample]) -> MixResult:
        """One sample built alone, mixed with partners of a group of ``group_size`` (the dataset):
        ``partner(shift)`` builds the one ``shift`` places on, called only for the shifts drawn."""


def draw_canvas_steps(steps: Sequence[CanvasStep], rng: np.random.Generator) -> tuple[tuple[CanvasStep, Any], ...]:
    """Draw each step in list order, pairing it with its parameters (applied in the same order later)."""
    return tuple((step, step.draw(rng)) for step in steps)
