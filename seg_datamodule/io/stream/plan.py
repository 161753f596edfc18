"""A worker's reading of the streamed global order: its chunk visits, and the chunks it downloads.

Issue 63. :mod:`seg_datamodule.io.stream.order` deals the epoch's order to ranks and workers as
batches; a LitData reader takes them chunk by chunk. Here a worker's batches become visits (a
batch's items grouped by chunk, :func:`chunk_visits`), made whole (:func:`worker_plan`) or as they
are read (:class:`WorkerPlan`), and a node's chunks are split among its ranks' workers' downloads
(:class:`NodeDownloads`), handed over as far ahead as :func:`downloads_ahead` says, their visits
counted a block at a time under a cache budget (:class:`BlockVisits`). Nothing here imports
LitData or torch.
"""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from typing import Iterator, NamedTuple, Sequence

import numpy as np

from seg_datamodule.io.stream.order import EpochOrder, batch_count, first_batch, per_rank_batch, worker_positions
from seg_datamodule.ops.checks import check_int

__all__ = ["AHEAD_BLOCKS", "BlockVisits", "Deal", "NodeDownloads", "WorkerPlan", "chunk_visits", "downloads_ahead",
           "gc_paused", "worker_plan", "worker_visits"]


def worker_visits(batches: Sequence[np.ndarray], offsets: np.ndarray) -> list[tuple[int, list[int]]]:
    """A worker's batches as chunk visits: within each batch its items grouped by chunk.

    A batch's items are read chunk by chunk (each chunk of a batch opened once), in the order of
    the chunks' first items in the batch; the collate puts them back in order (it sorts by the
    position each record carries).

    Args:
        batches (list of ndarray[b] int64): from :func:`~seg_datamodule.io.stream.order.worker_batches`.
        offsets (ndarray[C + 1] int64): :func:`~seg_datamodule.io.stream.order.chunk_offsets`.

    Returns:
        list of ``(chunk, items)``: consecutive visits may repeat a chunk only across batches.
    """
    lengths = [len(b) for b in batches]
    items = np.concatenate([np.asarray(b, np.int64).reshape(-1) for b in batches]) if batches else np.zeros(0, np.int64)
    return chunk_visits(items, np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]), offsets)


def chunk_visits(items: np.ndarray, starts: np.ndarray, offsets: np.ndarray) -> list[tuple[int, list[int]]]:
    """:func:`worker_visits` of batches given as one array and their starts (:func:`~seg_datamodule.io.stream.order.worker_positions`).

    Vectorised: a worker's plan covers the whole epoch and is made before its first batch (about
    0.1 s for half a million items, where a loop over the items took 0.85 s).

    Args:
        items (ndarray[M] int64): the worker's items, batch after batch.
        starts (ndarray[B + 1] int64): where each batch starts in ``items`` (``M`` last).
        offsets (ndarray[C + 1] int64): :func:`~seg_datamodule.io.stream.order.chunk_offsets`.

    Returns:
        list of ``(chunk, items)``, as :func:`worker_visits`.
    """
    items = np.asarray(items, np.int64)
    if not len(items):
        return []
    batch = np.repeat(np.arange(len(starts) - 1, dtype=np.int64), np.diff(starts))
    chunks = np.searchsorted(offsets, items, side="right") - 1
    # Each item keyed by where its (batch, chunk) group first appears: a stable sort on that key
    # groups a batch's items by chunk, in the order of the chunks' first items, keeping batches in order.
    _, first, group = np.unique(batch * (len(offsets) + 1) + chunks, return_index=True, return_inverse=True)
    by_group = np.argsort(first[group], kind="stable")
    ordered, chunks = items[by_group].tolist(), chunks[by_group]
    # A chunk read on across a batch boundary is one visit.
    bounds = [0, *(np.flatnonzero(chunks[1:] != chunks[:-1]) + 1).tolist(), len(ordered)]
    heads = chunks[bounds[:-1]].tolist()
    return [(c, ordered[i:j]) for c, i, j in zip(heads, bounds[:-1], bounds[1:])]


