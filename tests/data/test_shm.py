"""Reused shared-memory slots: batches stay exact, a kept batch is never overwritten, and
receiving and dropping batches does not map or unmap segments per batch in the main process; the
/dev/shm budget holds the real batches of crowded images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from seg_datamodule import DetectionCollate, Polygons, Sample
from seg_datamodule.data.batching import shm


def _sample(i: int, size: int = 48) -> Sample:
    rng = np.random.default_rng(i)
    n = int(rng.integers(0, 6))
    instances = [[rng.uniform(-4, size + 4, (int(rng.integers(3, 8)), 2))] for _ in range(n)]
    crowd = rng.random((size, size)) < 0.1 if i % 3 == 0 else None
    return Sample(image=rng.integers(0, 256, (size, size, 3), dtype=np.uint8), image_id=i,
                  polygons=Polygons.from_instances(instances), labels=np.zeros(n, np.int64),
                  annotation_ids=np.arange(n, dtype=np.int64) + 100 * i, crowd_mask=crowd)


class _Samples(Dataset):
    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> Sample:
        return _sample(i)


def _assert_same(a, b) -> None:
    for name in ("images", "masks", "ignore_masks", "boxes", "labels", "annotation_ids", "boxes_per_image"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.slow
@pytest.mark.parametrize("keep_every", [0, 3])
def test_reused_slots_give_exact_batches_and_never_overwrite_a_kept_one(keep_every: int) -> None:
    """Batches through reused slots equal the collate run in this process; batches the test keeps
    (every third one) hold their data to the end, so their slots were not handed back early."""
    collate = DetectionCollate(mask_stride=4, buffer_slots=2)
    loader = DataLoader(_Samples(), batch_size=4, num_workers=2, collate_fn=collate, prefetch_factor=2)
    reference = DetectionCollate(mask_stride=4, shared_memory=False)
    kept = []
    for k, batch in enumerate(loader):
        want = reference([_sample(i) for i in range(4 * k, 4 * k + 4)])
        _assert_same(batch, want)
        if keep_every and k % keep_every == 0:
            kept.append((k, batch))
    for k, batch in kept:
        _assert_same(batch, reference([_sample(i) for i in range(4 * k, 4 * k + 4)]))


@pytest.mark.slow
def test_main_process_keeps_segments_mapped_and_hands_them_back() -> None:
    """With slots, the main process sees at most slots x workers distinct segments however many
    batches arrive, and every slot is handed back once its batch is dropped."""
    collate = DetectionCollate(mask_stride=4, buffer_slots=3)
    loader = DataLoader(_Samples(), batch_size=4, num_workers=2, collate_fn=collate, prefetch_factor=1)
    pointers = set()
    for batch in loader:
        pointers.add(batch.masks.untyped_storage().data_ptr())
        del batch
    assert 1 <= len(pointers) <= 2 * 3
    registered = [entry for key, entry in shm._REGISTRY.items() if key[0] == collate.pool.token]
    assert registered and len(registered) <= 2 * 3
    with shm._LOCK:
        shm._hand_back_unused()
    assert int(collate.pool.flags.sum()) == 0  # nothing holds a batch: every slot is free again


def test_outside_workers_no_slot_is_taken() -> None:
    collate = DetectionCollate(mask_stride=4, shared_memory=True, buffer_slots=2)
    batch = collate([_sample(0), _sample(1)])
    assert not hasattr(batch, "_lease") and int(collate.pool.flags.sum()) == 0
    _assert_same(batch, DetectionCollate(mask_stride=4, shared_memory=False)([_sample(0), _sample(1)]))


def test_buffer_slots_is_checked() -> None:
    with pytest.raises(ValueError, match="buffer_slots must be >= 0, got -1"):
        DetectionCollate(buffer_slots=-1)
    with pytest.raises(TypeError, match="buffer_slots must be an int >= 0, got 1.5"):
        DetectionCollate(buffer_slots=1.5)


def test_without_the_private_use_count_it_warns_and_allocates_fresh(monkeypatch) -> None:
    monkeypatch.delattr(torch._C, "_storage_Use_Count")
    with pytest.warns(UserWarning, match="_storage_Use_Count"):
        collate = DetectionCollate(buffer_slots=2)
    assert collate.pool is None


def test_a_use_count_that_counts_otherwise_warns_once_and_allocates_fresh(monkeypatch) -> None:
    """The check is by behaviour: a use count that exists but no longer counts tensor views (as a
    changed torch might) is not trusted, and one warning names the torch verified."""
    monkeypatch.setattr(torch._C, "_storage_Use_Count", lambda cdata: 1)
    with pytest.warns(UserWarning, match=r"use counts \(alone, viewed, released\) were \(1, 1, 1\)") as caught:
        collate = DetectionCollate(buffer_slots=2)
    assert collate.pool is None
    assert "verified on torch 2.4.1 to 2.14.1" in str(caught[0].message)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        assert DetectionCollate(buffer_slots=2).pool is None


def test_this_torch_passes_the_use_count_check() -> None:
    assert shm._use_count_problem() is None and shm.pooling_available()


# ------------------------------------------------------------------ the /dev/shm budget


def test_the_budget_fits_fewer_slots_or_refuses_with_the_fixes() -> None:
    mib = 1 << 20
    # 2 workers x prefetch 2 + 2 in the loop = 6 batches of 10 MiB must fit; slots are 11.25 MiB each.
    assert shm.slots_that_fit(10 * mib, 2, 4, 2, 1000 * mib) == 4
    assert shm.slots_that_fit(10 * mib, 2, 4, 2, 70 * mib) == 3  # 70 // (2 x 11.25) = 3
    assert shm.slots_that_fit(10 * mib, 2, 4, 2, 60 * mib) == 2
    assert shm.slots_that_fit(10 * mib, 0, 4, 2, 1) == 4  # no workers: nothing shared
    assert shm.slots_that_fit(10 * mib, 2, 4, 2, None) == 4  # no /dev/shm to read
    with pytest.raises(shm.SharedMemoryError, match=r"the train loader needs about 60 MiB .*6 batches in flight.*"
                                                    r"about 10\.0 MiB each.*has 59 MiB free.*--shm-size=1g.*num_workers"):
        shm.slots_that_fit(10 * mib, 2, 4, 2, 59 * mib, "the train loader")


def test_the_batch_estimate_is_the_collates_allocation() -> None:
    collate = DetectionCollate(mask_stride=4, shared_memory=True, buffer_slots=0)
    samples = [_sample(i) for i in range(6)]
    batch = collate(samples)
    n = sum(s.num_instances for s in samples)
    real = batch.images.untyped_storage().nbytes()  # every output lives in this one allocation
    estimate = collate.batch_bytes(len(samples), (48, 48), n / len(samples))
    assert batch.masks.untyped_storage().data_ptr() == batch.images.untyped_storage().data_ptr()
    assert real <= estimate <= real + 64 * len(samples) + 40 * n + 4096


def test_free_shared_memory_reads_the_folder(tmp_path) -> None:
    assert shm.free_shared_memory(str(tmp_path)) > 0
    assert shm.free_shared_memory(str(tmp_path / "absent")) is None


_IN_SMALL_SHM = """
import sys
from seg_datamodule import COCOSegDataModule
dm = COCOSegDataModule(demo_dir=sys.argv[1], cache_dir=sys.argv[2], image_size=320, batch_size=8, num_workers=2)
dm.setup("fit")
batch = next(iter(dm.train_dataloader()))
print("batch", tuple(batch.images.shape))
"""


@pytest.mark.slow
@pytest.mark.parametrize("size,expect", [("4m", "needs about"), ("64m", "batch (8, 3, 320, 320)")])
def test_a_small_dev_shm_fails_at_once_with_the_fixes_or_fits(size, expect, demo_dir, tmp_path) -> None:
    """Docker's 64 MB default, in a private mount namespace with a small tmpfs at /dev/shm."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-m", "--propagation", "private", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
             "/dev/shm"], capture_output=True).returncode != 0:
        pytest.skip("unshare -m with a tmpfs mount is not permitted here")
    script = tmp_path / "run.py"
    script.write_text(_IN_SMALL_SHM)
    command = (f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {sys.executable} {script} "
               f"{demo_dir} {tmp_path / 'cache'}")
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", command],
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert expect in out, out[-3000:]
    if size == "4m":
        assert proc.returncode != 0 and "SharedMemoryError" in out and "--shm-size" in out
        assert "unable to allocate shared memory" not in out  # refused before any worker started
    else:
        assert proc.returncode == 0


