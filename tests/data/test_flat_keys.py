"""``DataModuleOptions.from_keys`` on its own: the options the DataModule builds, its errors, in its order.

The reference is the DataModule itself: the builder, given the keys ``COCOSegDataModule`` would get
(its signature's defaults plus the case's), must give the option objects the DataModule holds and
raise what the DataModule raises.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from seg_datamodule import COCOSegDataModule
from seg_datamodule.data.config.keys import DataModuleOptions
from seg_datamodule.errors import UserInputError
from seg_datamodule.transforms import HSVJitter, LargeScaleJitter, MosaicAffine, RandomFlipLR, RecipeError

PARAMETERS = {name: p for name, p in inspect.signature(COCOSegDataModule.__init__).parameters.items()
              if name != "self"}


def _keys(**overrides: Any) -> dict[str, Any]:
    """The keys ``COCOSegDataModule(**overrides)`` hands to the builder."""
    unknown = set(overrides) - set(PARAMETERS)
    assert not unknown, unknown
    return {name: p.default for name, p in PARAMETERS.items()} | overrides


def _stream(tmp_path: Path) -> dict[str, Any]:
    return dict(train_stream=str(tmp_path / "chunks"), stream_cache_dir=str(tmp_path / "cache"),
                stream_max_cache_size="1GB", stream_storage_options={"endpoint_url": "http://127.0.0.1:9"})


CASES = {
    "defaults": dict(),
    "flat keys": dict(image_size=320, batch_size=3, val_batch_size=5, num_workers=0, degrees=7.0, scale=[0.4, 1.6],
                      flip_lr=0.25, hsv=(0.1, 0.2, 0.3), hsv_on_device=True, on_bad_sample="skip", drop_crowd=True,
                      box_only="keep", index_check="folders", cache_images=12, seed=9, copy_paste=0.5,
                      on_resume_mismatch="restart", repeat_factor_threshold=0.001, prefetch_factor=None),
    "lsj": dict(recipe="lsj", lsj_scale=(0.5, 1.5), flip_lr=0.0, image_size=256),
    "recipe list": dict(recipe=[MosaicAffine(640, degrees=3.0), RandomFlipLR(0.3), HSVJitter((0.1, 0.2, 0.3))],
                        mixup=0.2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_builder_gives_the_options_the_datamodule_holds(case: str, tmp_path: Path) -> None:
    kwargs = dict(CASES[case], cache_dir=str(tmp_path / "index-cache"))
    options = DataModuleOptions.from_keys(_keys(**kwargs))
    dm = COCOSegDataModule(**kwargs)
    assert options.index == dm.index_options
    assert options.loader == dm.loader_options
    assert options.paths == dm.sources.paths
    assert options.stream is dm.stream_options is None
    assert (options.seed, options.cache_images, options.on_resume_mismatch, options.repeat_factor_threshold) == (
        dm.seed, dm.cache_images, dm.on_resume_mismatch, dm.repeat_factor_threshold)
    # The layouts and steps have no __eq__: their repr spells every parameter out.
    assert repr(options.augment) == repr(dm.augment)
    assert options.augment.image_size == dm.image_size


def test_the_builder_gives_the_stream_options_the_datamodule_holds(tmp_path: Path) -> None:
    kwargs = _stream(tmp_path) | dict(train_split=None)
    options = DataModuleOptions.from_keys(_keys(**kwargs))
    dm = COCOSegDataModule(**kwargs)
    assert options.stream == dm.stream_options and options.stream is not None
    assert options.stream.storage_options == {"endpoint_url": "http://127.0.0.1:9"}
    assert options.paths == dm.sources.paths and dm.train_stream == str(tmp_path / "chunks")


def test_the_val_batch_size_falls_back_to_the_batch_size() -> None:
    assert DataModuleOptions.from_keys(_keys(batch_size=6)).loader.val_batch_size == 6
    assert DataModuleOptions.from_keys(_keys(batch_size=6, val_batch_size=2)).loader.val_batch_size == 2


BAD = [
    (dict(seed=-1), ValueError),
    (dict(cache_images=1.5), TypeError),
    (dict(on_resume_mismatch="ignore"), ValueError),
    (dict(train_ann="train.json"), ValueError),
    (dict(val_images="val"), ValueError),
    (dict(repeat_factor_threshold=0.0), ValueError),
    (dict(predict_ann="p.json"), ValueError),
    (dict(stream_storage_options=[("endpoint_url", "x")]), TypeError),
    (dict(train_ann="nope/train.json", train_images="nope"), UserInputError),
    (dict(batch_size=0), ValueError),
    (dict(on_bad_sample="ignore"), ValueError),
    (dict(recipe="yolo"), ValueError),
    (dict(recipe=[RandomFlipLR(0.5)]), RecipeError),
    (dict(recipe=[MosaicAffine(640)], hsv=(0.1, 0.2, 0.3)), RecipeError),
    # Two bad keys: the first in the DataModule's order is named.
    (dict(seed=-1, batch_size=0), ValueError),
    (dict(batch_size=0, recipe="yolo"), ValueError),
]


@pytest.mark.parametrize(("kwargs", "kind"), BAD, ids=lambda v: ",".join(v) if isinstance(v, dict) else v.__name__)
def test_a_bad_key_fails_as_in_the_datamodule(kwargs: dict[str, Any], kind: type[Exception]) -> None:
    with pytest.raises(kind) as built:
        DataModuleOptions.from_keys(_keys(**kwargs))
    with pytest.raises(kind) as reference:
        COCOSegDataModule(**kwargs)
    assert type(built.value) is type(reference.value) and str(built.value) == str(reference.value)
    first = next(iter(kwargs))
    assert first in str(built.value) or first == "recipe"


def test_the_first_bad_key_in_order_is_the_one_named() -> None:
    with pytest.raises(ValueError, match="seed"):
        DataModuleOptions.from_keys(_keys(seed=-1, batch_size=0))
    with pytest.raises(ValueError, match="batch_size"):
        DataModuleOptions.from_keys(_keys(batch_size=0, recipe="yolo"))


def test_a_missing_key_is_named() -> None:
    keys = _keys()
    del keys["mosaic"]
    with pytest.raises(KeyError, match="mosaic"):
        DataModuleOptions.from_keys(keys)


GEOMETRY = [("degrees", 10.0, "MosaicAffine", "degrees"), ("translate", 0.2, "MosaicAffine", "translate"),
            ("scale", (0.3, 1.5), "MosaicAffine", "scale"), ("shear", 2.0, "MosaicAffine", "shear"),
            ("flip_lr", 0.0, "RandomFlipLR", "p"), ("lsj_scale", [0.5, 2.0], "LargeScaleJitter", "scale")]


@pytest.mark.parametrize(("key", "value", "step", "init_arg"), GEOMETRY)
def test_a_geometry_key_beside_a_recipe_list_is_refused(key: str, value: Any, step: str, init_arg: str) -> None:
    """Before, the list's layout was used and the key silently dropped."""
    recipe = [MosaicAffine(640), RandomFlipLR(0.5)]
    message = (f"{key} is {value!r} beside a recipe list, which does not read the flat geometry keys: give it in "
               f"the init_args of the list's {step} step ({init_arg})")
    with pytest.raises(RecipeError, match="^" + re.escape(message)):
        DataModuleOptions.from_keys(_keys(recipe=recipe, **{key: value}))
    with pytest.raises(UserInputError, match=f"^{key} is "):
        COCOSegDataModule(recipe=recipe, **{key: value})


