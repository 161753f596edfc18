"""The per-sample albumentations seeding rests on ``set_random_state`` reaching every transform:
checked on the user's pipeline, warned about once when it does not hold, never a crash."""

from __future__ import annotations

import warnings

import albumentations as A
import numpy as np
import pytest

from seg_datamodule.transforms.pixel.albu import AlbumentationsTransform, seeding_problem


def _pipeline() -> A.Compose:
    return A.Compose([A.HorizontalFlip(p=0.5), A.OneOf([A.Blur(p=1), A.MedianBlur(p=1)], p=0.5),
                      A.RandomBrightnessContrast(p=0.5)])


def _image() -> np.ndarray:
    return np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)


def test_this_albumentations_reaches_every_transform() -> None:
    assert seeding_problem(_pipeline()) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        transform = AlbumentationsTransform(_pipeline())
    a = transform(np.random.default_rng(7), _image())[0]
    b = transform(np.random.default_rng(7), _image())[0]
    assert np.array_equal(a, b)  # the sample's generator decides


def test_a_missing_set_random_state_warns_once_and_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(A.BaseCompose, "set_random_state")
    with pytest.warns(UserWarning, match="Compose has no set_random_state") as caught:
        transform = AlbumentationsTransform(_pipeline())
    assert "verified on albumentations 2.0.0 to 2.0.8" in str(caught[0].message)
    out, _, _ = transform(np.random.default_rng(7), _image())
    assert out.shape == (32, 32, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        AlbumentationsTransform(_pipeline())


def test_a_set_random_state_that_hands_nothing_down_names_the_transforms_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(A.BaseCompose, "set_random_state", lambda self, random_generator, py_random: None)
    with pytest.warns(UserWarning, match="did not reach .*HorizontalFlip, OneOf, Blur, MedianBlur"):
        AlbumentationsTransform(_pipeline())
