"""Repeat-factor sampling (LVIS, Gupta et al. 2019): per-image repeat factors and one epoch's draw.

Detectron2's ``RepeatFactorTrainingSampler`` (``data/samplers/distributed_sampler.py``): with
``f_c`` the fraction of training images holding category ``c`` (an image counts once per
category, crowd annotations included) and threshold ``t``, category ``c`` is repeated
``r_c = max(1, sqrt(t / f_c))`` times and image ``i`` ``r_i = max(r_c for c in i)`` times (1 for an
image without annotations). Each epoch, image ``i`` appears ``floor(r_i)`` times plus once more
with probability ``r_i - floor(r_i)``, drawn independently per image, so the epoch length follows
the draws and its expectation is ``sum(r_i)``.

Frequencies come from the annotations of the index itself, for COCO files as for LVIS ones
(LVIS's ``frequency`` letters, rare / common / frequent, are counted on its training set and are
what the metric groups APr / APc / APf by, not a fraction).

Pure functions; the draw takes a ``numpy.random.Generator``, which
:class:`~seg_datamodule.data.loaders.sampler.EpochShardSampler` seeds from ``(seed, epoch)``.

A schedule sized to the run: Lightning's ``estimated_stepping_batches`` is epoch 0's length times
``max_epochs``, while each epoch draws its own; :func:`scheduled_steps` asks the DataModule
(``COCOSegDataModule.stepping_batches``, the sum of every epoch's own draw) instead.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from seg_datamodule.ops.checks import check_number

__all__ = ["category_frequencies", "describe_repeat_factors", "draw_repeats", "fit_repeat_factors",
           "image_repeat_factors", "repeat_factor_summary", "scheduled_steps"]


def fit_repeat_factors(factors: np.ndarray | None, index: Any, threshold: float, trainer: Any) -> np.ndarray:
    """The training index's repeat factors for ``fit`` (``factors`` when computed before, else computed and
    described once); the Trainer must reload the train loader every epoch.

    Raises:
        ValueError: ``trainer.reload_dataloaders_every_n_epochs`` is not 1.
    """
    from lightning.pytorch.utilities import rank_zero_info

    if factors is None:
        factors = image_repeat_factors(*index.category_presence(), len(index), index.num_classes, threshold)
        rank_zero_info(f"seg_datamodule: {describe_repeat_factors(factors, threshold)}")
    reload = None if trainer is None else trainer.reload_dataloaders_every_n_epochs
    if reload not in (None, 1):
        raise ValueError(
            f"repeat_factor_threshold={threshold} draws a new epoch length every epoch, which Lightning reads "
            f"only when it reloads the train loader: set Trainer(reload_dataloaders_every_n_epochs=1) (got {reload})"
        )
    return factors


def scheduled_steps(trainer: Any) -> int | float:
    """Optimiser steps of the run, for a schedule sized to it (``inf`` without a Trainer).

    The DataModule's ``stepping_batches()`` when it has one (a ``COCOSegDataModule``: every epoch's
    own length under repeat-factor sampling), else ``trainer.estimated_stepping_batches``.
    """
    if trainer is None:
        return math.inf
    stepping = getattr(getattr(trainer, "datamodule", None), "stepping_batches", None)
    return stepping() if callable(stepping) else trainer.estimated_stepping_batches


def category_frequencies(image_of_pair: np.ndarray, label_of_pair: np.ndarray, num_images: int,
                         num_classes: int) -> np.ndarray:
    """Fraction of the images that hold each category.

    Args:
        image_of_pair (ndarray[P] int64): image index of each (image, category) pair, each pair
            once (``CocoIndex.category_presence``).
        label_of_pair (ndarray[P] int64): its label ``0..C-1``.
        num_images (int): I, the images of the split (those without annotations included).
        num_classes (int): C.

    Returns:
        ndarray[C] float64: ``f_c`` (0 for a category no image holds).
    """
    if len(image_of_pair) != len(label_of_pair):
        raise ValueError(f"{len(image_of_pair)} image indices but {len(label_of_pair)} labels")
    counts = np.bincount(np.asarray(label_of_pair, np.int64), minlength=num_classes)[:num_classes]
    return counts / max(int(num_images), 1)


def image_repeat_factors(image_of_pair: np.ndarray, label_of_pair: np.ndarray, num_images: int,
                         num_classes: int, threshold: float) -> np.ndarray:
    """Per-image repeat factors ``r_i = max(1, max over its categories of sqrt(t / f_c))``.

    Args:
        image_of_pair, label_of_pair, num_images, num_classes: as for :func:`category_frequencies`.
        threshold (float): ``t`` in ``(0, 1]`` (LVIS: 0.001).

    Returns:
        ndarray[I] float64, each at least 1.

    Raises:
        ValueError: ``threshold`` outside ``(0, 1]``.
    """
    check_number("threshold", threshold, 0.0, 1.0)
    if threshold <= 0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    freq = category_frequencies(image_of_pair, label_of_pair, num_images, num_classes)
    with np.errstate(divide="ignore"):  # a category nobody holds never reaches an image
        category_repeat = np.maximum(1.0, np.sqrt(threshold / freq))
    factors = np.ones(int(num_images), np.float64)
    if len(image_of_pair):
        np.maximum.at(factors, np.asarray(image_of_pair, np.int64), category_repeat[np.asarray(label_of_pair)])
    return factors


def draw_repeats(factors: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One epoch's copies of each image: ``floor(r_i)`` plus one with probability ``r_i - floor(r_i)``.

    Args:
        factors (ndarray[I] float64): repeat factors (:func:`image_repeat_factors`).
        rng: the epoch's generator.

    Returns:
        ndarray[I] int64: copies per image; ``np.repeat(np.arange(I), copies)`` are the epoch's
        image indices before shuffling.
    """
    factors = np.asarray(factors, np.float64)
    whole = np.floor(factors)
    return (whole + (rng.random(len(factors)) < factors - whole)).astype(np.int64)


def repeat_factor_summary(factors: np.ndarray) -> dict[str, float]:
    """What the DataModule reports: images, expected epoch length, mean and largest factor, and
    how many images are repeated at all."""
    factors = np.asarray(factors, np.float64)
    return {
        "images": int(len(factors)),
        "expected_epoch_samples": float(factors.sum()),
        "mean_factor": float(factors.mean()) if len(factors) else 0.0,
        "max_factor": float(factors.max()) if len(factors) else 0.0,
        "repeated_images": int((factors > 1).sum()),
    }


def describe_repeat_factors(factors: np.ndarray, threshold: float, epoch_samples: int | None = None) -> str:
    """One line for the DataModule's report: the epoch length (expected, and this epoch's drawn one
    when given) and the mean repeat factor."""
    s = repeat_factor_summary(factors)
    drawn = "" if epoch_samples is None else f", {epoch_samples} drawn this epoch"
    return (
        f"repeat-factor sampling (threshold {threshold:g}): {s['images']} images, "
        f"{s['expected_epoch_samples']:.1f} samples per epoch expected{drawn}; mean factor "
        f"{s['mean_factor']:.4f}, max {s['max_factor']:.2f}, {s['repeated_images']} images repeated"
    )