def test_hsv_on_device_without_a_flat_jitter_is_refused() -> None:
    """Before, ``hsv_on_device: true`` was silently dropped beside a recipe list or a null ``hsv``."""
    recipe = [MosaicAffine(640), HSVJitter((0.015, 0.7, 0.4))]
    with pytest.raises(RecipeError, match=re.escape("hsv_on_device is True beside a recipe list, which does not "
                                                    "read it: give it in the init_args of the list's HSVJitter "
                                                    "step (on_device)")):
        DataModuleOptions.from_keys(_keys(recipe=recipe, hsv_on_device=True))
    with pytest.raises(UserInputError, match="^hsv_on_device is True but hsv is None: there is no HSV jitter"):
        COCOSegDataModule(hsv_on_device=True)
    # At its default, or with a flat jitter to move, it passes.
    assert DataModuleOptions.from_keys(_keys(recipe=recipe)).augment.hsv is None
    assert DataModuleOptions.from_keys(_keys(hsv=(0.015, 0.7, 0.4), hsv_on_device=True)).augment.hsv.on_device


def test_geometry_keys_at_their_defaults_pass_beside_a_recipe_list() -> None:
    """Shipped configs spell the defaults out (``configs/coco.yaml``); YAML gives the pairs as lists."""
    keys = _keys(recipe=[LargeScaleJitter(640), RandomFlipLR(0.5)], degrees=0, translate=0.1, scale=[0.5, 1.5],
                 shear=0.0, flip_lr=0.5, lsj_scale=[0.1, 2.0])
    assert DataModuleOptions.from_keys(keys).augment.recipe == "lsj"


def test_the_datamodule_defaults_are_the_layouts() -> None:
    """A geometry key at the DataModule's default is one at the layout's, so none is refused beside a list."""
    mosaic, lsj = (inspect.signature(cls).parameters for cls in (MosaicAffine, LargeScaleJitter))
    for key in ("degrees", "translate", "scale", "shear", "flip_lr"):
        assert PARAMETERS[key].default == mosaic[key].default, key
    assert PARAMETERS["lsj_scale"].default == lsj["scale"].default
    assert PARAMETERS["flip_lr"].default == lsj["flip_lr"].default
