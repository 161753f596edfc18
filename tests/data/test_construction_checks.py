"""Every augmentation key is checked when ``COCOSegDataModule`` is built, not at ``setup``.

LightningCLI builds the DataModule before anything runs, so a value refused in ``__init__`` is
reported before a model is built or a file is read for training. Each case below passed
``__init__`` before (issue 36) and failed only once ``setup`` built the samples.
"""

from __future__ import annotations

from pathlib import Path

import albumentations as A
import pytest

from seg_datamodule import COCOSegDataModule
from seg_datamodule.data.config.options import AugmentOptions
from seg_datamodule.transforms.pixel.hsv import HSVJitter


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(copy_paste=1.5), r"copy_paste must be .*1\.5"),
    (dict(copy_paste=-0.1), "copy_paste"),
    (dict(mixup=2.0), r"mixup must be .*2\.0"),
    (dict(copy_paste=0.5, copy_paste_mode="mirror"), "copy_paste_mode"),
    (dict(transforms=A.Compose([A.Blur(p=0.1), A.Compose([A.Resize(64, 64)])])), r"must not resize \(Resize\)"),
])
def test_a_bad_augmentation_key_fails_in_init(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        COCOSegDataModule(**kwargs)


def test_a_missing_transforms_file_fails_in_init(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        COCOSegDataModule(transforms=str(tmp_path / "missing.yaml"))


def test_the_options_object_checks_the_same_on_its_own() -> None:
    with pytest.raises(ValueError, match="copy_paste"):
        AugmentOptions(copy_paste=1.5)
    # The good values still construct.
    AugmentOptions(copy_paste=1.0, copy_paste_mode="batch", mixup=1.0, transforms=A.Compose([A.Blur(p=0.1)]),
                   hsv=HSVJitter((0.015, 0.7, 0.4)))
    COCOSegDataModule(copy_paste=1.0, mixup=0.0, transforms=A.Compose([A.HorizontalFlip(p=0.5)]))
