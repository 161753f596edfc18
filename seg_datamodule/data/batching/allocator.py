"""Keep freed image buffers in the loading process instead of handing them back to the OS (glibc).

A batch holds its samples' canvases (640 x 640 x 3 uint8: 1.2 MiB each, and the buffers of the
pixel steps) until it is collated, then frees them all at once. glibc's default ``malloc`` serves
blocks of that size with ``mmap`` (or trims them off the heap top when freed), so every batch
maps fresh pages and the kernel zero-fills each one on first touch: about 290 page faults per
canvas, 0.8 ms of CPU where a reused buffer costs 0.05 ms. Raising the two thresholds keeps such
blocks in the heap for the next batch: about 10-15 % of a worker's CPU time per image
(``benchmarks/bench_loader.py`` prints which setting ran). The pixels do not change.

The setting is per process: :func:`~seg_datamodule.data.loaders.arguments.worker_init_fn` applies it in
each DataLoader worker, and the DataModule in the main process when it loads there
(``num_workers: 0``). A process whose user already tunes glibc's allocator (``MALLOC_TRIM_THRESHOLD_``,
``MALLOC_MMAP_THRESHOLD_`` or a ``glibc.malloc`` tunable in ``GLIBC_TUNABLES``) is left as it is;
setting ``MALLOC_TRIM_THRESHOLD_=131072`` (glibc's default) is how to opt out. Other C libraries
are left as they are.
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Mapping

__all__ = ["TRIM_THRESHOLD", "MMAP_THRESHOLD", "freed_memory_kept", "keep_freed_memory"]

#: Free heap bytes kept before glibc returns the top to the OS (a few batches of canvases).
TRIM_THRESHOLD = 256 << 20
#: Blocks this large or larger still get their own mapping (glibc's largest dynamic threshold).
MMAP_THRESHOLD = 32 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers (malloc.h)
_USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")
_kept = False


def _user_tunes_malloc(environ: Mapping[str, str]) -> bool:
    """Whether the environment already sets glibc's malloc thresholds (then they are the user's)."""
    return any(key in environ for key in _USER_SETTINGS) or "glibc.malloc." in environ.get("GLIBC_TUNABLES", "")


def keep_freed_memory() -> bool:
    """Set glibc's trim and mmap thresholds in this process, once (see the module docstring).

    Returns:
        bool: whether this process keeps freed buffers (set now or by an earlier call, here or in
        the parent it was forked from); False on a C library other than glibc, or when the
        environment already tunes the allocator.
    """
    global _kept
    if _kept:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or _user_tunes_malloc(os.environ):
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    # mallopt returns 1 on success; the mmap threshold first, so that fixing it (which stops glibc
    # from moving it) never leaves the trim threshold at its default.
    _kept = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    return _kept


def freed_memory_kept() -> bool:
    """Whether :func:`keep_freed_memory` has set the thresholds in this process."""
    return _kept
