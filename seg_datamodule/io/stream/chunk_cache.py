"""The node's chunk cache as LitData 0.2.76 keeps it, where the global order needs more of it (issue 63).

In the global order every worker of a node reads every chunk of a block, which LitData's own
shuffle never asks of it. :class:`~seg_datamodule.io.stream.ordered.OrderedRecords` therefore
switches LitData's async prefetch per path (:func:`choose_async_prefetch`), lets a reader see a
chunk a co-worker downloaded within milliseconds (:func:`see_co_workers_downloads`), counts
a chunk's references per visit (:func:`change_references`), through LitData's own files and setters,
and turns LitData's disk-slot gate off where the references decide what is deleted
(:func:`without_slot_gate`).
"""

from __future__ import annotations

import contextlib
import os
from threading import Event
from time import time
from typing import Any, Callable

from filelock import FileLock, Timeout
from litdata.streaming.item_loader import BaseItemLoader
from litdata.streaming.reader import PrepareChunksThread
from litdata.streaming.sampler import ChunkedIndex

__all__ = ["ChunkReady", "change_references", "choose_async_prefetch", "see_co_workers_downloads", "without_slot_gate"]

_ASYNC_PREFETCH = "LITDATA_ASYNC_CHUNK_PREFETCH"  # litdata.streaming.async_prefetch.async_chunk_prefetch_enabled

_async_off_by_us = False  # this process's LITDATA_ASYNC_CHUNK_PREFETCH=0 was set here, not by the user


def choose_async_prefetch(on: bool) -> None:
    """LitData's async chunk prefetch on (its default) or off, in this process; a user's own setting wins."""
    global _async_off_by_us
    if on and _async_off_by_us:
        os.environ.pop(_ASYNC_PREFETCH, None)
        _async_off_by_us = False
    elif not on and _ASYNC_PREFETCH not in os.environ:
        os.environ[_ASYNC_PREFETCH] = "0"
        _async_off_by_us = True


_LOCK_TIMEOUT_S = 30.0  # waiting on a co-worker's count update; LitData's own waits 1-3 s, then drops it
_POLL_S = 0.01  # how often a reader waiting on a co-worker's download looks for the file


class ChunkReady:
    """A chunk's readiness as LitData's item loader waits on it, set by a co-worker's download too.

    LitData 0.2.76's reader waits on an in-process ``Event`` its own prefetch thread sets after a
    download, and looks at the file only once a second (``_wait_until_chunk_ready``). A chunk a
    co-worker fetched (with the downloads split, it was on the co-worker's list) is then seen up
    to a second late, and in the global order every worker reads every chunk of a block: each
    worker would wait on most of the node's downloads. This looks every 10 ms.

    Args:
        event: LitData's readiness event of the chunk.
        path: the chunk's local file.
        size: its size in bytes once complete.
    """

    def __init__(self, event: Event, path: str, size: int) -> None:
        self.event, self.path, self.size = event, path, int(size)

    def _published(self) -> bool:
        try:
            return os.stat(self.path).st_size >= self.size
        except FileNotFoundError:
            return False

    def wait(self, timeout: float | None = None) -> bool:
        """True once the event is set or the file is complete; False after ``timeout`` seconds."""
        deadline = None if timeout is None else time() + timeout
        while not self.event.is_set():
            if self._published():
                return True
            left = _POLL_S if deadline is None else min(_POLL_S, deadline - time())
            if left <= 0:
                return False
            self.event.wait(left)
        return True

    def clear(self) -> None:
        self.event.clear()


class _CoWorkerReadiness:
    """LitData's provider of readiness events (``PrepareChunksThread.get_ready_event``), giving :class:`ChunkReady`."""

    def __init__(self, provider: Callable[[int], Event], config: Any) -> None:
        self.provider, self.config = provider, config

    def __call__(self, chunk_index: int) -> ChunkReady:
        path, _, size = self.config[ChunkedIndex(index=-1, chunk_index=chunk_index)]
        return ChunkReady(self.provider(chunk_index), path, size)


def see_co_workers_downloads(loader: BaseItemLoader, config: Any) -> None:
    """Make ``loader`` wait on :class:`ChunkReady` s: LitData installs its provider through this setter."""
    setter = type(loader).set_chunk_ready_provider

    def install(provider: Callable[[int], Event] | None) -> None:
        setter(loader, None if provider is None else _CoWorkerReadiness(provider, config))

    loader.set_chunk_ready_provider = install  # type: ignore[method-assign]


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


_NO_SLOT_GATE = "_seg_datamodule_no_slot_gate"  # set on a ChunksConfig whose prefetch threads take no slots


def _slot_gate_switch(gate: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """``PrepareChunksThread._slot_budget_enabled``, off for a thread whose config is marked."""

    def enabled(thread: Any) -> bool:
        return False if getattr(thread._config, _NO_SLOT_GATE, False) else gate(thread)

    enabled.switches = gate  # type: ignore[attr-defined]
    return enabled


def without_slot_gate(config: Any) -> None:
    """Turn LitData's shared disk-slot gate off for the prefetch threads of ``config`` 's reader.

    With a budget of 10 MB or more below the chunk set, LitData 0.2.76 reserves a node-wide slot
    per chunk a prefetch thread downloads and frees it only when that chunk is deleted. In the
    global order every worker reads every chunk of a block and a chunk goes only when the node's
    last visit to it ends, so the slots ran out with every reader waiting on a chunk no thread
    would fetch (20 MB over 118 chunks of 1 MB, and 50 MB over 474, at 50 ms a GET: a reader's
    120 s timeout in each). Here what is deleted is decided by the references counted per visit
    (:func:`change_references`), and the prefetch runs one chunk at a time; the budget is then
    exceeded by what is fetched ahead (24 MB at most against 20 MB). Other readers in the process
    keep the gate.

    Args:
        config: the reader's ``litdata.streaming.config.ChunksConfig``.
    """
    if not hasattr(PrepareChunksThread._slot_budget_enabled, "switches"):
        PrepareChunksThread._slot_budget_enabled = _slot_gate_switch(  # type: ignore[method-assign]
            PrepareChunksThread._slot_budget_enabled)
    setattr(config, _NO_SLOT_GATE, True)
