"""The pipeline executes a recipe: its group step (copy-paste, MixUp) from the flat keys or a YAML list.

Batches built by :class:`~seg_datamodule.data.samples.pipeline.Pipeline` straight from a
:meth:`Recipe.from_flat <seg_datamodule.transforms.recipe.Recipe.from_flat>` recipe are compared
with the dataset's (the flat keys through ``AugmentOptions``) and with a recipe list ending with
the same group step; the YAML list goes through the real CLI in a subprocess, on coco-mini.
(``benchmarks/batch_hashes.py`` pins the batches against the code before the pipeline existed.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from _datasets import make_dataset
from seg_datamodule.data.config.options import AugmentOptions, SampleOptions
from seg_datamodule.data.samples.pipeline import Pipeline, SampleKey
from seg_datamodule.errors import UserInputError
from seg_datamodule.io.coco import CocoIndex
from seg_datamodule.structures import Sample
from seg_datamodule.transforms import HSVJitter, MosaicAffine, RandomFlipLR, Recipe, RecipeError, SampleMixing

ROOT = Path(__file__).resolve().parents[2]
MIX = dict(copy_paste=0.8, copy_paste_mode="batch", mixup=0.5)


@pytest.fixture(scope="module")
def index(coco_mini: Path, tmp_path_factory: pytest.TempPathFactory) -> CocoIndex:
    return CocoIndex.build(coco_mini / "annotations" / "instances_train2017.json", coco_mini / "train2017",
                           cache_dir=tmp_path_factory.mktemp("pipeline-cache"))


def _same(a: list[Sample], b: list[Sample]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert np.array_equal(x.image, y.image) and x.image_id == y.image_id
        assert np.array_equal(x.annotation_ids, y.annotation_ids) and np.array_equal(x.boxes, y.boxes)
        assert np.array_equal(x.polygons.vertices, y.polygons.vertices)
        assert np.array_equal(x.hsv_gains, y.hsv_gains) if x.hsv_gains is not None else y.hsv_gains is None


KEYS = [SampleKey(epoch=1, index=i, mosaic_allowed=True) for i in (0, 3, 5, 7)]


def test_a_pipeline_from_the_flat_recipe_gives_the_datasets_batch(index: CocoIndex) -> None:
    ds = make_dataset(index, 128, seed=5, hsv=HSVJitter(), **MIX)  # type: ignore[arg-type]
    geometry = ds.augment.geometry
    recipe = Recipe.from_flat(geometry, None, ds.path.recipe.hsv, SampleMixing(**MIX, min_area_ratio=0.1))
    pipeline = Pipeline(index, recipe, SampleOptions(), seed=5, cache_images=0, max_retries=10)
    samples, counts = pipeline.train_batch(KEYS)
    expected, expected_counts = ds.path.train_batch(KEYS)
    _same(samples, expected)
    assert counts == expected_counts and counts["pasted"] + counts["mixed_in"] > 0  # the group step ran
    one, one_counts = pipeline.train_one(KEYS[1])
    alone, alone_counts = ds.path.train_one(KEYS[1])
    _same([one], [alone])
    assert one_counts == alone_counts


def test_a_recipe_list_with_a_group_step_gives_the_flat_keys_batch(index: CocoIndex) -> None:
    layout = MosaicAffine(128)
    flat = make_dataset(index, geometry=layout, seed=2, **MIX)  # type: ignore[arg-type]
    listed = Recipe.from_steps([layout, layout.flip, SampleMixing(**MIX)])
    from_list = make_dataset(index, geometry=layout, seed=2, steps=listed)
    assert from_list.path.recipe.group is listed.group
    _same(from_list.path.train_batch(KEYS)[0], flat.path.train_batch(KEYS)[0])
    # A list without a group step takes the flat keys' one; a list with one refuses them.
    joined = AugmentOptions.from_recipe(Recipe.from_steps([layout, layout.flip]), **MIX)
    assert isinstance(joined.build_recipe().group, SampleMixing)
    with pytest.raises(RecipeError, match=r"copy_paste / mixup are set but the recipe list ends with a group step"):
        AugmentOptions.from_recipe(listed, copy_paste=0.5)
    assert AugmentOptions.from_recipe(Recipe.from_steps([layout])).build_recipe().group is None


_YAML = """\
data:
  hsv: null
  transforms: null
  recipe:
    - class_path: seg_datamodule.transforms.MosaicAffine
      init_args: {{image_size: 128}}
    - class_path: seg_datamodule.transforms.{second}
      init_args: {{{second_args}}}
    - class_path: seg_datamodule.transforms.{third}
      init_args: {{{third_args}}}
"""
_FLIP, _MIXING = ("RandomFlipLR", "p: 0.5"), ("SampleMixing", "copy_paste: 0.5, copy_paste_mode: batch, mixup: 0.2")


def _cli(coco_mini: Path, tmp_path: Path, second: tuple[str, str], third: tuple[str, str],
         *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "recipe.yaml").write_text(_YAML.format(second=second[0], second_args=second[1], third=third[0],
                                                       third_args=third[1]))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    args = ["fit", "--config", str(ROOT / "configs" / "coco.yaml"), "--config", "recipe.yaml",
            "--data.image_size", "128", "--data.num_workers", "0", "--data.cache_dir", str(tmp_path / "cache"),
            "--data.train_ann", str(coco_mini / "annotations" / "instances_train2017.json"),
            "--data.train_images", str(coco_mini / "train2017"), "--data.val_ann", "null",
            "--data.val_images", "null", "--trainer.max_steps", "1", "--trainer.accelerator", "cpu",
            "--trainer.devices", "1", "--trainer.logger", "false", *extra]
    return subprocess.run([sys.executable, "-m", "seg_datamodule", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=400)


@pytest.mark.slow
def test_a_yaml_recipe_with_a_group_step_parses_through_the_cli(coco_mini: Path, tmp_path: Path) -> None:
    proc = _cli(coco_mini, tmp_path, _FLIP, _MIXING, "--print_config")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "class_path: seg_datamodule.transforms.SampleMixing" in proc.stdout
    assert "copy_paste_mode: batch" in proc.stdout and "mixup: 0.2" in proc.stdout


@pytest.mark.slow
def test_a_misplaced_group_step_fails_at_parse_in_one_line(coco_mini: Path, tmp_path: Path) -> None:
    proc = _cli(coco_mini, tmp_path, _MIXING, _FLIP)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert ("RecipeError: recipe step 1 (SampleMixing) is a group step but comes before recipe step 2 "
            "(RandomFlipLR)") in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "checkpoints").exists()


def test_a_misplaced_group_step_is_a_user_input_error() -> None:
    with pytest.raises(UserInputError, match=r"recipe step 1 \(SampleMixing\) is a group step"):
        Recipe.from_steps([MosaicAffine(64), SampleMixing(0.5), RandomFlipLR(0.5)])
