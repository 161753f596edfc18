"""LitData serving the project's global order: :class:`OrderedRecords` (issue 63).

LitData stays the engine: chunks, downloads ahead, the local cache and its reference counts, S3,
and the checks of what it reads (:class:`~seg_datamodule.io.stream.loader.StreamRecords`). Only
the order is ours: in each worker, :meth:`OrderedRecords.__iter__` computes the worker's batches
(:mod:`seg_datamodule.io.stream.order`) and hands them to LitData as a plan of chunk visits, the
same form LitData 0.2.76's own elastic resume feeds its iterator (``worker_chunks`` with one item
list per visit, ``litdata.streaming.elastic.worker_plan_to_chunks``), with the chunks it is to
download (its share of the rank's, or every chunk it reads: see ``__iter__``). LitData then
downloads them ahead, in the order they are first needed, and reads the items by index.

Each record carries ``"position"``, its place in the epoch's order; the collate puts a batch back
in that order (a batch is read chunk by chunk) and checks that it is one contiguous run of the
order, so a LitData that stopped following the plan is an error, not a silent other order.
"""

from __future__ import annotations

import os

from collections import Counter, deque
from collections.abc import Sequence
from time import time
from typing import Any

from litdata import StreamingDataset
from litdata.streaming.item_loader import BaseItemLoader
from litdata.streaming.reader import PrepareChunksThread
from litdata.streaming.sampler import ChunkedIndex
from litdata.utilities.env import _DistributedEnv, _WorkerEnv

from seg_datamodule.io.stream.chunk_cache import (
    change_references,
    choose_async_prefetch,
    references_decide_deletes,
    see_co_workers_downloads,
)
from seg_datamodule.io.stream.loader import StreamRecords
from seg_datamodule.io.stream.order import (
    DEFAULT_WINDOW,
    EpochOrder,
    batch_count,
    chunk_offsets,
    chunks_digest,
    per_rank_batch,
    worker_positions,
)
from seg_datamodule.io.stream.plan import BlockVisits, Deal, NodeDownloads, WorkerPlan, downloads_ahead, gc_paused

__all__ = ["OrderedRecords"]

# The private LitData names this module sets or calls (checked at construction, as check_litdata does).
_PLAN_ATTRIBUTES = ("worker_chunks", "worker_intervals", "_elastic_item_lists", "upcoming_indexes", "stop_length",
                    "worker_next_chunk_index", "global_index", "num_chunks", "consumed_sample_count_in_curr_chunk",
                    "has_triggered_download")


