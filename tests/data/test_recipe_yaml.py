"""``recipe:`` as a list of steps: the same batches as the flat keys, parsed by the real CLI, refused at parse.

The CLI runs in a subprocess on coco-mini (``configs/coco.yaml``, a tiny model, one step); the
batches are compared with a DataModule built from the flat keys the list spells out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import albumentations as A
import pytest
import torch

from seg_datamodule.data.datamodule import COCOSegDataModule
from seg_datamodule.errors import UserInputError
from seg_datamodule.transforms import AlbumentationsTransform, HSVJitter, MosaicAffine, RandomFlipLR

ROOT = Path(__file__).resolve().parents[2]
HSV = (0.1, 0.7, 0.4)
PIPELINE = A.Compose([A.ToGray(p=0.5), A.Blur(p=0.5)])
FIELDS = ("images", "boxes", "labels", "masks", "boxes_per_image", "annotation_ids", "hsv_gains")


def _dm(demo_dir: Path, tmp_path: Path, **kwargs: Any) -> COCOSegDataModule:
    defaults = dict(image_size=128, batch_size=4, num_workers=0, demo_dir=str(demo_dir),
                    cache_dir=str(tmp_path / "index-cache"), seed=3)
    return COCOSegDataModule(**(defaults | kwargs))


def _batches(dm: COCOSegDataModule, n: int) -> list:
    out = []
    for batch in dm.train_dataloader():
        out.append(batch)
        if len(out) == n:
            return out
    return out


@pytest.mark.slow
def test_a_recipe_list_gives_the_batches_of_the_flat_keys(demo_dir: Path, tmp_path: Path) -> None:
    flat = _batches(_dm(demo_dir, tmp_path, flip_lr=0.3, degrees=5.0, transforms=PIPELINE, hsv=HSV,
                        hsv_on_device=True), 2)
    steps = [MosaicAffine(128, degrees=5.0), RandomFlipLR(0.3), AlbumentationsTransform(PIPELINE),
             HSVJitter(HSV, on_device=True)]
    listed = _batches(_dm(demo_dir, tmp_path, recipe=steps), 2)
    assert len(flat) == len(listed) == 2
    for a, b in zip(flat, listed):
        for name in FIELDS:
            assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_a_recipe_list_is_checked_against_the_flat_keys_in_init() -> None:
    with pytest.raises(UserInputError, match=r"recipe step 0 \(RandomFlipLR\) must be a Layout"):
        COCOSegDataModule(recipe=[RandomFlipLR(0.5)])
    with pytest.raises(UserInputError, match=r"hsv .* recipe list"):
        COCOSegDataModule(recipe=[MosaicAffine(640)], hsv=HSV)
    with pytest.raises(UserInputError, match=r"image_size is 320 but recipe step 0 \(MosaicAffine\) has 640"):
        COCOSegDataModule(image_size=320, recipe=[MosaicAffine(640)])
    dm = COCOSegDataModule(recipe=[MosaicAffine(640), RandomFlipLR(0.5)])
    assert dm.augment.recipe == "mosaic" and dm.augment.image_size == 640
    assert COCOSegDataModule(recipe="lsj").augment.recipe == "lsj"


_RECIPE_YAML = """\
data:
  hsv: null
  hsv_on_device: false  # coco.yaml's true would be refused: the list's HSVJitter step takes on_device
  transforms: null
  recipe:
    - class_path: seg_datamodule.transforms.MosaicAffine
      init_args: {{image_size: 128, degrees: 5.0}}
    - class_path: seg_datamodule.transforms.{second}
    - class_path: seg_datamodule.transforms.{third}
    - class_path: seg_datamodule.transforms.AlbumentationsTransform
      init_args:
        transforms:
          class_path: albumentations.Compose
          init_args:
            transforms:
              - class_path: albumentations.Blur
                init_args: {{p: 0.5, blur_limit: [3, 7]}}
"""


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "seg_datamodule", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=400)


def _fit(coco_mini: Path, tmp_path: Path, second: str, third: str, *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "recipe.yaml").write_text(_RECIPE_YAML.format(second=second, third=third))
    return _cli(["fit", "--config", str(ROOT / "configs" / "coco.yaml"), "--config", "recipe.yaml",
                 "--model.init_args.width", "8", "--model.init_args.num_prototypes", "8", "--data.image_size", "128",
                 "--data.num_workers", "0", "--data.cache_dir", str(tmp_path / "cache"),
                 "--data.train_ann", str(coco_mini / "annotations" / "instances_train2017.json"),
                 "--data.train_images", str(coco_mini / "train2017"), "--data.val_ann", "null",
                 "--data.val_images", "null", "--data.batch_size", "2", "--trainer.max_steps", "1",
                 "--trainer.precision", "32-true", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
                 "--trainer.logger", "false", *extra], tmp_path)


@pytest.mark.slow
def test_a_yaml_recipe_list_trains_through_the_cli(coco_mini: Path, tmp_path: Path) -> None:
    proc = _fit(coco_mini, tmp_path, "RandomFlipLR", "HSVJitter")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_an_impossible_order_fails_at_parse_naming_the_step(coco_mini: Path, tmp_path: Path) -> None:
    proc = _fit(coco_mini, tmp_path, "HSVJitter", "RandomFlipLR")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "RecipeError: recipe step 2 (RandomFlipLR) draws before decode" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_a_geometry_key_beside_a_recipe_list_fails_at_parse_in_one_line(coco_mini: Path, tmp_path: Path) -> None:
    """``configs/coco.yaml`` spells the geometry defaults out (accepted); a changed one was silently dropped."""
    proc = _fit(coco_mini, tmp_path, "RandomFlipLR", "HSVJitter", "--data.degrees", "10")
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = [line for line in proc.stderr.splitlines() if line and not line.startswith("Seed set to")]
    assert ("RecipeError: degrees is 10.0 beside a recipe list, which does not read the flat geometry keys: give it "
            "in the init_args of the list's MosaicAffine step (degrees)") in line
    assert not (tmp_path / "checkpoints").exists()
