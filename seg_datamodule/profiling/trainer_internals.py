"""The profiler's few reaches into the Trainer beyond public hooks, each in one guarded place.

Stopping the training loader's workers early (private Lightning and torch names) and gathering
per-rank medians (a collective).
"""

from __future__ import annotations

import math

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.utilities.combined_loader import _shutdown_workers_and_reset_iterator
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from seg_datamodule.profiling.accumulator import PHASES, StepTimeAccumulator

__all__ = ["gather_medians", "shut_down_train_workers"]


def shut_down_train_workers(trainer: Trainer) -> bool:
    """Stop the training loader's worker processes now; whether any loader was reached.

    What ``fit_loop.teardown`` does right after ``on_train_end`` (the combined loader's reset
    shuts persistent workers down; dropping the iterators ends the others), done early.
    Private names of Lightning and torch, hence the guard.
    """
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


def gather_medians(trainer: Trainer, accumulator: StepTimeAccumulator) -> dict[str, list[float]]:
    """Per phase, every rank's median (a collective: every rank must call it)."""
    summary = accumulator.compute()
    local = [summary[p]["median_ms"] if summary else math.nan for p in PHASES]
    tensor = torch.tensor(local, dtype=torch.float64, device=trainer.strategy.root_device)
    gathered = trainer.strategy.all_gather(tensor).reshape(-1, len(PHASES)).cpu()
    return {p: [float(v) for v in gathered[:, i]] for i, p in enumerate(PHASES)}
