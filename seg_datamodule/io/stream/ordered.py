"""LitData serving the project's global order: :class:`OrderedRecords` (issue 63).

LitData stays the engine: chunks, downloads ahead, the local cache and its reference counts, S3,
and the checks of what it reads (:class:`~seg_datamodule.io.stream.loader.StreamRecords`). Only
the order is ours: in each worker, :meth:`OrderedRecords.__iter__` computes the worker's batches
(:mod:`seg_datamodule.io.stream.order`) and hands them to LitData as a plan of chunk visits, the
same form LitData 0.2.76's own elastic resume feeds its iterator (``worker_chunks`` with one item
list per visit, ``litdata.streaming.elastic.worker_plan_to_chunks``). LitData then downloads the
visits' chunks ahead, in plan order, and reads the items by index from them.

Each record carries ``"position"``, its place in the epoch's order; the collate puts a batch back
in that order (a batch is read chunk by chunk) and checks that it is one contiguous run of the
order, so a LitData that stopped following the plan is an error, not a silent other order.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter, deque
from time import time
from typing import Any

from filelock import FileLock, Timeout
from litdata import StreamingDataset
from litdata.streaming.elastic import worker_plan_to_chunks
from litdata.streaming.sampler import ChunkedIndex
from litdata.utilities.env import _DistributedEnv, _WorkerEnv

from seg_datamodule.io.stream.loader import StreamRecords
from seg_datamodule.io.stream.order import (
    DEFAULT_WINDOW,
    batch_count,
    chunk_offsets,
    chunks_digest,
    epoch_order,
    gc_paused,
    per_rank_batch,
    worker_plan,
)

__all__ = ["OrderedRecords", "change_references"]

_ASYNC_PREFETCH = "LITDATA_ASYNC_CHUNK_PREFETCH"  # litdata.streaming.async_prefetch.async_chunk_prefetch_enabled

# The private LitData names this module sets or calls (checked at construction, as check_litdata does).
_PLAN_ATTRIBUTES = ("worker_chunks", "worker_intervals", "_elastic_item_lists", "upcoming_indexes", "stop_length",
                    "worker_next_chunk_index", "global_index", "num_chunks", "consumed_sample_count_in_curr_chunk",
                    "has_triggered_download")


_LOCK_TIMEOUT_S = 30.0  # waiting on a co-worker's count update; LitData's own waits 1-3 s, then drops it


def change_references(config: Any, chunk: int, delta: int) -> int:
    """Add ``delta`` references to a chunk's count in LitData's node-wide cache; the new count.

    LitData 0.2.76 keeps a chunk's reference count in ``<chunk file>.cnt`` beside the chunk, under
    the file lock ``<chunk file>.cnt.lock`` (``Downloader._increment_local_lock``,
    ``ChunksConfig.decrement_local_lock``), and deletes a chunk only while its count is 0. This is
    the same update by ``delta`` at once (a worker's visits to a chunk can number in the
    thousands); a count that reaches 0 loses its file, as LitData's decrement does.

    Args:
        config: the reader's ``litdata.streaming.config.ChunksConfig``.
        chunk (int): the chunk's index.
        delta (int): references to add (negative: to drop); 0 does nothing.

    Returns:
        int: the count after the change (0 for a delta of 0, or where LitData keeps no counts: no
            download, no cache).

    Raises:
        RuntimeError: the count stayed locked for 30 s (a reference lost silently would let a
            co-worker delete the chunk under this one).
    """
    if delta == 0 or getattr(config, "_downloader", None) is None:
        return 0
    count_path = config._chunk_lock_filepath(chunk) + ".cnt"
    try:
        with FileLock(count_path + ".lock", timeout=_LOCK_TIMEOUT_S):
            try:
                with open(count_path) as f:
                    count = int(f.read().strip() or 0)
            except (FileNotFoundError, ValueError):
                count = 0
            count = max(0, count + delta)
            if count:
                with open(count_path, "w") as f:
                    f.write(str(count))
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(count_path)
    except Timeout:
        raise RuntimeError(f"{count_path}: the chunk's reference count stayed locked for {_LOCK_TIMEOUT_S:.0f} s") \
            from None
    return count


class OrderedRecords(StreamRecords):
    """:class:`StreamRecords` streamed in the global order of :func:`~seg_datamodule.io.stream.order.epoch_order`.

    The loader sets :attr:`global_batch` (``batch_size x world_size``) and, for a resumed epoch,
    :attr:`start` (global items of the epoch already trained on); LitData's ``current_epoch`` (1-based)
    is the epoch. Ranks come from ``torch.distributed`` as LitData reads them, or ``world``.

    Args:
        input_dir: the source (see :class:`StreamRecords`).
        window (int): chunks per shuffle block.
        world (tuple[int, int] | None): ``(rank, world_size)`` to stream as (a simulated rank in
            tests and benchmarks); None: LitData's detection.
        **kwargs: as for :class:`StreamRecords` (``shuffle`` is refused: the order is the project's).

    Raises:
        TypeError: ``shuffle`` given.
        RuntimeError: this LitData lacks a private name the plan is set through.
    """

    def __init__(self, input_dir: str, *, window: int = DEFAULT_WINDOW, world: tuple[int, int] | None = None,
                 **kwargs: Any) -> None:
        if "shuffle" in kwargs:
            raise TypeError("OrderedRecords follows the global order: shuffle cannot be given")
        super().__init__(input_dir, shuffle=False, **kwargs)
        # LitData's __next__ must still read the plan from these names (its elastic path's).
        missing = [name for name in _PLAN_ATTRIBUTES if name not in StreamingDataset.__next__.__code__.co_names]
        if missing:
            raise RuntimeError(f"litdata.StreamingDataset has no {missing}: the streamed global order is set through "
                               "them (verified on litdata 0.2.76)")
        if world is not None:
            rank, size = world
            if not 0 <= rank < size:
                raise ValueError(f"world must be (rank, world_size) with 0 <= rank < world_size, got {world}")
            self.distributed_env = _DistributedEnv(size, rank, 1)
        self.window = int(window)
        self.offsets = chunk_offsets(self.chunk_sizes)
        self.global_batch: int | None = None
        self.start = 0
        self._positions: dict[int, int] = {}
        self._visits_left: Counter[int] = Counter()  # this epoch's visits not yet ended, by chunk
        self._reading: int | None = None  # the chunk of the visit being read

    @property
    def world_size(self) -> int:
        return int(self.distributed_env.world_size)

    @property
    def num_records(self) -> int:
        return int(self.offsets[-1])

    @property
    def digest(self) -> str:
        return chunks_digest(self.chunk_sizes)

    def _global_batch(self) -> int:
        if self.global_batch is None:
            self.global_batch = int(self.batch_size or 1) * self.world_size
        per_rank_batch(self.global_batch, self.world_size)
        return self.global_batch

    def get_len(self, num_workers: int, batch_size: int) -> int:
        """Items this rank streams in a whole epoch (a resumed epoch streams its rest of them)."""
        self.set_num_workers(num_workers)
        self.set_batch_size(batch_size)
        size = self._global_batch()
        n, world = self.num_records, self.world_size
        return (n // size) * (size // world) + (n % size if world == 1 else 0)

    def batches_in_epoch(self) -> int:
        """This rank's batches in a whole epoch (the same on every rank)."""
        return batch_count(self.num_records, self._global_batch(), self.world_size)

    def __iter__(self) -> "OrderedRecords":
        # In the global order every worker of a node asks for the same chunks at about the same
        # time. LitData 0.2.76's async prefetch (on by default for a remote source) downloads
        # without the per-chunk file lock its synchronous path takes, so two workers each fetched
        # one chunk (measured: 8 of 12 chunks twice an epoch); the synchronous path fetched each
        # once. A user's own setting of the variable wins.
        os.environ.setdefault(_ASYNC_PREFETCH, "0")
        self._release_references()  # before the reader that holds them is replaced
        self.worker_env = _WorkerEnv.detect()
        self.cache = self._create_cache(worker_env=self.worker_env)
        intervals = self.cache.get_chunk_intervals()
        if [int(iv[0]) for iv in intervals] + [self.num_records] != self.offsets.tolist() or any(
                iv[1] != iv[0] or iv[2] != iv[3] for iv in intervals):
            raise RuntimeError(f"{self.input_dir.url or self.input_dir.path}: LitData's chunk intervals differ from "
                               "the checked index.json's chunk sizes; the global order cannot be served")
        self._shuffle_num_chunks = len(intervals)
        self.on_demand_bytes = False
        # 1. This worker's plan of the epoch's order, and 2. LitData's iterator state from it, as its own
        # elastic path sets it (dataset.py, _setup_elastic_resume). The whole epoch, before the first batch.
        env = self.distributed_env
        with gc_paused():
            order = epoch_order(self.seed, int(self.current_epoch) - 1, self.chunk_sizes, self.window)
            mine, self._positions = worker_plan(order, self.offsets, self._global_batch(), env.world_size,
                                                env.global_rank, self.worker_env.world_size, self.worker_env.rank,
                                                self.start)
            self.worker_chunks, self.worker_intervals, self._elastic_item_lists = worker_plan_to_chunks(mine)
        self.stop_length = sum(len(items) for items in self._elastic_item_lists)
        self.num_chunks = len(self.worker_chunks)
        self.upcoming_indexes = deque()
        self.worker_next_chunk_index = 0
        self.global_index = 0
        self.consumed_sample_count_in_curr_chunk = 0
        self.has_triggered_download = False
        self.last_time = time()
        # 3. One reference per visit, taken before any item is read. LitData 0.2.76 takes one per
        # chunk (``acquire_shared_locks``) but drops one at the end of every visit (``BinaryReader.read``),
        # and in the global order a worker visits a chunk once per batch of its block: one reference
        # for several visits let a co-worker delete a chunk this worker was still to read, or was
        # waiting on (a FileNotFoundError in LitData's wait, seen in CI), and re-downloaded it.
        # Counted per visit, a chunk goes when the node's last visit to it ends: once per epoch.
        reader = self.cache._reader
        visits = Counter(chunk for chunk, _ in mine)
        # Counted here, all of them: LitData's acquire_shared_locks would add one each but drops an
        # increment silently when the count's lock is busy for 1 s. Its "shared" sets must still
        # name the chunks, so that a download adds no reference of its own.
        reader.acquire_shared_locks(set())
        reader._shared_chunk_indexes = reader.config._shared_chunk_indexes = set(visits)
        config = reader.config
        for chunk, count in visits.items():
            change_references(config, chunk, count)
        self._visits_left, self._reading = visits, None
        # Every chunk memory-mapped, shared ones too: in the global order every worker reads every
        # block, and LitData 0.2.76 reads a chunk it may not map through a file handle it drops
        # unclosed at each chunk switch (PyTreeLoader._close_open_chunk). A map stays valid when a
        # co-worker deletes or re-downloads the file (POSIX keeps the mapped inode; LitData
        # publishes downloads by rename).
        reader.enable_mmap_for_chunks(set(visits))  # its own set: LitData may change the shared ones
        return self

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, ChunkedIndex) and index.chunk_indexes:
            # The first read hands LitData's prefetch thread the plan's chunks, one entry per
            # visit; walking them behind the reader, it fetched chunks again whose last visit had
            # passed and which were deleted. Each chunk once, in the order of its first visit.
            index.chunk_indexes = list(dict.fromkeys(int(c) for c in index.chunk_indexes))
        item = super().__getitem__(index)
        if isinstance(index, ChunkedIndex):
            # Mirror LitData's releases (BinaryReader.read): the visit left at a chunk switch, and
            # the last visit at the plan's last index.
            chunk = int(index.chunk_index)
            if chunk != self._reading:
                if self._reading is not None:
                    self._visits_left[self._reading] -= 1
                self._reading = chunk
            if index.is_last_index:
                self._visits_left[chunk] -= 1
            if isinstance(item, dict):
                item["position"] = self._positions.get(int(index.index), -1)
        return item

    def _release_references(self) -> None:
        """Drop the references of the visits an abandoned epoch did not make (a loader in this process)."""
        cache = getattr(self, "cache", None)
        if not self._visits_left or cache is None:
            return
        for chunk, left in self._visits_left.items():
            change_references(cache._reader.config, chunk, -left)
        self._visits_left = Counter()
