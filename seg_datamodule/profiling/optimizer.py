"""Time ``optimizer.step()`` alone, on a copy of the optimiser's parameters and state.

The reference the callback's in-loop ``optimizer_step`` is read against: far above 1 means the
optimiser is starved of cores or memory bandwidth by what runs beside it in the loop.
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict, defaultdict
from typing import Any

import numpy as np
import torch

from seg_datamodule.ops.checks import check_int

__all__ = ["time_optimizer_step"]


def time_optimizer_step(optimizer: torch.optim.Optimizer, repeats: int = 10) -> float:
    """Median time of ``optimizer.step()`` alone, on a deep copy of its parameters and state.

    The copy gets the current gradients (zeros when no parameter has one), takes one untimed
    step, then ``repeats`` timed ones, each bracketed by a device synchronisation on CUDA. The
    original optimiser, parameters and state are untouched. Needs memory for a second copy of
    the parameters, gradients and optimiser state.

    Args:
        optimizer (torch.optim.Optimizer): the optimiser to time.
        repeats (int): timed steps, >= 1.

    Returns:
        float: the median step time in ms.

    Raises:
        TypeError: ``repeats`` is not an int.
        ValueError: ``repeats`` < 1.
    """
    check_int("repeats", repeats, 1)
    # Not copy.deepcopy(optimizer): Optimizer.__getstate__ keeps only defaults, state and
    # param_groups, dropping a subclass's own attributes. Same class and attributes, copied
    # parameters and state (one memo keeps the state keyed to the copied parameters), no hooks.
    clone = object.__new__(type(optimizer))
    clone.__dict__.update(optimizer.__dict__)
    memo: dict[int, Any] = {}
    clone.param_groups = copy.deepcopy(optimizer.param_groups, memo)
    clone.state = defaultdict(dict, copy.deepcopy(dict(optimizer.state), memo))
    clone._optimizer_step_pre_hooks = OrderedDict()
    clone._optimizer_step_post_hooks = OrderedDict()
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

    clone.step()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        clone.step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))
