"""The profiler's few reaches into the Trainer beyond public hooks, each in one guarded place.

Stopping the training loader's workers early and reading the step label Lightning logs at
(private Lightning and torch names, imported only when used and warned about once when they are
gone: see ``seg_datamodule/compat.py``), gathering per-rank medians (a collective), and reading
what the verdict needs of the train loader.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from seg_datamodule.compat import warn_unverified
from seg_datamodule.profiling.accumulator import PHASES, StepTimeAccumulator

__all__ = ["available_cores", "gather_medians", "loader_info", "log_step", "shut_down_train_workers"]


def log_step(trainer: Trainer) -> int:
    """The x at which Lightning logs this step's metrics: ``epoch_loop._batches_that_stepped``.

    Lightning's ``logger_connector.log_metrics`` reads that private counter before it increments;
    without it (another Lightning) the global step stands in, with one warning, and the
    profiler's points may sit one step off Lightning's own.
    """
    step = getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", None)
    if isinstance(step, int):
        return step
    warn_unverified("loop_internals", "fit_loop.epoch_loop has no int _batches_that_stepped",
                    "The step_time/* points are logged at trainer.global_step instead.", warn=rank_zero_warn)
    return trainer.global_step


def shut_down_train_workers(trainer: Trainer) -> bool:
    """Stop the training loader's worker processes now; whether any loader was reached.

    What ``fit_loop.teardown`` does right after ``on_train_end`` (the combined loader's reset
    shuts persistent workers down; dropping the iterators ends the others), done early.
    Private names of Lightning and torch, hence the guard: when they are gone the workers keep
    running beside the isolated timing (``loader_workers_shut_down: false`` in the report), with
    one warning naming the releases verified.
    """
    problem = _shutdown_names_problem(trainer)
    if problem is not None:
        key, what = problem
        warn_unverified(key, what, "The loader's workers are not stopped before the isolated optimiser timing.",
                        warn=rank_zero_warn)
        return False
    from lightning.pytorch.utilities.combined_loader import _shutdown_workers_and_reset_iterator
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    try:
        combined = trainer.fit_loop._combined_loader
        if combined is None:
            return False
        for loader in combined.flattened:  # persistent workers: the DataLoader holds the iterator
            _shutdown_workers_and_reset_iterator(loader)
        for iterator in getattr(combined._iterator, "iterators", None) or []:  # the others
            if isinstance(iterator, _MultiProcessingDataLoaderIter):
                iterator._shutdown_workers()
    except Exception as error:
        rank_zero_warn(f"StepTimeProfiler: could not stop the loader's workers before timing alone: {error!r}")
        return False
    return True


def _shutdown_names_problem(trainer: Trainer) -> tuple[str, str] | None:
    """(reach key, what is missing) for the first private name the early shutdown lacks, or None."""
    from lightning.pytorch.utilities import combined_loader
    from torch.utils.data import dataloader

    if not hasattr(combined_loader, "_shutdown_workers_and_reset_iterator"):
        return "loop_internals", "lightning's combined_loader has no _shutdown_workers_and_reset_iterator"
    if not hasattr(getattr(dataloader, "_MultiProcessingDataLoaderIter", None), "_shutdown_workers"):
        return "loader_iterator", "torch's _MultiProcessingDataLoaderIter has no _shutdown_workers"
    if not hasattr(trainer.fit_loop, "_combined_loader"):
        return "loop_internals", "the fit loop has no _combined_loader"
    return None


def gather_medians(trainer: Trainer, accumulator: StepTimeAccumulator) -> dict[str, list[float]]:
    """Per phase, every rank's median (a collective: every rank must call it)."""
    summary = accumulator.compute()
    local = [summary[p]["median_ms"] if summary else math.nan for p in PHASES]
    tensor = torch.tensor(local, dtype=torch.float64, device=trainer.strategy.root_device)
    gathered = trainer.strategy.all_gather(tensor).reshape(-1, len(PHASES)).cpu()
    return {p: [float(v) for v in gathered[:, i]] for i, p in enumerate(PHASES)}


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def loader_info(trainer: Trainer) -> dict[str, Any]:
    """The train loader's ``num_workers``, ``batch_size`` and ``pin_memory``, ``cores`` per rank, the ``device`` type.

    Read through the public ``trainer.train_dataloader`` after Lightning set the loaders up; a
    value is ``None`` when there is not exactly one ``DataLoader`` or it does not say. ``cores``
    divides this process's cores among the ranks on the node (``trainer.num_devices``).
    """
    loaders: Any = getattr(trainer, "train_dataloader", None)
    if isinstance(loaders, (list, tuple)) and len(loaders) == 1:
        loaders = loaders[0]
    elif isinstance(loaders, dict) and len(loaders) == 1:
        loaders = next(iter(loaders.values()))
    single = loaders if isinstance(loaders, torch.utils.data.DataLoader) else None
    ranks_here = max(1, int(getattr(trainer, "num_devices", 1) or 1))
    return {
        "num_workers": None if single is None else int(single.num_workers),
        "batch_size": None if single is None or single.batch_size is None else int(single.batch_size),
        "pin_memory": None if single is None else bool(single.pin_memory),
        "cores": max(1, available_cores() // ranks_here),
        "device": trainer.strategy.root_device.type,  # no host-to-device copy to pin for off CUDA
    }
