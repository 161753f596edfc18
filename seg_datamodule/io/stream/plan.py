"""A worker's reading of the streamed global order: its chunk visits, and the chunks it downloads.

Issue 63. :mod:`seg_datamodule.io.stream.order` deals the epoch's order to ranks and workers as
batches; a LitData reader takes them chunk by chunk. Here a worker's batches become visits (a
batch's items grouped by chunk, :func:`chunk_visits`), made whole (:func:`worker_plan`) or as they
are read (:class:`WorkerPlan`), and a rank's chunks are split among its workers' downloads
(:func:`worker_downloads`). Nothing here imports LitData or torch.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator, Sequence

import numpy as np

from seg_datamodule.io.stream.order import worker_positions
from seg_datamodule.ops.checks import check_int

__all__ = ["WorkerPlan", "chunk_visits", "gc_paused", "worker_downloads", "worker_plan", "worker_visits"]


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
    """:func:`worker_visits` of batches given as one array and their starts (:func:`worker_positions`).

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
    first batch (its visit lists and its positions are Python objects). Here only numpy arrays of
    its items are made up front; visits and positions follow ``segment_items`` items at a time. A
    segment ends at a batch boundary, and a visit read on across a seam is one visit, as in
    :func:`chunk_visits`: made whole, this is :func:`worker_plan`.

    Args:
        order (ndarray[N] int64): the epoch's :func:`~seg_datamodule.io.stream.order.epoch_order`.
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

    def __init__(self, order: np.ndarray, positions: np.ndarray, starts: np.ndarray, offsets: np.ndarray, *,
                 segment_items: int = 4096) -> None:
        self._positions, self._starts = np.asarray(positions, np.int64), np.asarray(starts, np.int64)
        self._items = np.asarray(order, np.int64)[self._positions]
        self._offsets = offsets
        batch = int(np.diff(self._starts).max()) if len(self._starts) > 1 else 1
        self._step = max(1, check_int("segment_items", segment_items, 1) // max(batch, 1))
        self._next = 0  # the first batch not yet made
        self.chunks: list[int] = []
        self.item_lists: list[list[int]] = []
        self.positions: dict[int, int] = {}
        self.num_items = len(self._items)

    @property
    def done(self) -> bool:
        """Every batch made."""
        return self._next >= len(self._starts) - 1

    def chunk_set(self) -> set[int]:
        """The chunks the worker reads in the epoch (from the item arrays: the plan stays lazy)."""
        chunks = np.searchsorted(self._offsets, self._items, side="right") - 1
        return set(np.flatnonzero(np.bincount(chunks, minlength=len(self._offsets) - 1)).tolist())

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
        items = self._items[a:z]
        visits = chunk_visits(items, self._starts[first:last + 1] - a, self._offsets)
        if visits and self.chunks and visits[0][0] == self.chunks[-1]:  # read on across the seam: one visit
            self.item_lists[-1].extend(visits.pop(0)[1])
        self.chunks.extend(chunk for chunk, _ in visits)
        self.item_lists.extend(chunk_items for _, chunk_items in visits)
        self.positions.update(zip(items.tolist(), self._positions[a:z].tolist()))
        self._next = last


def worker_downloads(order: np.ndarray, offsets: np.ndarray, global_batch: int, world_size: int, rank: int,
                     num_workers: int = 0, worker: int = 0, consumed: int = 0) -> list[int]:
    """The chunks worker ``worker`` downloads for all of its rank's workers, in the order they are first needed.

    Every worker of a rank reads from every chunk of a block, so each chunk the rank reads after
    ``consumed`` is given to one worker: the chunks in the order of their first item among the
    rank's, dealt round-robin to the workers that have a batch left. Together the rank's workers
    download each chunk once.

    Args: as :func:`worker_plan`.

    Returns:
        list[int]: chunk indices; over ``worker = 0 .. max(num_workers, 1) - 1`` each chunk the rank
            reads appears exactly once.
    """
    streams = max(1, check_int("num_workers", num_workers, 0))
    if not 0 <= worker < streams:
        raise ValueError(f"worker must be in [0, {streams}), got {worker}")
    positions, starts = worker_positions(len(order), global_batch, world_size, rank, 0, 0, consumed)
    active = min(streams, len(starts) - 1)  # a worker without a batch never reads, so never downloads
    if worker >= active:
        return []
    chunks = np.searchsorted(offsets, np.asarray(order, np.int64)[positions], side="right") - 1
    first = np.full(len(offsets) - 1, len(chunks), np.int64)  # each chunk's first place, without a sort
    np.minimum.at(first, chunks, np.arange(len(chunks), dtype=np.int64))
    read = np.flatnonzero(first < len(chunks))
    return read[np.argsort(first[read], kind="stable")][worker::active].tolist()


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
