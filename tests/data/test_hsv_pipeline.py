"""HSV jitter through the data path: worker vs device, the batch's gains, workers, refusals, a Trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import albumentations as A
import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer

from _datasets import make_dataset
from seg_datamodule import DetectionBatch
from seg_datamodule.data.batching.collate import DetectionCollate
from seg_datamodule.data.datamodule import COCOSegDataModule
from seg_datamodule.models import YolactLite
from seg_datamodule.structures import Polygons, Sample
from seg_datamodule.transforms.pixel.hsv import hsv_jitter

HSV = (0.1, 0.7, 0.4)
# Pixel-only steps whose outcome depends on when the jitter runs (it runs after them).
PIPELINE = A.Compose([A.ToGray(p=0.5), A.Blur(p=0.5), A.CLAHE(p=0.5)])


def make_dm(demo_dir: Path, tmp_path: Path, **kwargs: Any) -> COCOSegDataModule:
    defaults = dict(image_size=128, batch_size=4, num_workers=0, demo_dir=str(demo_dir),
                    cache_dir=str(tmp_path / "index-cache"), seed=3, transforms=PIPELINE)
    return COCOSegDataModule(**(defaults | kwargs))


def first_batches(dm: COCOSegDataModule, n: int) -> list[DetectionBatch]:
    out = []
    for batch in dm.train_dataloader():
        out.append(batch)
        if len(out) == n:
            break
    return out


def _hwc(images: torch.Tensor) -> np.ndarray:
    return images.permute(0, 2, 3, 1).numpy()


@pytest.mark.slow
def test_device_path_ships_the_worker_paths_gains(demo_dir: Path, tmp_path: Path) -> None:
    plain = first_batches(make_dm(demo_dir, tmp_path), 3)
    worker = first_batches(make_dm(demo_dir, tmp_path, hsv=HSV), 3)
    dm = make_dm(demo_dir, tmp_path, hsv=HSV, hsv_on_device=True)
    device = first_batches(dm, 3)
    for p, w, d in zip(plain, worker, device):
        assert p.hsv_gains is None and w.hsv_gains is None
        assert d.hsv_gains is not None and d.hsv_gains.dtype == torch.float64 and d.hsv_gains.shape == (4, 3)
        assert (d.hsv_gains.abs() <= torch.tensor(HSV, dtype=torch.float64)).all()
        # The jitter is the sample's last draw: nothing else moves, on either path.
        for name in ("boxes", "labels", "masks", "image_ids", "annotation_ids", "ignore_masks"):
            assert torch.equal(getattr(p, name), getattr(w, name)) and torch.equal(getattr(p, name), getattr(d, name))
        assert torch.equal(d.images, p.images)  # un-jittered until the device step
        # The worker path is hsv_jitter (what RandomHSV applies) after the pipeline, bit for bit.
        expected = np.stack([hsv_jitter(image, g) for image, g in zip(_hwc(p.images), d.hsv_gains.numpy())])
        np.testing.assert_array_equal(_hwc(w.images), expected)
        # The device step (on the CPU here) gives the worker's images within one grey level.
        assert dm.on_after_batch_transfer(d, 0) is d and d.hsv_gains is None
        assert np.abs(_hwc(d.images).astype(np.int16) - _hwc(w.images)).max() <= 1
    # Validation batches carry no gains and pass the hook unchanged.
    dm.setup("validate")
    val = next(iter(dm.val_dataloader()))
    before = val.images.clone()
    assert val.hsv_gains is None and torch.equal(dm.on_after_batch_transfer(val, 0).images, before)


@pytest.mark.slow
def test_gains_and_images_do_not_depend_on_num_workers(demo_dir: Path, tmp_path: Path) -> None:
    a = first_batches(make_dm(demo_dir, tmp_path, hsv=HSV, hsv_on_device=True), 4)
    b = first_batches(make_dm(demo_dir, tmp_path, hsv=HSV, hsv_on_device=True, num_workers=2,
                              persistent_workers=False), 4)
    for x, y in zip(a, b):
        assert torch.equal(x.hsv_gains, y.hsv_gains) and torch.equal(x.images, y.images)
    assert not torch.equal(a[0].hsv_gains, a[1].hsv_gains)


def test_bad_hsv_arguments(demo_dir: Path, tmp_path: Path) -> None:
    dm = make_dm(demo_dir, tmp_path, hsv=HSV)
    dm.setup("fit")
    with pytest.raises(TypeError, match="hsv must be an HSVJitter"):
        make_dataset(dm.train_index, image_size=128, hsv=HSV)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="three numbers"):
        make_dm(demo_dir, tmp_path, hsv=0.5)


def _sample(image_id: int, gains: np.ndarray | None) -> Sample:
    return Sample(image=np.full((16, 16, 3), image_id, np.uint8), image_id=image_id, polygons=Polygons.empty(),
                  labels=np.zeros(0, np.int64), annotation_ids=np.zeros(0, np.int64), hsv_gains=gains)


@pytest.mark.parametrize("shared_memory", [False, True])
def test_collate_ships_float64_gains_or_none(shared_memory: bool) -> None:
    collate = DetectionCollate(shared_memory=shared_memory, buffer_slots=0)
    gains = np.array([[0.0123456789012345, -0.5, 0.25], [-0.01, 0.3, -0.4]])
    batch = collate([_sample(1, gains[0]), _sample(2, gains[1])])
    assert batch.hsv_gains.dtype == torch.float64
    np.testing.assert_array_equal(batch.hsv_gains.numpy(), gains)
    assert collate([_sample(1, None), _sample(2, None)]).hsv_gains is None
    with pytest.raises(ValueError, match="image id 2: hsv_gains on some"):
        collate([_sample(1, gains[0]), _sample(2, None)])
    with pytest.raises(ValueError, match="image id 3: hsv_gains must be"):
        collate([_sample(3, np.zeros(2))])


class _Recording(YolactLite):
    """YolactLite that records what training_step sees, with its own on_after_batch_transfer."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[tuple[torch.Tensor, Any]] = []
        self.own_hook_calls = 0

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.own_hook_calls += 1
        return batch

    def training_step(self, batch: DetectionBatch, batch_idx: int) -> Any:
        self.seen.append((batch.images.clone(), batch.hsv_gains))
        return super().training_step(batch, batch_idx)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:You have overridden `on_after_batch_transfer` in both:UserWarning")
def test_trainer_sees_the_jittered_batch(demo_dir: Path, tmp_path: Path) -> None:
    worker = first_batches(make_dm(demo_dir, tmp_path, hsv=HSV), 2)
    dm = make_dm(demo_dir, tmp_path, hsv=HSV, hsv_on_device=True)
    model = _Recording(num_classes=dm.num_classes, width=8, num_prototypes=4)
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0,
                      num_sanity_val_steps=0)
    trainer.fit(model, datamodule=dm)
    assert len(model.seen) == 2 and model.own_hook_calls == 2  # the model's own hook still runs
    for (images, gains), w in zip(model.seen, worker):
        assert gains is None  # applied before the model saw the batch
        assert np.abs(_hwc(images).astype(np.int16) - _hwc(w.images)).max() <= 1
