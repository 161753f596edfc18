"""A recipe is a checked list of steps: what cannot run is refused when it is built, naming the step."""

from __future__ import annotations

import albumentations as A
import pytest

from seg_datamodule.errors import UserInputError
from seg_datamodule.transforms import (AlbumentationsTransform, CanvasStep, HSVJitter, LargeScaleJitter, MosaicAffine,
                                       RandomFlipLR, SampleMixing)
from seg_datamodule.transforms.recipe import Recipe, RecipeError


def test_a_list_splits_into_layout_plan_steps_and_pixel_steps() -> None:
    layout, flip, hsv = MosaicAffine(64), RandomFlipLR(0.5), HSVJitter()
    blur = AlbumentationsTransform(A.Compose([A.Blur()]))
    recipe = Recipe.from_steps([layout, flip, blur, hsv])
    assert recipe.layout is layout and recipe.canvas_steps == (flip,) and recipe.pixel_steps == (blur, hsv)
    assert recipe.steps == (layout, flip, blur, hsv) and recipe.hsv is hsv
    assert Recipe.from_steps([LargeScaleJitter(64)]).steps[0].recipe == "lsj"
    assert recipe.group is None and recipe.albumentations is blur


def test_a_list_may_end_with_one_group_step() -> None:
    layout, flip, mixing = MosaicAffine(64), RandomFlipLR(0.5), SampleMixing(copy_paste=0.5, mixup=0.2)
    recipe = Recipe.from_steps([layout, flip, mixing])
    assert recipe.canvas_steps == (flip,) and recipe.pixel_steps == () and recipe.group is mixing
    assert recipe.steps == (layout, flip, mixing)
    assert Recipe.from_steps([layout, mixing]).group is mixing


def test_the_flat_keys_build_the_recipe_they_always_ran() -> None:
    layout, hsv = MosaicAffine(64, flip_lr=0.3), HSVJitter()
    recipe = Recipe.from_flat(layout, AlbumentationsTransform(None), hsv)
    assert recipe.canvas_steps == (layout.flip,) and recipe.pixel_steps == (hsv,)
    assert Recipe.from_flat(layout, None, None).pixel_steps == ()
    mixing = SampleMixing(copy_paste=0.5)
    assert Recipe.from_flat(layout, None, hsv, mixing).group is mixing


class _Grey(CanvasStep):
    """A user's own pixel step (drawn after decode), for the order checks."""

    phase = "pixels"

    def draw(self, rng):
        return bool(rng.random() < 0.5)

    def apply(self, canvas, grey):
        return canvas


@pytest.mark.parametrize(("steps", "message"), [
    ([], r"non-empty list"),
    ([RandomFlipLR(0.5)], r"recipe step 0 \(RandomFlipLR\) must be a Layout"),
    ([MosaicAffine(64), LargeScaleJitter(64)], r"recipe step 1 \(LargeScaleJitter\) is a second Layout"),
    ([MosaicAffine(64), "blur"], r"recipe step 1 \(str\) is neither a Layout, a CanvasStep nor a GroupStep"),
    ([MosaicAffine(64), SampleMixing(0.5), RandomFlipLR(0.5)],
     r"recipe step 1 \(SampleMixing\) is a group step but comes before recipe step 2 \(RandomFlipLR\)"),
    ([MosaicAffine(64), SampleMixing(0.5), SampleMixing(mixup=0.5)],
     r"recipe step 2 \(SampleMixing\) is a second group step \(recipe step 1 \(SampleMixing\) is one\)"),
    ([SampleMixing(0.5)], r"recipe step 0 \(SampleMixing\) must be a Layout"),
    ([MosaicAffine(64), HSVJitter(), RandomFlipLR(0.5)],
     r"recipe step 2 \(RandomFlipLR\) draws before decode .* after recipe step 1 \(HSVJitter\)"),
    # Any pixel step, not only HSV: albumentations, or a user's own, before a plan step.
    ([MosaicAffine(64), AlbumentationsTransform(A.Compose([A.Blur()])), RandomFlipLR(0.5)],
     r"recipe step 2 \(RandomFlipLR\) draws before decode .* after recipe step 1 \(AlbumentationsTransform\)"),
    ([MosaicAffine(64), _Grey(), HSVJitter(), RandomFlipLR(0.5)],
     r"recipe step 3 \(RandomFlipLR\) draws before decode .* after recipe step 1 \(_Grey\)"),
    ([MosaicAffine(64), HSVJitter(), HSVJitter((0.1, 0.1, 0.1))],
     r"recipe step 2 \(HSVJitter\) is a second HSV step \(recipe step 1 \(HSVJitter\) is one\)"),
])
def test_what_cannot_run_is_refused_naming_the_step(steps: list, message: str) -> None:
    with pytest.raises(RecipeError, match=message) as info:
        Recipe.from_steps(steps)
    assert isinstance(info.value, UserInputError) and isinstance(info.value, ValueError)


def test_a_step_refuses_its_own_bad_arguments_naming_itself() -> None:
    with pytest.raises(UserInputError, match=r"RandomFlipLR: p must be .*1\.5"):
        RandomFlipLR(1.5)
    with pytest.raises(UserInputError, match=r"AlbumentationsTransform: transforms must not resize \(Resize\)"):
        AlbumentationsTransform(A.Compose([A.Resize(32, 32)]))
    with pytest.raises(UserInputError, match=r"HSVJitter: hsv sgain"):
        HSVJitter((0.1, -1.0, 0.1))


def test_a_group_steps_bad_argument_names_the_step() -> None:
    from seg_datamodule.transforms import SampleMixing

    with pytest.raises(UserInputError, match=r"^SampleMixing: mixup must be .*1\.5"):
        SampleMixing(mixup=1.5)
