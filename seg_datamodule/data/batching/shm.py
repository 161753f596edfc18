"""Shared-memory buffers that DataLoader workers reuse, handed back by the main process.

Why: a worker that allocates every batch in a fresh shared-memory segment pays the kernel to
zero-fill it, and the main process pays to map it and, when the batch is dropped, to unmap it:
for a 64 x 640^2 batch with masks (about 135 MB) freeing alone took 19 ms on the training thread.
Here each worker keeps a few segments (slots) and the main process keeps each segment it has
seen mapped, so a batch travels as file descriptors into mappings that already exist, and
dropping it unmaps nothing.

How a slot goes round: the worker takes a free slot (flag 0 -> 1, in a small shared flag table),
writes the batch into it and sends it with a :class:`Lease`. When the lease is unpickled in the
main process it registers the segment (a strong reference keeps it mapped). Each later arrival
checks the registered segments: one whose batch was delivered and that nothing references any
more (its storage's use count is down to the registry's own reference) is handed back (flag
-> 0). A batch the user keeps keeps its slot; when all of a worker's slots are taken the worker
allocates a fresh, unpooled segment, so holding batches is always correct, only slower.
"""

from __future__ import annotations

import os
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import get_worker_info

from seg_datamodule.compat import warn_unverified
from seg_datamodule.errors import UserInputError

__all__ = [
    "SHM_PATH", "Lease", "SharedBufferPool", "SharedMemoryError", "free_shared_memory", "pooling_available",
    "slots_that_fit",
]

#: Where DataLoader workers' shared memory lives on Linux (a tmpfs; Docker gives it 64 MB by default).
SHM_PATH = "/dev/shm"

# The main process's segments: (pool token, slot) -> [storage, flags while delivered and not yet
# handed back]. Batches may be unpickled by the main thread or a pin-memory thread: one lock.
_REGISTRY: dict[tuple[str, int], list[Any]] = {}
_LOCK = threading.Lock()


def pooling_available() -> bool:
    """Whether this torch's private hooks behave as the pool needs; warns once when they do not.

    The hand-back reads a storage's use count (``torch._C._storage_Use_Count``), which no
    public API gives. Checked by behaviour, not by version: the count of a fresh storage must be
    1, rise by one for a tensor viewing it and fall back when that tensor goes. Otherwise every
    batch gets a fresh segment, as with ``buffer_slots=0`` (correct, only slower).
    """
    problem = _use_count_problem()
    if problem is not None:
        warn_unverified("storage_use_count", problem, "DetectionCollate allocates a fresh shared-memory segment "
                        "per batch (buffer_slots has no effect).")
    return problem is None


def _use_count_problem() -> str | None:
    """What is wrong with the private use count, or None."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None or not hasattr(torch.UntypedStorage, "_new_shared"):
        return "this torch lacks torch._C._storage_Use_Count or torch.UntypedStorage._new_shared"
    try:
        storage = torch.UntypedStorage(8)
        alone = count(storage._cdata)
        view = torch.empty(0, dtype=torch.uint8).set_(storage)
        viewed = count(storage._cdata)
        del view
        after = count(storage._cdata)
    except Exception as error:  # a changed signature
        return f"torch._C._storage_Use_Count failed: {error!r}"
    if (alone, viewed, after) != (1, 2, 1):
        return f"use counts (alone, viewed, released) were {(alone, viewed, after)}, expected (1, 2, 1)"
    return None



class SharedBufferPool:
    """Per-worker slots of shared memory, reused once the main process is done with them.

    Create it in the main process before the DataLoader starts its workers (it is pickled, or
    inherited, with the collate function); only workers call :meth:`acquire`.

    Args:
        slots_per_worker (int): segments each worker may keep (>= 1).
        max_workers (int): rows of the flag table; worker ``w`` uses row ``w % max_workers``.
    """

    def __init__(self, slots_per_worker: int = 4, max_workers: int = 64) -> None:
        self.slots_per_worker = slots_per_worker
        self.max_workers = max_workers
        self.token = uuid.uuid4().hex
        self.flags = torch.zeros((max_workers, slots_per_worker), dtype=torch.int8).share_memory_()
        self._pid = -1
        self._storages: list[torch.UntypedStorage | None] = []

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pid"], state["_storages"] = -1, []  # each process keeps its own segments
        return state

    def acquire(self, nbytes: int) -> tuple[torch.UntypedStorage, Lease | None, bool]:
        """A shared storage of at least ``nbytes`` bytes for one batch.

        Returns:
            storage, its lease (None for an unpooled segment, e.g. outside a worker or when every
            slot is taken) and whether it is freshly allocated (zero-filled by the kernel).
        """
        info = get_worker_info()
        if info is None:
            return torch.UntypedStorage._new_shared(nbytes), None, True
        if self._pid != os.getpid():
            self._pid, self._storages = os.getpid(), [None] * self.slots_per_worker
        row = info.id % self.max_workers
        flags = self.flags[row]
        free = [k for k in range(self.slots_per_worker) if int(flags[k]) == 0]
        if not free:
            return torch.UntypedStorage._new_shared(nbytes), None, True
        # The smallest free slot that fits; else grow one (the old segment is dropped here and
        # replaced in the main process's registry when the new one arrives).
        fits = [k for k in free if self._storages[k] is not None and self._storages[k].nbytes() >= nbytes]
        fresh = not fits
        slot = min(fits, key=lambda k: self._storages[k].nbytes()) if fits else free[0]
        if fresh:
            self._storages[slot] = torch.UntypedStorage._new_shared(nbytes + nbytes // 8)
        flags[slot] = 1
        index = row * self.slots_per_worker + slot
        return self._storages[slot], Lease(self.token, self.flags, index, self._storages[slot]), fresh


@dataclass
class Lease:
    """Travels with a batch from a pooled slot; registers the slot when it reaches the main process."""

    token: str
    flags: torch.Tensor
    index: int
    storage: torch.UntypedStorage | None

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.storage is not None:
            with _LOCK:
                _hand_back_unused()
                _REGISTRY[(self.token, self.index)] = [self.storage, self.flags]
            self.storage = None  # the registry holds the one reference that keeps it mapped


def _hand_back_unused() -> None:
    """Mark free every delivered slot whose storage nothing but the registry references.

    Called with ``_LOCK`` held.
    """
    for key, entry in _REGISTRY.items():
        storage, flags = entry
        if flags is not None and torch._C._storage_Use_Count(storage._cdata) == 1:
            # A lease received inside inference mode (Lightning's evaluation and predict loops)
            # carries an inference tensor, which may only be written inside inference mode.
            with torch.inference_mode(flags.is_inference()):
                flags.view(-1)[key[1]] = 0
            entry[1] = None  # handed back; the next delivery of this slot re-arms it


class SharedMemoryError(UserInputError, RuntimeError):
    """The loader's batches cannot fit in the free shared memory (``/dev/shm``)."""


