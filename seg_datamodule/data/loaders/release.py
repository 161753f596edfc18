"""Release an abandoned epoch's DataLoader workers at once, however long their batch in progress takes.

torch stops a multi-process iterator by asking each worker to stop, then joining each with a
5 s timeout (``MP_STATUS_CHECK_INTERVAL``). A worker only reads the request between batches: one
building a batch whose chunk is still downloading (a streamed epoch left at an early stop, a
``max_steps``, a validation that ends the run) finishes that batch first, so a user waited about
5 s per worker at every early stop, for a batch nobody will read. :func:`release_workers` asks
the same way, waits a short grace for the workers that are between batches to exit by
themselves, and ends the others (SIGTERM): what torch itself does after its timeout, sooner.

Only for workers whose state lives in the main process (a streamed epoch's position is the
loader's, LitData downloads to a temporary name and publishes it whole, and its file locks are
released with the process), so nothing a worker held is needed again.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["RELEASE_GRACE_S", "release_workers"]

#: How long workers between batches get to exit by themselves (they do in milliseconds).
RELEASE_GRACE_S = 0.25

#: The private names of torch's ``_MultiProcessingDataLoaderIter`` this reaches (compat: "worker_release").
_NAMES = ("_shutdown", "_workers", "_workers_status", "_workers_done_event", "_mark_worker_as_unavailable",
          "_worker_pids_set")


def release_workers(iterator: Any, grace_s: float = RELEASE_GRACE_S) -> bool:
    """Stop ``iterator``'s workers within about ``grace_s``; torch's own shutdown then finds them gone.

    Call it first in an override of ``_shutdown_workers``, then torch's (which closes the queues
    and forgets the pids, and finds nothing left to wait for).

    Args:
        iterator: a ``torch.utils.data.dataloader._MultiProcessingDataLoaderIter``.
        grace_s: how long workers get to exit by themselves before they are ended.

    Returns:
        True when workers were stopped here; False when there was nothing to do (already shut
        down) or this torch lacks a name it needs (its own shutdown then runs as before).
    """
    if not all(hasattr(iterator, name) for name in _NAMES) or iterator._shutdown or not iterator._workers:
        return False
    # The pin-memory thread first: it reads the workers' results, and a worker ended in the middle
    # of sending one would leave it waiting for the rest of the message forever.
    thread = getattr(iterator, "_pin_memory_thread", None)
    if thread is not None:
        iterator._pin_memory_thread_done_event.set()
        iterator._worker_result_queue.put((None, None))
        thread.join()
    iterator._workers_done_event.set()
    for worker_id, running in enumerate(iterator._workers_status):
        if running:  # its queue gets the None that ends its loop between batches
            iterator._mark_worker_as_unavailable(worker_id, shutdown=True)
    deadline = time.monotonic() + grace_s
    for worker in iterator._workers:
        worker.join(timeout=max(0.0, deadline - time.monotonic()))
    busy = [worker for worker in iterator._workers if worker.is_alive()]
    if busy:
        # A worker ended by a signal must not be reported as a failure by torch's SIGCHLD handler.
        if iterator._worker_pids_set:
            from torch.utils.data import _utils

            _utils.signal_handling._remove_worker_pids(id(iterator))
            iterator._worker_pids_set = False
        for worker in busy:
            worker.terminate()
        for worker in busy:
            worker.join(timeout=1.0)
    return True
