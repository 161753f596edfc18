"""The user's albumentations pipeline as a step.

:class:`AlbumentationsTransform` runs an ``albumentations.Compose`` with its random state seeded
from the sample's own generator (albumentations 2.0.8 otherwise gives every forked worker the same
stream); geometric steps move the polygon vertices as keypoints, which are then clipped again.
YOLO's HSV jitter is not an albumentations transform here: it is the DataModule's ``hsv`` key
(:mod:`~seg_datamodule.transforms.pixel.hsv`); a saved pipeline naming the ``RandomHSV`` this module
once held is refused with that pointer.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import albumentations as A
import numpy as np
import yaml

from seg_datamodule.compat import warn_if_albumentationsx, warn_unverified
from seg_datamodule.structures import Polygons
from seg_datamodule.transforms.steps import Canvas, CanvasStep, DrawPhase, step_arguments

__all__ = ["RANDOM_HSV_REMOVED", "AlbumentationsTransform", "load_transforms", "refuse_resizing", "seeding_problem"]

warn_if_albumentationsx()  # same import name, AGPL-3.0: say so once


#: Why a pipeline naming ``RandomHSV`` is refused: YOLO's HSV jitter is configured one way.
RANDOM_HSV_REMOVED = ("seg-datamodule no longer ships the albumentations RandomHSV: YOLO's HSV jitter is configured "
                      "one way, the DataModule's hsv: [h, s, v] (the same gains and draws, after the pipeline; "
                      "hsv_on_device: true runs it on the accelerator)")


def _names_random_hsv(node: Any) -> bool:
    """Whether a saved pipeline (``A.save``'s dict, nested) names this package's ``RandomHSV``."""
    if isinstance(node, dict):
        name = str(node.get("__class_fullname__", ""))
        return (name.startswith("seg_datamodule.") and name.endswith(".RandomHSV")) or any(
            _names_random_hsv(v) for v in node.values())
    return isinstance(node, list) and any(_names_random_hsv(v) for v in node)


def load_transforms(transforms: A.BaseCompose | str | Path | None) -> A.BaseCompose | None:
    """Resolve the ``transforms`` argument: a ``Compose``, a file ``A.load`` reads, or ``None``.

    Args:
        transforms: an albumentations ``BaseCompose``; a path to a JSON or YAML file written by
            ``A.save`` (YAML when it ends in ``.yaml`` or ``.yml``); or ``None``.

    Returns:
        The ``BaseCompose``, or ``None``.

    Raises:
        TypeError: ``transforms`` is of another type, or the file holds no ``BaseCompose``.
        FileNotFoundError: the file does not exist.
    """
    if transforms is None or isinstance(transforms, A.BaseCompose):
        return transforms
    if isinstance(transforms, (str, Path)):
        path = Path(transforms)
        if not path.is_file():
            raise FileNotFoundError(f"transforms file {str(path)!r} does not exist")
        text = path.read_text()
        # Parsed here (data only: safe_load, json) so that a pipeline naming the removed RandomHSV
        # is refused by name, not as a class albumentations cannot find.
        data = yaml.safe_load(text) if path.suffix.lower() in (".yaml", ".yml") else json.loads(text)
        if _names_random_hsv(data):
            raise ValueError(f"transforms file {str(path)!r}: {RANDOM_HSV_REMOVED}; remove RandomHSV from it")
        loaded = A.from_dict(data)
        if not isinstance(loaded, A.BaseCompose):
            raise TypeError(
                f"transforms file {str(path)!r} holds a {type(loaded).__name__}, expected a Compose"
            )
        return loaded
    raise TypeError(
        "transforms must be an albumentations BaseCompose, a path to a file A.load reads, or "
        f"None; got {type(transforms).__name__}"
    )


def _is_geometric(transform: object) -> bool:
    if isinstance(transform, A.BaseCompose):
        return any(_is_geometric(t) for t in transform.transforms)
    return isinstance(transform, A.DualTransform)


# albumentations 2.0.8 scales keypoints as ``x * s`` in these, which is off by ``0.5 * (s - 1)``
# px for the pixel-centre keypoints the polygons travel as; resizing belongs to ``image_size``.
_RESIZING = tuple(
    getattr(A, name)
    for name in ("Resize", "RandomScale", "LongestMaxSize", "SmallestMaxSize", "RandomSizedCrop",
                 "RandomResizedCrop", "RandomSizedBBoxSafeCrop", "CropAndPad")
    if hasattr(A, name)
)


def _resizing_steps(transform: object) -> list[str]:
    if isinstance(transform, A.BaseCompose):
        return [name for t in transform.transforms for name in _resizing_steps(t)]
    return [type(transform).__name__] if isinstance(transform, _RESIZING) else []


def refuse_resizing(transforms: A.BaseCompose | None) -> None:
    """Raise if an albumentations pipeline resizes (nested composes are searched).

    Raises:
        ValueError: ``transforms`` holds a resizing step, naming it.
    """
    resizing = _resizing_steps(transforms) if transforms is not None else []
    if resizing:
        raise ValueError(
            f"transforms must not resize ({', '.join(resizing)}): albumentations moves keypoints "
            "by half a pixel per unit of scale there, so polygons would drift off the pixels; "
            "the output size is image_size and the scale range is scale"
        )


def _pipeline_transforms(transform: object) -> list[object]:
    """The compose itself and every transform below it."""
    children = getattr(transform, "transforms", None) if isinstance(transform, A.BaseCompose) else None
    return [transform] + [t for child in (children or []) for t in _pipeline_transforms(child)]


def seeding_problem(pipeline: A.BaseCompose) -> str | None:
    """Whether ``set_random_state`` on ``pipeline`` reaches every transform in it; what fails, or None.

    The per-sample seeding rests on this (albumentations 2.0's ``BaseCompose.set_random_state``
    hands its generators down to each child): a transform left on its own generator would draw
    the same stream in every forked worker, silently. Checked on the user's actual pipeline.
    """
    setter = getattr(pipeline, "set_random_state", None)
    if not callable(setter):
        return f"{type(pipeline).__name__} has no set_random_state"
    generator, py_random = np.random.default_rng(0), random.Random(0)
    try:
        setter(generator, py_random)
    except Exception as error:  # a changed signature
        return f"{type(pipeline).__name__}.set_random_state(generator, random.Random) failed: {error!r}"
    missed = [type(t).__name__ for t in _pipeline_transforms(pipeline)
              if getattr(t, "random_generator", None) is not generator or getattr(t, "py_random", None) is not py_random]
    return f"set_random_state did not reach {', '.join(missed)}" if missed else None


class AlbumentationsTransform(CanvasStep):
    """Per-sample albumentations pipeline, seeded from the sample's generator: a pixel step.

    Pixel-only pipelines (all ``ImageOnlyTransform``: colour, blur, noise, ...) see the image
    alone. A pipeline with geometric (``DualTransform``) steps also carries the polygon vertices
    as keypoints (``remove_invisible=False``, so none is lost and the rings keep their vertex
    counts) and the crowd mask; the caller then clips the polygons to the image again. Vertices
    go in as ``x - 0.5`` because albumentations' keypoints use pixel-centre coordinates (its
    horizontal flip maps ``x`` to ``W - 1 - x``); they come back ``+ 0.5``. Only affine steps keep
    polygon edges straight; with elastic or grid distortions the vertices move correctly but the
    edges between them are approximations.

    Randomness: albumentations 2.0.8 seeds each ``Compose`` once, so forked DataLoader workers
    would share one stream; here every call resets the pipeline's generators from the sample's
    own generator, so draws depend on the sample, not on the worker that builds it. Whether
    ``set_random_state`` reaches every transform is checked once here (:func:`seeding_problem`);
    when it does not, one warning says so and the pipeline runs on its own generators.

    Args:
        transforms: see :func:`load_transforms`.

    Raises:
        TypeError, FileNotFoundError: see :func:`load_transforms`.
        ValueError: the pipeline resizes (:func:`refuse_resizing`).
    """

    phase: ClassVar[DrawPhase] = "pixels"

    def __init__(self, transforms: A.BaseCompose | str | Path | None) -> None:
        with step_arguments("AlbumentationsTransform"):
            self.transforms = load_transforms(transforms)
            refuse_resizing(self.transforms)
        self.geometric = self.transforms is not None and _is_geometric(self.transforms)
        self._runner: A.BaseCompose | None = self.transforms
        if self.geometric:
            self._runner = A.Compose(
                [self.transforms],
                keypoint_params=A.KeypointParams(format="xy", remove_invisible=False),
            )
        problem = seeding_problem(self._runner) if self._runner is not None else None
        if problem is not None:
            warn_unverified("albumentations_seeding", problem, "Draws may repeat across DataLoader workers and "
                            "differ between runs with the same seed.")
        self._seeded = problem is None

    def __repr__(self) -> str:
        return f"AlbumentationsTransform({self.transforms!r})"

    def __bool__(self) -> bool:
        return self._runner is not None

    def __call__(
        self,
        rng: np.random.Generator,
        image: np.ndarray,
        vertices: np.ndarray | None = None,
        crowd_mask: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Apply the pipeline once.

        Args:
            rng (numpy.random.Generator): the sample's generator (two numbers are drawn).
            image (ndarray[H, W, 3] uint8): RGB image.
            vertices (ndarray[V, 2] float64 | None): polygon vertices in image pixels.
            crowd_mask (ndarray[H, W] uint8 | None): crowd regions.

        Returns:
            (image (ndarray[H', W', 3] uint8), vertices (float64[V, 2], same order) or None,
            crowd mask (uint8[H', W']) or None). Pixel-only pipelines return ``vertices`` and
            ``crowd_mask`` unchanged.
        """
        if self._runner is None:
            return image, vertices, crowd_mask
        return self._run(self.draw(rng), image, vertices, crowd_mask)

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """The pipeline's two seeds, ``int64 (2,)`` (drawn whether or not they reach it, so the
        sample's later draws stay put)."""
        return rng.integers(0, 2**63, size=2)

    def apply(self, canvas: Canvas, params: np.ndarray) -> Canvas:
        """Run the pipeline on the canvas with the seeds ``params``; a geometric pipeline moves the
        vertices, which are then clipped to the image again (the areas compounded for the drops)."""
        if not self.geometric:
            return replace(canvas, image=self._run(params, canvas.image)[0])
        polygons = canvas.polygons
        image, vertices, crowd = self._run(params, canvas.image, polygons.vertices, canvas.crowd)
        unclipped = Polygons(vertices, polygons.ring_offsets, polygons.instance_offsets)
        clipped = unclipped.clip((0.0, 0.0, float(image.shape[1]), float(image.shape[0])))
        moved, after = unclipped.areas(), clipped.areas()
        # Compound the two clips' ratios: before * (moved / area_after) is the area the final clip
        # should be compared with.
        with np.errstate(divide="ignore", invalid="ignore"):
            before = np.where(canvas.area_after > 0, canvas.area_before * moved / canvas.area_after,
                              canvas.area_before)
        return replace(canvas, image=image, polygons=clipped, crowd=crowd, area_before=before, area_after=after)

    def _run(
        self,
        seeds: np.ndarray,
        image: np.ndarray,
        vertices: np.ndarray | None = None,
        crowd_mask: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """The pipeline once, its generators seeded from ``seeds`` (see :meth:`__call__`)."""
        assert self._runner is not None, "an empty pipeline is not run"
        if self._seeded:
            self._runner.set_random_state(np.random.default_rng(seeds[0]), random.Random(int(seeds[1])))
        if not self.geometric:
            return self._runner(image=image)["image"], vertices, crowd_mask
        data: dict[str, np.ndarray] = {"image": image}
        v = np.zeros((0, 2)) if vertices is None else vertices
        data["keypoints"] = (v - 0.5).astype(np.float32)
        if crowd_mask is not None:
            data["mask"] = crowd_mask
        out = self._runner(**data)
        kp = np.asarray(out["keypoints"], dtype=np.float64).reshape(-1, 2) + 0.5
        if len(kp) != len(v):  # pragma: no cover - guarded by remove_invisible=False
            raise RuntimeError(f"albumentations returned {len(kp)} keypoints for {len(v)} vertices")
        return out["image"], (None if vertices is None else kp), out.get("mask", crowd_mask)
