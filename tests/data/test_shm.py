"""Reused shared-memory slots: batches stay exact, a kept batch is never overwritten, and
receiving and dropping batches does not map or unmap segments per batch in the main process."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from seg_datamodule import DetectionCollate, Polygons, Sample
from seg_datamodule.data import shm


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