def worker_plan(order: np.ndarray, offsets: np.ndarray, global_batch: int, world_size: int, rank: int,
                num_workers: int = 0, worker: int = 0,
                consumed: int = 0) -> tuple[list[tuple[int, list[int]]], dict[int, int]]:
    """A worker's whole epoch: its :func:`chunk_visits` and each of its items' position in the order.

    Make it, and whatever copies it, under :func:`gc_paused`.

    Args:
        order (ndarray[N] int64): the epoch's :func:`~seg_datamodule.io.stream.order.epoch_order`.
        offsets (ndarray[C + 1] int64): :func:`~seg_datamodule.io.stream.order.chunk_offsets`.
        global_batch, world_size, rank, num_workers, worker, consumed: as :func:`~seg_datamodule.io.stream.order.worker_batches`.

    Returns:
        ``(visits, positions)``: the visits, and ``{item: position in the epoch's order}``.
    """
    positions, starts = worker_positions(len(order), global_batch, world_size, rank, num_workers, worker, consumed)
    items = np.asarray(order, np.int64)[positions]
    return chunk_visits(items, starts, offsets), dict(zip(items.tolist(), positions.tolist()))


class WorkerPlan:
    """A worker's :func:`worker_plan`, made a few thousand items at a time as the worker reads it.

    Made whole, a plan costs each worker about 0.2 s per million images of the dataset before its
    first batch (its visit lists and its positions are Python objects). Here only its places in
    the order are made up front (numpy); its items, visits and positions follow ``segment_items``
    items at a time (with an :class:`~seg_datamodule.io.stream.order.EpochOrder`, so does the
    order: a block when it is first read). A
    segment ends at a batch boundary, and a visit read on across a seam is one visit, as in
    :func:`chunk_visits`: made whole, this is :func:`worker_plan`.

    Args:
        order: the epoch's :class:`~seg_datamodule.io.stream.order.EpochOrder`, or its
            :func:`~seg_datamodule.io.stream.order.epoch_order` (ndarray[N] int64).
        positions (ndarray[M] int64), starts (ndarray[B + 1] int64): the worker's places in the
            order and where each of its batches starts among them
            (:func:`~seg_datamodule.io.stream.order.worker_positions`).
        offsets (ndarray[C + 1] int64): :func:`~seg_datamodule.io.stream.order.chunk_offsets`.
        segment_items (int): items per segment, >= 1 (at least one batch a segment).

    Attributes:
        chunks (list[int]): each visit's chunk, the visits made so far.
        item_lists (list[list[int]]): each visit's items; the last may still grow until
            :meth:`ensure` has gone past it.
        positions (dict[int, int]): item -> its position in the epoch's order, the items of the
            segments made so far.
        num_items (int): the worker's items in the epoch (M).
    """

    def __init__(self, order: EpochOrder | np.ndarray, positions: np.ndarray, starts: np.ndarray, offsets: np.ndarray, *,
                 segment_items: int = 4096) -> None:
        self._positions, self._starts = np.asarray(positions, np.int64), np.asarray(starts, np.int64)
        self._order = order if isinstance(order, EpochOrder) else np.asarray(order, np.int64)
        self._offsets = offsets
        batch = int(np.diff(self._starts).max()) if len(self._starts) > 1 else 1
        self._step = max(1, check_int("segment_items", segment_items, 1) // max(batch, 1))
        self._next = 0  # the first batch not yet made
        self.chunks: list[int] = []
        self.item_lists: list[list[int]] = []
        self.positions: dict[int, int] = {}
        self.num_items = len(self._positions)

    @property
    def done(self) -> bool:
        """Every batch made."""
        return self._next >= len(self._starts) - 1

    def ensure(self, visit: int) -> None:
        """Make segments until visit ``visit`` is made and final (the next one exists), or all are."""
        while len(self.item_lists) <= visit + 1 and not self.done:
            self._extend()

    def make_all(self) -> "WorkerPlan":
        """Make every segment; returns self."""
        while not self.done:
            self._extend()
        return self

    def _extend(self) -> None:
        with gc_paused():
            self._extend_paused()

    def _extend_paused(self) -> None:
        first, last = self._next, min(self._next + self._step, len(self._starts) - 1)
        a, z = int(self._starts[first]), int(self._starts[last])
        items = self._order.take(self._positions[a:z])
        visits = chunk_visits(items, self._starts[first:last + 1] - a, self._offsets)
        if visits and self.chunks and visits[0][0] == self.chunks[-1]:  # read on across the seam: one visit
            self.item_lists[-1].extend(visits.pop(0)[1])
        self.chunks.extend(chunk for chunk, _ in visits)
        self.item_lists.extend(chunk_items for _, chunk_items in visits)
        self.positions.update(zip(items.tolist(), self._positions[a:z].tolist()))
        self._next = last


AHEAD_BLOCKS = 8  # blocks of downloads handed over ahead of the reader (32 chunks at window 4: as many as ran at once)


def downloads_ahead(order: EpochOrder, deal: "Deal", ahead_items: int | None = None,
                    budget_chunks: int | None = None) -> int | None:
    """How far past the item read, in places of the order, a worker hands over its downloads.

    With a cache that holds the set: ``ahead_items``, or 8 blocks and 4 steps of every worker.
    Under a budget the cache holds the blocks the node's readers are in and those handed over
    ahead of them. The readers spread over ``2 x num_workers + 1`` steps (the DataLoader's default
    prefetch of 2 batches a worker, and the step being trained), so the look-ahead is at most the
    budget's whole blocks less two and less that spread, and at least the spread (a reader ahead of
    a chunk's downloader waits on it).

    Args:
        order: the epoch's order.
        deal: the worker's place in the deal.
        ahead_items: the look-ahead asked for; None: 8 blocks and 4 steps of every worker.
        budget_chunks: the cache budget in mean-sized chunks, where it is below the set; None: the
            cache holds the set.

    Returns:
        int | None: places of the order; None where the budget holds less than twice the spread
        past the readers' blocks (each worker then fetches what it reads).
    """
    blocks = max(order.num_blocks, 1)
    workers = max(1, deal.num_workers)
    ahead = ahead_items if ahead_items is not None else \
        AHEAD_BLOCKS * len(order) // blocks + 4 * workers * deal.global_batch
    if budget_chunks is None:
        return ahead
    spread = (2 * workers + 1) * deal.global_batch
    room = (budget_chunks // order.window - 2) * len(order) // blocks - spread  # whole blocks, as places
    return min(ahead, room) if room >= spread else None


class BlockVisits:
    """A worker's chunk visits counted a block of the order at a time, as its downloads are handed over.

    A worker's visits run through the blocks in order (a chunk lies in one block), so the visits
    to the first ``b`` blocks are final once the plan's last visit lies past them.

    Args:
        plan: the worker's plan (made further here as needed).
        order: the epoch's order.
    """

    def __init__(self, plan: WorkerPlan, order: EpochOrder) -> None:
        self.plan = plan
        self._block_of = np.argsort(order.chunks) // order.window  # each chunk's block
        self._counted = 0  # the plan's visits counted so far

    def through(self, blocks: int) -> Counter:
        """Visits per chunk to the first ``blocks`` blocks, those not counted by an earlier call."""
        plan, block_of = self.plan, self._block_of
        while not plan.done and (not plan.chunks or block_of[plan.chunks[-1]] < blocks):
            plan.ensure(len(plan.item_lists))
        new, i = Counter(), self._counted
        while i < len(plan.chunks) and block_of[plan.chunks[i]] < blocks:
            new[plan.chunks[i]] += 1
            i += 1
        self._counted = i
        return new


class Deal(NamedTuple):
    """Where one worker stands in the deal of an epoch's order (the arguments of
    :func:`~seg_datamodule.io.stream.order.worker_batches` after the order)."""

    global_batch: int
    world_size: int
    rank: int
    num_workers: int = 0
    worker: int = 0
    consumed: int = 0


class NodeDownloads:
    """The chunks one worker downloads for all the readers of its node, block by block of the order.

    Every worker of every rank reads from every chunk of a block, so each chunk the node's ranks
    read after ``consumed`` is given to one of their workers: the chunks in the order of their first
    item among the node's, dealt round-robin over its ranks' workers that have a batch left (rank by
    rank, worker by worker). Together the node's workers download each chunk once. A chunk lies in
    one block, and the ranks read the blocks in order, so the list is made a block at a time
    (:meth:`next_block`), as far ahead as the reader needs. The node's ranks are ``ranks_on_node``
    consecutive ranks (Lightning numbers a node's processes so), reading one slice of every global
    batch; with one rank on the node, the rank's workers split what it reads.

    Args:
        order: the epoch's :class:`~seg_datamodule.io.stream.order.EpochOrder`.
        deal (Deal): the worker's place in the deal.
        ranks_on_node (int): ranks sharing the node's cache; divides ``deal.world_size``.

    Raises:
        ValueError: ``deal.worker`` outside ``[0, num_workers)``, or ``ranks_on_node`` does not divide
            the world size.
    """

    def __init__(self, order: EpochOrder, deal: Deal, ranks_on_node: int = 1) -> None:
        global_batch, world_size, rank, num_workers, worker, consumed = deal
        self.order, self.global_batch = order, global_batch
        self._size = per_rank_batch(global_batch, world_size)
        local = check_int("ranks_on_node", ranks_on_node, 1)
        if world_size % local:
            raise ValueError(f"ranks_on_node must divide the world size {world_size}, got {ranks_on_node}")
        self._lane = (rank // local) * local * self._size  # the node's slice of each global batch
        self._width = local * self._size
        streams = max(1, check_int("num_workers", num_workers, 0))
        if not 0 <= worker < streams:
            raise ValueError(f"worker must be in [0, {streams}), got {worker}")
        n = len(order)
        first = first_batch(n, global_batch, consumed)
        batches = batch_count(n, global_batch, world_size) - first
        active = min(streams, max(batches, 0))  # a worker without a batch never reads, so never downloads
        self._streams = local * active
        self._stream = (rank % local) * active + worker if worker < active else self._streams
        self._begin, self._end = first * global_batch, min(n, (first + max(batches, 0)) * global_batch)
        self.next = int(order.block_of(np.int64(self._begin))) if self._begin < self._end else order.num_blocks
        self._dealt = 0  # the node's chunks listed so far, by all of its workers

    @property
    def done(self) -> bool:
        """No block left with a chunk the node reads."""
        return self._stream >= self._streams or self.next >= self.order.num_blocks or \
            self.order.starts[self.next] >= self._end

    def next_block(self) -> list[int]:
        """This worker's chunks of the next block (possibly none), in the order first needed; [] when done."""
        if self.done:
            return []
        order, width, batch = self.order, self._width, self.global_batch
        lo, hi = max(int(order.starts[self.next]), self._begin), min(int(order.starts[self.next + 1]), self._end)
        self.next += 1
        ks = np.arange(lo // batch, (hi - 1) // batch + 1, dtype=np.int64)
        positions = ((ks * batch + self._lane)[:, None] + np.arange(width, dtype=np.int64)).ravel()
        positions = positions[(positions >= lo) & (positions < hi)]
        chunks = np.searchsorted(order.offsets, order.take(positions), side="right") - 1
        read, first = np.unique(chunks, return_index=True)
        listed = read[np.argsort(first, kind="stable")]
        mine = listed[(self._dealt + np.arange(len(listed))) % self._streams == self._stream].tolist()
        self._dealt += len(listed)
        return mine

    def all(self) -> list[int]:
        """Every block's :meth:`next_block` from here on, one list."""
        chunks: list[int] = []
        while not self.done:
            chunks.extend(self.next_block())
        return chunks


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block (reference counting goes on).

    A plan's lists (one per chunk visit, about 10^5 per worker for a million images) hold only
    ints, yet their allocation sets off collections that scan them all again and again: made with
    the collector running, the plan took several times as long (``benchmarks/bench_stream_plan.py``).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
