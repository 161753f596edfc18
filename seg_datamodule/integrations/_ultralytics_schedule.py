"""Ultralytics' trainer's step cadence and learning rates, as pure functions of the batch index.

``ultralytics.engine.trainer.BaseTrainer._do_train`` (8.4) does not step every ``nbs / batch``
batches from the start: over its warmup (``warmup_epochs`` of batches, leaving the last epoch out)
it ramps the accumulation from 1 up to the nominal one (``np.interp`` of the batch index, rounded),
so a short run takes about twice the optimiser steps a fixed accumulation would; the bias group's
learning rate falls from ``warmup_bias_lr`` while the others rise from 0, towards ``lr0`` times the
epoch's factor (linear to ``lrf``, or a cosine with ``cos_lr``), and SGD's momentum rises from
``warmup_momentum``. It steps when ``ni - last_opt_step >= accumulate``, ``ni`` counting batches
over the whole run. :class:`UltralyticsSchedule` answers each of these for any ``ni`` without
replaying the run, so a resumed run steps where the uninterrupted one did;
:class:`UltralyticsStepper`, held by a ``LightningModule``, steps its optimiser by it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from torch import Tensor, nn

__all__ = ["GROUPS", "UltralyticsSchedule", "UltralyticsStepper", "ultralytics_param_groups"]

GROUPS = ("weight", "bn", "bias")  # Ultralytics' param_group names, in its optimiser's order


def ultralytics_param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Ultralytics' ``build_optimizer`` groups: decayed weights, norm weights, biases.

    A parameter whose qualified name contains ``bias`` goes to ``bias``; any other parameter of a
    normalisation layer (a ``torch.nn`` class with ``Norm`` in its name) or named ``logit_scale``
    to ``bn``; the rest to ``weight``, the only group with weight decay.

    Args:
        model: the parameters' owner; frozen ones are listed too (they never have a gradient), as Ultralytics
            lists them (the DFL's fixed convolution).
        weight_decay: the ``weight`` group's decay.

    Returns:
        Three param-group dicts (``params``, ``weight_decay``, ``param_group``) in :data:`GROUPS` order.
    """
    norms = tuple(v for k, v in nn.__dict__.items() if "Norm" in k)
    params: dict[str, list[nn.Parameter]] = {g: [] for g in GROUPS}
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            group = "bias" if "bias" in full else "bn" if isinstance(module, norms) or "logit_scale" in full else "weight"
            params[group].append(param)
    return [{"params": params[g], "weight_decay": weight_decay if g == "weight" else 0.0, "param_group": g}
            for g in GROUPS]


