"""A newcomer's step: one class, defined here, trains in a real (tiny) Trainer; the guide's example runs.

``docs/guides/custom-steps.md`` shows the one class a user writes; its Python block is executed
here against the demo data (``tests/test_readme.py`` runs it too, as a user would).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import lightning as L
import numpy as np
import pytest

from seg_datamodule import COCOSegDataModule
from seg_datamodule.models import YolactLite
from seg_datamodule.transforms import (Canvas, CanvasStep, DrawPhase, MosaicAffine, RandomFlipLR, RandomFlipUD,
                                       RandomRotate90)

ROOT = Path(__file__).resolve().parents[2]


class _SwapRedBlue(CanvasStep):
    """A pixel step written as a user would: swap the red and blue channels with probability ``p``."""

    phase: ClassVar[DrawPhase] = "pixels"
    applied: ClassVar[list[bool]] = []

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def draw(self, rng: np.random.Generator) -> bool:
        return bool(rng.random() < self.p)

    def apply(self, canvas: Canvas, params: bool) -> Canvas:
        _SwapRedBlue.applied.append(params)
        return replace(canvas, image=np.ascontiguousarray(canvas.image[..., ::-1])) if params else canvas


@pytest.mark.slow
def test_a_step_defined_here_trains_in_a_real_trainer(demo_dir: Path, tmp_path: Path) -> None:
    _SwapRedBlue.applied.clear()
    recipe = [MosaicAffine(64), RandomFlipLR(0.5), RandomFlipUD(0.5), RandomRotate90(0.5), _SwapRedBlue(0.5)]
    dm = COCOSegDataModule(demo_dir=str(demo_dir), image_size=64, batch_size=2, num_workers=0,
                           cache_dir=str(tmp_path / "cache"), recipe=recipe)
    trainer = L.Trainer(accelerator="cpu", max_steps=2, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(YolactLite(num_classes=dm.num_classes, width=4, num_prototypes=4), datamodule=dm)
    assert trainer.global_step == 2
    # Every sample of the two batches went through the step, drawn from its own generator.
    assert len(_SwapRedBlue.applied) >= 4 and any(_SwapRedBlue.applied) and not all(_SwapRedBlue.applied)
    assert dm.train_dataset is not None and dm.train_dataset.path.recipe.pixel_steps == (recipe[-1],)


def test_the_guides_example_runs(demo_dir: Path, tmp_path: Path) -> None:
    text = (ROOT / "docs" / "guides" / "custom-steps.md").read_text()
    [block] = re.findall(r"```python\n(.*?)```", text, re.S)
    # The demo data this session generated, not the user's cache dir.
    source = block.replace("num_workers=0,", f"num_workers=0, demo_dir={str(demo_dir)!r}, "
                                             f"cache_dir={str(tmp_path / 'cache')!r},")
    assert source != block
    scope: dict = {"__name__": "guide"}
    exec(compile(source, "custom-steps.md", "exec"), scope)  # noqa: S102 (the project's own page)
    assert issubclass(scope["RandomInvert"], CanvasStep)
    assert scope["batch"].images.shape[0] == 4


@pytest.mark.slow
def test_the_guides_yaml_trains_through_the_cli_on_top_of_the_demo_config(demo_dir: Path, tmp_path: Path) -> None:
    """The guide's YAML as a user runs it: ``my_recipe.yaml`` over ``configs/demo.yaml`` (its CSV
    logger attached), the guide's ``RandomInvert`` in ``my_package/steps.py``."""
    import os
    import subprocess
    import sys

    import yaml

    text = (ROOT / "docs" / "guides" / "custom-steps.md").read_text()
    [python] = re.findall(r"```python\n(.*?)```", text, re.S)
    [shown] = re.findall(r"```yaml\n(.*?)```", text, re.S)
    package = tmp_path / "my_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "steps.py").write_text(python.split("# The demo data")[0])  # the imports and the class
    (tmp_path / "my_recipe.yaml").write_text(shown)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "seg_datamodule", "fit", "--config", str(ROOT / "configs" / "demo.yaml"),
         "--config", "my_recipe.yaml", "--data.demo_dir", str(demo_dir), "--data.cache_dir", str(tmp_path / "cache"),
         "--data.num_workers", "0", "--data.batch_size", "2", "--model.init_args.width", "4",
         "--model.init_args.num_prototypes", "4", "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0",
         "--trainer.accelerator", "cpu"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = yaml.safe_load(next((tmp_path / "runs" / "demo").glob("version_*/config.yaml")).read_text())
    assert [s["class_path"] for s in config["data"]["recipe"]][-1] == "my_package.steps.RandomInvert"
    assert list(tmp_path.rglob("last.ckpt"))  # demo.yaml's ModelCheckpoint wrote it after the 2 steps
