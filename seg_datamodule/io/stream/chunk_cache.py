"""The node's chunk cache as LitData 0.2.76 keeps it, where the global order needs more of it (issue 63).

In the global order every worker of a node reads every chunk of a block, which LitData's own
shuffle never asks of it. :class:`~seg_datamodule.io.stream.ordered.OrderedRecords` therefore
switches LitData's async prefetch per path (:func:`choose_async_prefetch`), lets a reader see a
chunk a co-worker downloaded within milliseconds (:func:`see_co_workers_downloads`), counts
a chunk's references per visit (:func:`change_references`), through LitData's own files and setters,
and, under a cache budget, lets those references alone decide what is deleted
(:func:`references_decide_deletes`).
"""

from __future__ import annotations

import contextlib
import os
from queue import Empty
from threading import Event
from time import time
from typing import Any, Callable

from filelock import FileLock, Timeout
from litdata.streaming.item_loader import BaseItemLoader
from litdata.streaming.reader import PrepareChunksThread
from litdata.streaming.sampler import ChunkedIndex

__all__ = ["ChunkReady", "change_references", "choose_async_prefetch", "references_decide_deletes",
           "see_co_workers_downloads"]

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
CO_WORKER_GRACE_S = 2.0  # a reader waiting this long on a co-worker's chunk fetches it itself (LitData: 30 s)
_NEW_WAIT_S = 2.5  # a chunk not asked about for this long: a new wait on it


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
    """LitData's provider of readiness events (``PrepareChunksThread.get_ready_event``), giving :class:`ChunkReady`.

    A reader that has waited ``grace_s`` on a chunk asks its own prefetch thread to fetch it
    (LitData's force download), where LitData asks after 30 s. A chunk on a co-worker's list can be
    missing for good: under a cache budget, a reader that started late (another rank's, not yet
    counting its visits when the chunk's last counted visit ended) finds it deleted, and no
    co-worker fetches it again. Asking early costs no GET where the co-worker is fetching it
    (LitData's force download leaves a chunk whose download lock is held), nor where it has not
    begun (its download finds the file there).

    Args:
        provider: LitData's readiness events, by chunk.
        config: the reader's ``ChunksConfig``.
        force: LitData's item loader's ``force_download``.
        grace_s: seconds of waiting before a reader fetches the chunk itself.
    """

    def __init__(self, provider: Callable[[int], Event], config: Any, force: Callable[[int], None],
                 grace_s: float) -> None:
        self.provider, self.config, self.force, self.grace_s = provider, config, force, grace_s
        self._waits: dict[int, tuple[float, float, bool]] = {}  # chunk: (wait began, last asked, fetch asked)

    def __call__(self, chunk_index: int) -> ChunkReady:
        now = time()
        began, last, asked = self._waits.get(chunk_index, (now, now, False))
        if now - last > _NEW_WAIT_S:  # LitData's wait asks at least once a second: this is another wait
            began, asked = now, False
        if not asked and now - began >= self.grace_s:
            self.force(chunk_index)
            asked = True
        self._waits[chunk_index] = (began, now, asked)
        path, _, size = self.config[ChunkedIndex(index=-1, chunk_index=chunk_index)]
        return ChunkReady(self.provider(chunk_index), path, size)


def see_co_workers_downloads(loader: BaseItemLoader, config: Any, grace_s: float | None = None) -> None:
    """Make ``loader`` wait on :class:`ChunkReady` s, and fetch a chunk itself after ``grace_s``.

    LitData installs its provider through the loader's ``set_chunk_ready_provider``; this wraps it
    (``_CoWorkerReadiness``). ``grace_s`` None: :data:`CO_WORKER_GRACE_S` when it is installed.
    """
    setter = type(loader).set_chunk_ready_provider

    def install(provider: Callable[[int], Event] | None) -> None:
        grace = CO_WORKER_GRACE_S if grace_s is None else grace_s
        setter(loader, None if provider is None else _CoWorkerReadiness(provider, config, loader.force_download, grace))

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


# Set on a ChunksConfig whose prefetch threads follow the global order's rules: True, chunks are
# deleted at their node's last visit (a budget below the set); False, kept (a cache that holds it).
_COUNTED = "_seg_datamodule_delete_at_last_visit"