@dataclass(frozen=True)
class UltralyticsSchedule:
    """When Ultralytics' trainer steps, and with which learning rate and momentum.

    Args:
        lr: ``lr0``, the peak learning rate.
        momentum: SGD's momentum (AdamW's beta1 is not warmed up: its groups have no ``momentum``).
        epochs: the run's epochs (the linear or cosine factor reaches ``lrf`` at the last).
        batches_per_epoch: ``nb``, batches of one epoch.
        accumulate: the nominal accumulation, ``max(round(nbs / batch), 1)``; capped here at the
            run's batches, as Ultralytics caps it.
        lrf: the final learning-rate fraction.
        cos_lr: a cosine from 1 to ``lrf`` instead of a line.
        warmup_epochs: the warmup's length in epochs (at most ``epochs - 1``); 0: none.
        warmup_bias_lr: where the bias group's learning rate starts.
        warmup_momentum: where SGD's momentum starts.
    """

    lr: float
    momentum: float
    epochs: int
    batches_per_epoch: int
    accumulate: int
    lrf: float = 0.01
    cos_lr: bool = False
    warmup_epochs: float = 3.0
    warmup_bias_lr: float = 0.1
    warmup_momentum: float = 0.8
    _warm_steps: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batches_per_epoch < 1 or self.accumulate < 1:
            raise ValueError(f"epochs, batches_per_epoch and accumulate must be >= 1, got {self.epochs}, "
                             f"{self.batches_per_epoch}, {self.accumulate}")
        object.__setattr__(self, "accumulate", min(self.accumulate, self.batches_per_epoch * self.epochs))
        # 1. Replay the warmup once (its accumulation varies); after it, steps fall every `accumulate`.
        steps, last = np.zeros(self.warmup_batches + 1, bool), -1
        for ni in range(len(steps)):
            if ni - last >= self.accumulate_at(ni):
                steps[ni], last = True, ni
        object.__setattr__(self, "_warm_steps", steps)

    @property
    def warmup_batches(self) -> int:
        """``nw``: the warmup's batches (``_get_warmup_iterations``), 0 without one."""
        epochs = min(self.warmup_epochs, max(self.epochs - 1, 0))
        return round(epochs * self.batches_per_epoch) if epochs > 0 else 0

    def lr_factor(self, epoch: int) -> float:
        """``lf(epoch)``: the factor of ``lr`` during ``epoch`` (Ultralytics' ``LambdaLR``, stepped per epoch)."""
        if self.cos_lr:  # ultralytics.utils.torch_utils.one_cycle(1, lrf, epochs)
            return ((1 - math.cos(epoch * math.pi / self.epochs)) / 2) * (self.lrf - 1) + 1
        return max(1 - epoch / self.epochs, 0) * (1.0 - self.lrf) + self.lrf

    def accumulate_at(self, ni: int) -> int:
        """Batches per step at batch ``ni``: ramped from 1 over the warmup, then the nominal one."""
        nw = self.warmup_batches
        if nw and ni <= nw:
            return max(1, int(np.interp(ni, [0, nw], [1, self.accumulate]).round()))
        return self.accumulate

    def steps_on(self, ni: int) -> bool:
        """Whether the optimiser steps after batch ``ni`` (``ni - last_opt_step >= accumulate``)."""
        if ni < 0:
            return False
        warm = self._warm_steps
        if ni < len(warm):
            return bool(warm[ni])
        last = int(np.flatnonzero(warm)[-1]) if warm.any() else -1
        return (ni - last) % self.accumulate == 0

    def lr_at(self, ni: int, epoch: int, group: str) -> float:
        """The learning rate of param group ``group`` (one of :data:`GROUPS`) at batch ``ni`` of ``epoch``."""
        target = self.lr * self.lr_factor(epoch)
        nw = self.warmup_batches
        if nw and ni <= nw:
            return float(np.interp(ni, [0, nw], [self.warmup_bias_lr if group == "bias" else 0.0, target]))
        return target

    def momentum_at(self, ni: int) -> float:
        """SGD's momentum at batch ``ni``: from ``warmup_momentum`` to ``momentum`` over the warmup."""
        nw = self.warmup_batches
        if nw and ni <= nw:
            return float(np.interp(ni, [0, nw], [self.warmup_momentum, self.momentum]))
        return self.momentum


