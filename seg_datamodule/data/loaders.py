"""How the DataModule's DataLoaders are made: one set of options, and shared memory that fits.

* :func:`loader_kwargs`: the ``DataLoader`` arguments every loader of the module shares (workers,
  worker set-up, pinning, persistence, prefetch) with the package's collate;
* :func:`shm_slots`: before any worker starts, how many reused shared-memory slots per worker
  ``/dev/shm`` holds for the batches the loader will keep in flight, or a
  :class:`~seg_datamodule.data.shm.SharedMemoryError` saying what is needed, what is free and
  the fixes.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from seg_datamodule.data.collate import DEFAULT_BUFFER_SLOTS, DetectionCollate, batch_bytes
from seg_datamodule.data.loading import worker_init_fn
from seg_datamodule.data.options import LoaderOptions
from seg_datamodule.data.shm import SHM_PATH, free_shared_memory, slots_that_fit

__all__ = ["LoaderPlan", "loader_kwargs", "shm_slots"]


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


def shm_slots(plan: LoaderPlan, canvas_size: tuple[int, int]) -> int:
    """Reused shared-memory slots per worker that ``/dev/shm`` holds, checked before any worker starts.

    The batch is estimated from the index's mean instances per image (four tiles' worth for a
    mosaic); every rank on the node counts, since they share ``/dev/shm``.

    Raises:
        SharedMemoryError: the batches in flight alone do not fit (the message says how much
            is needed, how much is free and the fixes).
    """
    slots, options = DEFAULT_BUFFER_SLOTS, plan.options
    index = getattr(plan.dataset, "index", None)
    if options.num_workers == 0 or not hasattr(index, "num_instances"):
        return slots
    per_image = index.num_instances / max(1, len(index))
    augment = getattr(plan.dataset, "augment", None)
    if getattr(plan.dataset, "train", False) and augment is not None and augment.mosaic > 0:
        per_image *= 4
    nbytes = batch_bytes(plan.batch_size, canvas_size, per_image, options.mask_stride)
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
        collate_fn=DetectionCollate(mask_stride=options.mask_stride, buffer_slots=shm_slots(plan, canvas_size)),
        pin_memory=options.pin_memory and on_cuda,
        worker_init_fn=worker_init_fn if workers > 0 else None,
        persistent_workers=options.persistent_workers and workers > 0,
        prefetch_factor=options.prefetch,
    )
