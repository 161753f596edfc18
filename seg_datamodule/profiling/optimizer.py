"""Time ``optimizer.step()`` alone, on a copy of the optimiser's parameters and state.

The reference the callback's in-loop ``optimizer_step`` is read against: far above 1 means the
optimiser is starved of cores or memory bandwidth by what runs beside it in the loop.
"""

from __future__ import annotations

import copy
import multiprocessing
import threading
import time
from collections import OrderedDict, defaultdict
from typing import Any

import numpy as np
import torch

from seg_datamodule.ops.checks import check_int

__all__ = ["running_beside", "time_optimizer_step"]


def time_optimizer_step(optimizer: torch.optim.Optimizer, repeats: int = 10) -> float:
    """Median time of ``optimizer.step()`` alone, on a deep copy of its parameters and state.

    The copy gets the current gradients (zeros when no parameter has one), takes one untimed
    step, then ``repeats`` timed ones, each bracketed by a device synchronisation on CUDA. The
    original optimiser, parameters and state are untouched. Needs memory for a second copy of
    the parameters, gradients and optimiser state. An LR scheduler's wrapper around ``step``
    is not copied (it would step the original); the original's ``_version`` counters are checked
    afterwards, so a step that reached the original anyway raises instead of passing silently.

    Args:
        optimizer (torch.optim.Optimizer): the optimiser to time.
        repeats (int): timed steps, >= 1.

    Returns:
        float: the median step time in ms.

    Raises:
        TypeError: ``repeats`` is not an int.
        ValueError: ``repeats`` < 1.
        RuntimeError: the original's parameters or state changed (nothing known does this).
    """
    check_int("repeats", repeats, 1)
    clone = _detached_copy(optimizer)
    pairs = [
        (p, q)
        for group, clone_group in zip(optimizer.param_groups, clone.param_groups)
        for p, q in zip(group["params"], clone_group["params"])
    ]
    any_grad = any(p.grad is not None for p, _ in pairs)
    for p, q in pairs:
        if p.grad is not None:
            q.grad = p.grad.detach().clone()
        elif not any_grad:
            q.grad = torch.zeros_like(q)
    cuda = [q.device for _, q in pairs if q.device.type == "cuda"]

    def sync() -> None:
        for device in set(cuda):
            torch.cuda.synchronize(device)

    versions = _versions(optimizer)
    clone.step()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        clone.step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    if _versions(optimizer) != versions:  # the copy reached the original after all
        raise RuntimeError(
            f"timing {type(optimizer).__name__} in isolation changed the original's parameters or state:"
            " its step is bound to the original instance in a way this copy could not undo"
        )
    return float(np.median(times))


def _detached_copy(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Same class and attributes, copied parameters and state, no hooks, no instance-bound ``step``.

    Not ``copy.deepcopy(optimizer)``: ``Optimizer.__getstate__`` keeps only defaults, state and
    param_groups, dropping a subclass's own attributes. One memo keeps the copied state keyed to
    the copied parameters.
    """
    cls = type(optimizer)
    clone = object.__new__(cls)
    # An LR scheduler replaces `step` on the instance with a wrapper that calls the class's step
    # on the *original* (torch.optim.lr_scheduler, patch_track_step_called): copied, the clone's
    # step() would step the real optimiser (issue 12). Any instance attribute shadowing a method
    # of the class is such a wrapper; the clone uses the class's own.
    clone.__dict__.update(
        (name, value)
        for name, value in optimizer.__dict__.items()
        if not (callable(value) and callable(getattr(cls, name, None)))
    )
    memo: dict[int, Any] = {}
    clone.param_groups = copy.deepcopy(optimizer.param_groups, memo)
    clone.state = defaultdict(dict, copy.deepcopy(dict(optimizer.state), memo))
    clone._optimizer_step_pre_hooks = OrderedDict()
    clone._optimizer_step_post_hooks = OrderedDict()
    return clone


def _versions(optimizer: torch.optim.Optimizer) -> list[int]:
    """In-place modification counters of the parameters and state tensors (a cheap fingerprint)."""
    tensors = [p for group in optimizer.param_groups for p in group["params"]]
    tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return [t._version for t in tensors]


def running_beside() -> dict[str, Any]:
    """What else runs in and under this process, for a report to say what a timing ran beside.

    Returns:
        dict: ``threads`` (list[str], the names of the other live threads of this process) and
        ``child_processes`` (int, live children started through ``multiprocessing``, such as
        DataLoader workers).
    """
    current = threading.current_thread()
    threads = sorted(thread.name for thread in threading.enumerate() if thread is not current)
    return {"threads": threads, "child_processes": len(multiprocessing.active_children())}