class UltralyticsStepper:
    """Steps one optimiser where Ultralytics' trainer steps, for the ``LightningModule`` that holds it.

    It sizes an :class:`UltralyticsSchedule` to the Trainer's run, sets each param group's learning
    rate (and SGD's momentum) per batch, zeroes the gradients only after a step, steps only where
    the schedule does (running the forward and backward alone otherwise), and carries the
    gradients of a step in progress through a checkpoint. Lightning then sees one step per batch
    (``trainer.global_step`` counts batches).

    Args:
        lr, momentum, lrf, cos_lr, warmup_epochs, warmup_bias_lr, warmup_momentum: the schedule's
            (:class:`UltralyticsSchedule`).
    """

    def __init__(self, *, lr: float, momentum: float, lrf: float, cos_lr: bool, warmup_epochs: float,
                 warmup_bias_lr: float, warmup_momentum: float) -> None:
        self.hyper = {"lr": lr, "momentum": momentum, "lrf": lrf, "cos_lr": cos_lr, "warmup_epochs": warmup_epochs,
                      "warmup_bias_lr": warmup_bias_lr, "warmup_momentum": warmup_momentum}
        self.accumulate = 1  # the nominal accumulation
        self.stepped = True  # whether the last batch ended in a real optimiser step
        self.steps = 0  # real optimiser steps of the current fit
        self._schedule: UltralyticsSchedule | None = None
        self._pending: dict[str, Tensor] | None = None  # a checkpoint's accumulated gradients

    def set_accumulation(self, accumulate: int) -> None:
        """The nominal accumulation of this fit (``setup("fit")``); the schedule is sized at the first batch."""
        self.accumulate, self._schedule = accumulate, None

    def schedule(self, trainer: Any) -> UltralyticsSchedule:
        """The run's :class:`UltralyticsSchedule`, sized to the Trainer's epochs and epoch length.

        Raises:
            ValueError: the train loader has no length, or the run has neither ``max_epochs`` nor ``max_steps``.
        """
        batches = trainer.num_training_batches
        if self._schedule is None or self._schedule.batches_per_epoch != batches:
            if not math.isfinite(batches) or batches < 1:
                raise ValueError("schedule: ultralytics needs the epoch's length, and this train loader has none; "
                                 "set the model's schedule: lightning")
            epochs = trainer.max_epochs if trainer.max_epochs not in (None, -1) else None
            if epochs is None and trainer.max_steps not in (None, -1):
                epochs = math.ceil(trainer.max_steps / batches)  # a step is a batch here
            if epochs is None:
                raise ValueError("schedule: ultralytics decays the learning rate over the run's epochs: set "
                                 "trainer.max_epochs (or max_steps), or the model's schedule: lightning")
            self._schedule = UltralyticsSchedule(epochs=int(epochs), batches_per_epoch=int(batches),
                                                 accumulate=self.accumulate, **self.hyper)
        return self._schedule

    def zero_grad(self, trainer: Any, epoch: int, batch_idx: int, optimizer: Any) -> None:
        """Zero the gradients at the run's first batch and after a step only (Lightning asks at every batch)."""
        schedule = self.schedule(trainer)
        ni = epoch * schedule.batches_per_epoch + batch_idx
        if ni == 0 or schedule.steps_on(ni - 1):
            optimizer.zero_grad()

    def step(self, trainer: Any, epoch: int, batch_idx: int, optimizer: Any, closure: Any,
             skipped: Callable[[], bool]) -> None:
        """Set the batch's rates, run ``closure`` (forward and backward) and step where the schedule does.

        Args:
            skipped: after the closure, whether its loss was skipped (not finite): no step then.
        """
        schedule = self.schedule(trainer)
        ni = epoch * schedule.batches_per_epoch + batch_idx  # Ultralytics' ni: the batch over the whole run
        for group in optimizer.param_groups:
            group["lr"] = schedule.lr_at(ni, epoch, group.get("param_group", "weight"))
            if "momentum" in group:
                group["momentum"] = schedule.momentum_at(ni)
        if schedule.steps_on(ni):
            optimizer.step(closure=closure)
            self.stepped = not skipped()
            self.steps += int(self.stepped)
        else:
            closure()
            self.stepped = False

    def save(self, checkpoint: dict[str, Any], model: nn.Module) -> None:
        """Between two steps, put the gradients accumulated so far in ``checkpoint["accumulated_gradients"]``."""
        if not self.stepped:
            checkpoint["accumulated_gradients"] = {n: p.grad.detach().clone() for n, p in model.named_parameters()
                                                   if p.grad is not None}

    def load(self, checkpoint: dict[str, Any]) -> None:
        """Keep a checkpoint's accumulated gradients for :meth:`restore`."""
        self._pending = checkpoint.get("accumulated_gradients")

    def restore(self, model: nn.Module) -> None:
        """Put back the gradients a loaded checkpoint held (at the start of training)."""
        pending, self._pending = self._pending, None
        if not pending:
            return
        for name, param in model.named_parameters():
            if name in pending:
                param.grad = pending[name].to(param.device, param.dtype)