def free_shared_memory(path: str = SHM_PATH) -> int | None:
    """Bytes an unprivileged process may still allocate in ``path``; ``None`` where it is not a folder."""
    try:
        stats = os.statvfs(path)
    except OSError:  # no /dev/shm (another OS): torch shares memory another way
        return None
    return int(stats.f_bavail) * int(stats.f_frsize)


def slots_that_fit(batch_bytes: int, workers: int, slots: int, prefetch_factor: int, free_bytes: int | None,
                   what: str = "the loader") -> int:
    """The reused slots per worker that fit in ``free_bytes`` of shared memory, at most ``slots``.

    A loader keeps ``workers * prefetch_factor`` batches queued and the training loop holds two
    (the one it trains on and the one fetched ahead), each in shared memory however the slots go:
    that much must fit. On top, each worker keeps up to ``slots`` segments (each 1/8 larger than
    its batch, so batches that vary in size reuse it); fewer are kept when they would not fit
    (fewer slots cost speed, never correctness: a worker without a free slot allocates afresh).

    Args:
        batch_bytes: estimated shared-memory bytes of one batch (images, masks, the rest).
        workers: DataLoader worker processes (0: nothing is shared).
        slots: reused slots per worker asked for.
        prefetch_factor: batches each worker prepares ahead.
        free_bytes: free shared memory (:func:`free_shared_memory`); ``None`` skips the check.
        what: names the loader in messages.

    Returns:
        int: the slots per worker to use (0 to ``slots``).

    Raises:
        SharedMemoryError: the batches in flight alone do not fit; the message says how much is
            needed, how much is free and the fixes.
    """
    if workers == 0 or free_bytes is None:
        return slots
    in_flight = workers * prefetch_factor + 2
    need = in_flight * batch_bytes
    if need > free_bytes:
        mib = 1 << 20
        raise SharedMemoryError(
            f"{what} needs about {need / mib:,.0f} MiB of shared memory ({in_flight} batches in flight: "
            f"{workers} workers x prefetch_factor {prefetch_factor} + 2 in the training loop, about "
            f"{batch_bytes / mib:,.1f} MiB each) but {SHM_PATH} has {free_bytes / mib:,.0f} MiB free. Give it more "
            f"(Docker: --shm-size={max(1, -(-2 * need // (1 << 30)))}g, or --ipc=host; Kubernetes: an emptyDir "
            "with medium: Memory mounted at /dev/shm), or use fewer workers (num_workers), a smaller "
            "prefetch_factor or a smaller batch (batch_size)")
    per_slot = batch_bytes + batch_bytes // 8
    return int(min(slots, free_bytes // max(1, workers * per_slot)))