class _PlanList(Sequence):
    """One of LitData's plan lists over a :class:`~seg_datamodule.io.stream.plan.WorkerPlan`, made as it is read.

    LitData 0.2.76's ``__next__`` reads its elastic plan by index, one visit at a time:
    ``worker_chunks[i]``, ``worker_intervals[i]`` (``[0, 0, n, n]`` for a visit of ``n`` items, as
    ``litdata.streaming.elastic.worker_plan_to_chunks`` writes it) and ``_elastic_item_lists[i]``.

    Args:
        plan: the worker's plan.
        field: ``"chunks"``, ``"intervals"`` or ``"items"``.
    """

    def __init__(self, plan: WorkerPlan, field: str) -> None:
        self.plan, self.field = plan, field

    def _one(self, visit: int) -> Any:
        self.plan.ensure(visit)
        if self.field == "chunks":
            return self.plan.chunks[visit]
        if self.field == "items":
            return self.plan.item_lists[visit]
        n = len(self.plan.item_lists[visit])
        return [0, 0, n, n]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._one(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        return self._one(index)

    def __len__(self) -> int:  # the whole plan: LitData's iteration never asks
        return len(self.plan.make_all().chunks)


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

    #: Items of a worker's plan made at a time (``WorkerPlan``): the first batch waits on one segment.
    segment_items: int = 4096
    #: Where the downloads are split: how far past the item read (in places of the order) this
    #: worker's downloads are handed to LitData. None: 8 blocks and 4 steps of every worker.
    ahead_items: int | None = None
    #: The ranks sharing this node's cache, consecutive ranks (the DataModule sets the Trainer's
    #: ``num_devices``; torchrun's ``LOCAL_WORLD_SIZE`` is read otherwise). Known, their workers split
    #: the node's downloads, and a reader waits on chunks other ranks' workers fetch: the ranks must
    #: stream at once, as a job's processes do. None: one rank alone on its node splits its own;
    #: ranks that may share a node (or are simulated with ``world``, stepped in turn from one
    #: process) each fetch what they read.
    ranks_on_node: int | None = None

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
        if not hasattr(BaseItemLoader, "set_chunk_ready_provider") or "_chunk_ready_provider" not in \
                BaseItemLoader._wait_until_chunk_ready.__code__.co_consts:
            raise RuntimeError("litdata's item loader waits on chunks without a readiness provider: a co-worker's "
                               "download would be seen late (verified on litdata 0.2.76)")
        for name in ("_slot_budget_enabled", "_maybe_delete_chunks", "_apply_delete"):
            if not callable(getattr(PrepareChunksThread, name, None)):
                raise RuntimeError(f"litdata's prefetch thread has no {name}: its disk-slot gate and its deletes "
                                   "cannot follow the global order's visits (verified on litdata 0.2.76)")
        self._simulated = world is not None
        if world is not None:
            rank, size = world
            if not 0 <= rank < size:
                raise ValueError(f"world must be (rank, world_size) with 0 <= rank < world_size, got {world}")
            self.distributed_env = _DistributedEnv(size, rank, 1)
        self.window = int(window)
        self.offsets = chunk_offsets(self.chunk_sizes)
        self.global_batch: int | None = None
        self.start = 0
        self._plan: WorkerPlan | None = None
        self._handed = False
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
        env = self.distributed_env
        self._release_references()  # before the reader that holds them is replaced
        self.worker_env = _WorkerEnv.detect()
        self.cache = self._create_cache(worker_env=self.worker_env)
        intervals = self.cache.get_chunk_intervals()
        if [int(iv[0]) for iv in intervals] + [self.num_records] != self.offsets.tolist() or any(
                iv[1] != iv[0] or iv[2] != iv[3] for iv in intervals):
            raise RuntimeError(f"{self.input_dir.url or self.input_dir.path}: LitData's chunk intervals differ from "
                               "the checked index.json's chunk sizes; the global order cannot be served")
        self._shuffle_num_chunks = len(intervals)
        reader = self.cache._reader
        # In the global order every worker of a node reads every chunk of a block. Where the node's
        # ranks are known, the workers of its ranks split the downloads (each chunk is on one
        # worker's list, ``NodeDownloads``) and each fetches its own with LitData's async prefetch,
        # several at once, handed over as far ahead of the reader as the cache budget allows
        # (``downloads_ahead``). Otherwise, or under a budget too small to read ahead of the
        # readers' spread, each worker's list is every chunk it reads, fetched one at a time under
        # LitData's per-chunk lock (its async path takes none: 8 of 12 chunks were fetched twice an
        # epoch), so that a chunk deleted under a budget, or needed by a reader that started late,
        # is fetched again by whoever needs it. A user's own setting of the async variable wins.
        budget = reader._max_cache_size
        below = bool(budget) and int(reader.config.num_bytes) > int(budget)
        on_node = self._ranks_on_node(env)
        self.on_demand_bytes = False
        # 1. This worker's plan of the epoch's order, made as it is read (``EpochOrder``, ``WorkerPlan``:
        # up front only the chunks' permutation and the worker's places in the order), and 2.
        # LitData's iterator state over it, as its own elastic path sets it (dataset.py,
        # _setup_elastic_resume).
        with gc_paused():
            order = EpochOrder(self.seed, int(self.current_epoch) - 1, self.chunk_sizes, self.window)
            deal = Deal(self._global_batch(), int(env.world_size), int(env.global_rank),
                        int(self.worker_env.world_size), int(self.worker_env.rank), self.start)
            positions, starts = worker_positions(len(order), *deal)
            self._plan = plan = WorkerPlan(order, positions, starts, self.offsets, segment_items=self.segment_items)
            self._ahead = downloads_ahead(order, deal, self.ahead_items,
                                          int(budget) * len(self.chunk_sizes) // max(1, int(reader.config.num_bytes))
                                          if below else None)
            self._split_downloads = on_node is not None and self._ahead is not None
            if self._split_downloads:  # this worker's share of the node's chunks, a block at a time
                self._downloads: NodeDownloads | list[int] = NodeDownloads(order, deal, on_node or 1)
            else:  # each chunk once, in the order of its first visit; its visits are counted below
                self._downloads = list(dict.fromkeys(plan.make_all().chunks))
        # Split under a budget, the visits are counted a block at a time as its downloads are handed
        # over, before the worker reads the block (``_more_downloads``).
        self._block_visits = BlockVisits(plan, order) if self._split_downloads and below else None
        choose_async_prefetch(on=self._split_downloads)
        self.worker_chunks, self.worker_intervals, self._elastic_item_lists = (
            _PlanList(plan, "chunks"), _PlanList(plan, "intervals"), _PlanList(plan, "items"))
        self.stop_length = plan.num_items
        # LitData ends the epoch at stop_length; the plan's visits are not yet counted, so
        # num_chunks is their bound (a visit holds an item) and __getitem__ marks the last index.
        self.num_chunks = plan.num_items
        self.upcoming_indexes = deque()
        self.worker_next_chunk_index = 0
        self.global_index = 0
        self.consumed_sample_count_in_curr_chunk = 0
        # The download list is handed over at the first read (__getitem__), not from worker_chunks[i:]
        # (the whole plan).
        self.has_triggered_download = True
        self._handed = False
        self.last_time = time()
        # 3. One reference per visit, taken before any item is read. LitData 0.2.76 takes one per
        # chunk (``acquire_shared_locks``) but drops one at the end of every visit (``BinaryReader.read``),
        # and in the global order a worker visits a chunk once per batch of its block: one reference
        # for several visits let a co-worker delete a chunk this worker was still to read, or was
        # waiting on (a FileNotFoundError in LitData's wait, seen in CI), and re-downloaded it.
        # Counted per visit, a chunk goes when the node's last visit to it ends: once per epoch.
        visits = Counter(plan.chunks) if plan.done else None
        reads = set(visits) if visits is not None else set(range(len(self.chunk_sizes)))
        # Counted here, all of them: LitData's acquire_shared_locks would add one each but drops an
        # increment silently when the count's lock is busy for 1 s. Its "shared" sets must still
        # name every chunk this worker may download, so that a download adds no reference of its
        # own: with the downloads split a worker fetches chunks only its co-workers read, and each
        # such download's reference was never dropped (170 chunks on disk under a 50 MB budget).
        reader.acquire_shared_locks(set())
        reader._shared_chunk_indexes = reader.config._shared_chunk_indexes = set(range(len(self.chunk_sizes)))
        # The download list is handed over at the first read (``__getitem__``); without this, a
        # worker with nothing to download would have LitData fetch each chunk as it reads it.
        reader._chunks_queued_for_download = True
        config = reader.config
        # With the downloads split, none is counted here: with a cache that holds the set LitData
        # deletes nothing, and under a budget they are counted a block at a time. A count costs a
        # file lock and two file operations per chunk (about 1 ms), for every chunk the worker
        # reads (nearly all of them): counted here, before the first batch.
        counted = Counter() if self._split_downloads or visits is None else visits
        for chunk, count in counted.items():
            change_references(config, chunk, count)
        if below or self._split_downloads:  # under a budget the references decide what goes
            references_decide_deletes(config, delete=below)
        self._visits_left, self._reading = counted, None
        # Every chunk memory-mapped, shared ones too: in the global order every worker reads every
        # block, and LitData 0.2.76 reads a chunk it may not map through a file handle it drops
        # unclosed at each chunk switch (PyTreeLoader._close_open_chunk). A map stays valid when a
        # co-worker deletes or re-downloads the file (POSIX keeps the mapped inode; LitData
        # publishes downloads by rename).
        reader.enable_mmap_for_chunks(set(reads))  # its own set: LitData may change the shared ones
        if self._split_downloads:  # a co-worker fetches most of what this worker reads
            see_co_workers_downloads(reader._item_loader, config)
        return self

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, ChunkedIndex):
            last = self.global_index + 1 == self.stop_length
            index.is_last_index = last  # num_chunks is only a bound
            more = self._more_downloads(int(index.index), last)
            if not self._handed:
                # LitData hands its prefetch thread the plan's chunks at the first read, one entry
                # per visit; walking them behind the reader, it fetched chunks again whose last
                # visit had passed and which were deleted. It gets this worker's downloads instead.
                index.chunk_indexes, self._handed = more, True
            elif more and self.cache._reader._prepare_thread is not None:
                self.cache._reader._prepare_thread.download(more)
        item = super().__getitem__(index)
        if isinstance(index, ChunkedIndex):
            # Mirror LitData's releases (BinaryReader.read): the visit left at a chunk switch, and
            # the last visit at the plan's last index (where references are counted).
            chunk, left = int(index.chunk_index), self._visits_left
            if chunk != self._reading:
                if self._reading in left:
                    left[self._reading] -= 1
                self._reading = chunk
            if index.is_last_index and chunk in left:
                left[chunk] -= 1
            if isinstance(item, dict):
                item["position"] = self._plan.positions.get(int(index.index), -1)
        return item

    def _ranks_on_node(self, env: _DistributedEnv) -> int | None:
        """The ranks whose workers split the node's downloads; None: each worker fetches what it reads.

        Raises:
            ValueError: a known count of ranks on the node does not divide the world size.
        """
        world = int(env.world_size)
        known = self.ranks_on_node
        if known is None and not self._simulated and os.environ.get("LOCAL_WORLD_SIZE", "").isdigit():
            known = int(os.environ["LOCAL_WORLD_SIZE"])
        if known is not None:
            if known < 1 or world % known:
                raise ValueError(f"ranks_on_node must be a positive divisor of the world size {world}, got {known}")
            return known
        # LitData's count of nodes is a guess (on several CPU nodes it says one): trusted only for
        # a rank alone on its node, whose own workers split what it reads.
        return 1 if world // max(1, int(env.num_nodes)) <= 1 else None

    def _more_downloads(self, item: int, last: bool) -> list[int]:
        """The chunks to hand LitData's prefetch thread as ``item`` (an item id) is read.

        On the one-at-a-time path, the whole list at the first read. Where the downloads are split,
        this worker's chunks of the blocks up to ``_ahead`` places past the item, and at its last
        item all that are left (LitData then stops the thread, and a co-worker may still wait on them).
        """
        downloads = self._downloads
        if isinstance(downloads, list):
            return [] if self._handed else downloads
        if last:
            more = downloads.all()
        else:
            reach = self._plan.positions.get(item, 0) + self._ahead
            more = []
            while not downloads.done and reach >= downloads.order.starts[downloads.next]:
                more.extend(downloads.next_block())
        if self._block_visits is not None:
            # The node's other readers are within the look-ahead of this one (``downloads_ahead``),
            # so none has yet ended its last visit to a chunk of the blocks handed over here.
            new = self._block_visits.through(downloads.order.num_blocks if last else downloads.next)
            for chunk, count in new.items():
                change_references(self.cache._reader.config, chunk, count)
            self._visits_left.update(new)
        return more

    def _release_references(self) -> None:
        """Drop the references of the visits an abandoned epoch did not make (a loader in this process)."""
        cache = getattr(self, "cache", None)
        if not self._visits_left or cache is None:
            return
        for chunk, left in self._visits_left.items():
            change_references(cache._reader.config, chunk, -left)
        self._visits_left = Counter()