# ------------------------------------------------------------------ the estimate against real batches


@pytest.fixture(scope="module")
def lvis_images(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """LVIS's 100-image file (real annotations: 9.8 instances per image, the most crowded 100) in v1
    form, with generated images of its sizes."""
    from _lvis import load_json, write_images, write_v1

    root = tmp_path_factory.mktemp("lvis")
    ann = write_v1(root / "lvis_v1_val_100.json")
    write_images(load_json(ann), root / "coco", from_url=True)
    return ann, root / "coco"


@pytest.mark.slow
@pytest.mark.parametrize("partners", ["batch", "uniform"])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_the_estimate_holds_real_mosaic_batches_of_crowded_images(
    lvis_images: tuple[Path, Path], tmp_path: Path, workers: int, partners: str
) -> None:
    """Every mosaic batch of an epoch fits the budget the loader checks /dev/shm with: its bytes (the
    collate's allocation for its targets) within the estimate, and with workers the shared segment
    it arrived in within a reused slot's size (1/8 above the estimate). Budgets of one tile an image
    or of four average tiles (the estimate before) would not hold these batches."""
    from seg_datamodule import COCOSegDataModule
    from seg_datamodule.data.batching.collate import batch_bytes
    from seg_datamodule.data.loaders.arguments import LoaderPlan, batch_estimate

    ann, images = lvis_images
    size, batch_size = (256, 256), 2  # small batches: a crowded image weighs most
    dm = COCOSegDataModule(train_ann=str(ann), train_images=str(images), image_size=size[0], batch_size=batch_size,
                           num_workers=workers, mosaic_partners=partners, cache_dir=str(tmp_path / "cache"), seed=0)
    dm.setup("fit")
    estimate = batch_estimate(LoaderPlan(dm.loader_options, dm.train_dataset, batch_size, 1, "train"), size)
    targets, needed, segments = [], [], []
    for batch in dm.train_dataloader():
        n, total = len(batch.image_ids), int(batch.boxes_per_image.sum())
        targets.append(total)
        needed.append(batch_bytes(n, size, total / n, 4))
        segments.append(batch.images.untyped_storage().nbytes())
    assert len(targets) == 50 and max(needed) <= estimate, (max(targets), estimate)
    if workers:  # the batches crossed in shared memory: each in a segment of at most a slot's size
        assert batch.images.is_shared() and max(segments) <= estimate + estimate // 8
    # The estimate before: four average tiles a sample (143 targets against 78 with batch partners,
    # 113 with uniform ones); one tile an image is less still.
    assert max(targets) > 4 * batch_size * dm.train_dataset.index.instance_counts.mean()
