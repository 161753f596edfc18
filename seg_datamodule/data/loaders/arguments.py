"""The arguments every DataLoader of the DataModule shares, and the shared memory its batches fit in.

* :func:`loader_kwargs`: the ``DataLoader`` arguments every loader of the module shares (workers,
  worker set-up, pinning, persistence, prefetch) with the package's collate;
* :func:`shm_slots`: before any worker starts, how many reused shared-memory slots per worker
  ``/dev/shm`` holds for the batches the loader will keep in flight, or a
  :class:`~seg_datamodule.data.batching.shm.SharedMemoryError` saying what is needed, what is free and
  the fixes; the batch it budgets for is :func:`batch_estimate`;
* :func:`worker_init_fn`: each worker's set-up (one thread, freed memory kept, a fresh cache).
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import get_worker_info

from seg_datamodule.data.batching.allocator import keep_freed_memory
from seg_datamodule.data.batching.collate import DEFAULT_BUFFER_SLOTS, DetectionCollate, batch_bytes
from seg_datamodule.data.config.options import LoaderOptions
from seg_datamodule.data.batching.shm import SHM_PATH, free_shared_memory, slots_that_fit

__all__ = ["LoaderPlan", "batch_estimate", "batch_targets", "loader_kwargs", "shm_slots", "worker_init_fn"]


class LoaderPlan:
    """One DataLoader to make: what it loads, in what batches, on how many ranks of this node.

    Args:
        options (LoaderOptions): the module's loader options.
        dataset: the dataset (a ``SegDataset``, or anything else: then no shared-memory estimate).
        batch_size (int): its batch size.
        local_ranks (int): processes on this node (they share ``/dev/shm``).
        what (str): the loader, for messages (``"the train loader"``).
    """

    def __init__(self, options: LoaderOptions, dataset: Any, batch_size: int, local_ranks: int, what: str) -> None:
        self.options, self.dataset, self.batch_size = options, dataset, batch_size
        self.local_ranks, self.what = local_ranks, what


def batch_targets(instance_counts: np.ndarray, batch_size: int, tiles: int = 1, mixing: float = 1.0) -> float:
    """Targets to budget one batch's shared memory for: a batch with the index's most crowded image.

    A sample draws from ``tiles`` images (four for a mosaic: with ``mosaic_partners: batch`` each
    image of a batch is in four of its samples' tiles, once as the main tile). Budgeting every tile
    at the mean fails exactly where it matters: a batch that holds a crowded image (LVIS has
    images with 100 instances beside a mean of 10) ran 30% over it. So: an average image in every
    tile, and the most crowded image in ``tiles`` of them in place of an average one, times what
    copy-paste and MixUp add (``mixing``). An estimate of the batches a loader makes, not a bound
    over every batch a sampler could draw (two of the most crowded images in one batch), which
    would budget for the worst ``batch_size`` images and refuse runs that fit.

    Args:
        instance_counts (ndarray[I] int): target instances per image of the index.
        batch_size: images per batch.
        tiles: images a sample draws from (4 for a mosaic, else 1).
        mixing: ``(1 + copy_paste) * (1 + mixup)``: their expected extra targets.

    Returns:
        float: targets per batch.
    """
    counts = np.asarray(instance_counts, np.float64)
    if counts.size == 0:
        return 0.0
    mean, most = float(counts.mean()), float(counts.max())
    return tiles * (batch_size * mean + most - mean) * mixing


def batch_estimate(plan: LoaderPlan, canvas_size: tuple[int, int]) -> int | None:
    """Shared-memory bytes to budget for one batch of ``plan``'s loader (:func:`batch_targets`),
    or None when its dataset has no index to count (a streamed one)."""
    index = getattr(plan.dataset, "index", None)
    counts = getattr(index, "instance_counts", None)
    if counts is None:
        return None
    augment = getattr(plan.dataset, "augment", None)
    tiles, mixing = 1, 1.0
    if getattr(plan.dataset, "train", False) and augment is not None:
        if augment.mosaic > 0 and augment.geometry.mosaic_capable:
            tiles = 4
        mixing = (1.0 + augment.copy_paste) * (1.0 + augment.mixup)
    targets = batch_targets(counts, plan.batch_size, tiles, mixing)
    return batch_bytes(plan.batch_size, canvas_size, targets / max(1, plan.batch_size), plan.options.mask_stride)


def shm_slots(plan: LoaderPlan, canvas_size: tuple[int, int]) -> int:
    """Reused shared-memory slots per worker that ``/dev/shm`` holds, checked before any worker starts.

    The batch is estimated from the index (:func:`batch_estimate`); every rank on the node
    counts, since they share ``/dev/shm``.

    Raises:
        SharedMemoryError: the batches in flight alone do not fit (the message says how much
            is needed, how much is free and the fixes).
    """
    slots, options = DEFAULT_BUFFER_SLOTS, plan.options
    nbytes = batch_estimate(plan, canvas_size) if options.num_workers else None
    if nbytes is None:
        return slots
    fit = slots_that_fit(nbytes, options.num_workers * plan.local_ranks, slots, options.prefetch or 2,
                         free_shared_memory(), plan.what)
    if fit < slots:
        rank_zero_warn(f"{plan.what}: {SHM_PATH} holds {fit} reused shared-memory slots per worker, not "
                       f"{slots} (about {nbytes / (1 << 20):,.1f} MiB a batch); batches beyond them are "
                       "allocated afresh (slower, still exact). More shared memory: Docker --shm-size")
    return fit


def loader_kwargs(plan: LoaderPlan, canvas_size: tuple[int, int], on_cuda: bool) -> dict[str, Any]:
    """The ``DataLoader`` keyword arguments of ``plan``: workers, collate, pinning, persistence, prefetch.

    Args:
        plan (LoaderPlan): the loader to make.
        canvas_size (tuple[int, int]): (H, W) of the batches, for the shared-memory estimate.
        on_cuda (bool): batches go to a CUDA device (pinning only pays, and only works, then).
    """
    options = plan.options
    workers = options.num_workers
    return dict(
        num_workers=workers,
        collate_fn=DetectionCollate(mask_stride=options.mask_stride, buffer_slots=shm_slots(plan, canvas_size),
                                    mask_fill=options.mask_fill),
        pin_memory=options.pin_memory and on_cuda,
        worker_init_fn=worker_init_fn if workers > 0 else None,
        persistent_workers=options.persistent_workers and workers > 0,
        prefetch_factor=options.prefetch,
    )


def worker_init_fn(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: one thread per worker, a fresh per-worker cache.

    ``cv2.setNumThreads(0)`` and ``torch.set_num_threads(1)`` stop each worker from spawning a
    thread pool per core (with ``W`` workers on ``C`` cores that is ``W x C`` threads fighting).
    :func:`~seg_datamodule.data.batching.allocator.keep_freed_memory` keeps freed canvases in the worker's
    heap. No seeding is needed: every sample seeds its own generator from ``(seed, epoch, index)``.
    """
    cv2.setNumThreads(0)
    torch.set_num_threads(1)
    keep_freed_memory()  # a worker's canvases reuse the last batch's pages (data/batching/allocator.py)
    info = get_worker_info()
    dataset = getattr(info, "dataset", None)
    if hasattr(dataset, "on_worker_start"):
        dataset.on_worker_start()