def _slot_gate(thread: Any) -> bool:
    """``PrepareChunksThread._slot_budget_enabled`` for a marked config: no slots are taken."""
    return False


def _counted_deletes(thread: Any, timeout: float = 0.1) -> None:
    """``PrepareChunksThread._maybe_delete_chunks`` for a marked config: every visit's end queued, at once.

    LitData's reader queues one entry per visit's end (after dropping the visit's reference), and
    LitData takes one entry a turn of its thread, a turn that waits up to 0.1 s on the download
    queue: in the global order nearly every item is a visit of its own, the entries piled up and
    chunks outlived their last visit by minutes (289 MB of chunks on disk under a budget of 50 MB).
    Here every queued entry is taken, each as LitData counts it (one fewer chunk in its window), and
    a chunk goes once no reference is left to it: its node's last visit has ended.
    """
    queue = thread._to_delete_queue
    wait = timeout
    while True:
        try:
            chunk_index = queue.get(timeout=wait) if wait > 0 else queue.get_nowait()
        except (Empty, OSError, EOFError):  # empty, or closed as the thread ends
            return
        wait = 0.0
        thread._pre_download_counter -= 1
        config = thread._config
        if not getattr(config, _COUNTED):
            continue
        # A count's file exists while a reference is held (change_references, LitData's decrement);
        # a chunk no longer there was deleted by the co-worker that dropped its last reference.
        if os.path.exists(config[ChunkedIndex(index=-1, chunk_index=chunk_index)][0]) and \
                not os.path.exists(config._chunk_lock_filepath(chunk_index) + ".cnt"):
            thread._apply_delete(chunk_index)


_SWITCHED: dict[str, Callable[..., Any]] = {"_slot_budget_enabled": _slot_gate,
                                            "_maybe_delete_chunks": _counted_deletes}


def _switch(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """``PrepareChunksThread.<name>``, our ``_SWITCHED[name]`` for a thread whose config is marked."""
    ours = _SWITCHED[name]

    def switched(thread: Any, *args: Any, **kwargs: Any) -> Any:
        return (ours if hasattr(thread._config, _COUNTED) else method)(thread, *args, **kwargs)

    switched.switches = method  # type: ignore[attr-defined]
    return switched


def references_decide_deletes(config: Any, delete: bool = True) -> None:
    """Under a cache budget, let the per-visit references of ``config`` 's readers alone decide what is deleted.

    For the prefetch threads of ``config`` 's reader, LitData 0.2.76's shared disk-slot gate goes
    off (``_slot_gate``), and a chunk is deleted as soon as the visit that drops its last reference
    ends (``_counted_deletes``; LitData deletes only a chunk whose count is 0:
    :func:`change_references`). Both matter in the global order, where every worker reads every
    chunk of a block and a chunk goes only when the node's last visit to it ends:

    * The slot gate (from 10 MB and twice a chunk) reserves a node-wide slot per chunk a thread
      downloads and frees it only when that chunk is deleted; the slots ran out with every reader
      waiting on a chunk no thread would fetch (20 MB over 118 chunks of 1 MB, and 50 MB over 474,
      at 50 ms a GET: a reader's 120 s timeout in each).
    * LitData's thread takes one ended visit a turn, and a turn can wait 0.1 s; nearly every item
      of the global order is a visit of its own.

    What stays on disk is then what the readers still have to read and what was fetched ahead of
    them, which :class:`~seg_datamodule.io.stream.ordered.OrderedRecords` bounds by the budget.
    Other readers in the process keep LitData's rules.

    Args:
        config: the reader's ``litdata.streaming.config.ChunksConfig``.
        delete: False where the cache holds the set: the ended visits are taken at once all the
            same (LitData's thread counts its window by them, and held back its downloads), and
            nothing is deleted.
    """
    for name in _SWITCHED:
        method = getattr(PrepareChunksThread, name)
        if not hasattr(method, "switches"):
            setattr(PrepareChunksThread, name, _switch(name, method))
    setattr(config, _COUNTED, bool(delete))
