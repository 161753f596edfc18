"""Test doubles for the profiler's Trainer runs: costs that are injected and measured.

``__getitem__`` sleeps so a batch of 4 takes 40 ms with ``num_workers=0``, ``training_step`` sleeps
10 ms, the optimiser's ``step`` sleeps 30 ms after its closure. On a loaded machine the OS
stretches sleeps (several ms each at a load of 2 per core), so each double also times what it
actually injected, and the profiler is held to that reference.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader, Dataset

from seg_datamodule.profiling import PHASES, StepTimeProfiler

FETCH_MS, FORWARD_MS, OPTIMIZER_MS = 40.0, 10.0, 30.0
BATCH_SIZE = 4
SPLIT = [p for p in PHASES if p != "step"]


def assert_close(measured: float, expected: float, what: str) -> None:
    """Within 10 % or 3 ms, whichever is looser (sleep overshoots on a loaded machine)."""
    tolerance = max(0.1 * expected, 3.0)
    message = f"{what}: {measured:.2f} ms, expected {expected:.2f} +- {tolerance:.1f}"
    assert abs(measured - expected) <= tolerance, message


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).view(torch.uint8) if tensor.dtype.is_floating_point else tensor


def assert_bit_identical(a: Any, b: Any, where: str = "state_dict") -> None:
    """Tensors equal bit for bit (NaN included), containers recursively, the rest by ==."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(_bits(a), _bits(b)), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_bit_identical(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_bit_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def sleep_ms(ms: float, spin: bool = True) -> float:
    """Sleep ``ms``, spinning the last 2 ms (plain sleep overshoots more); returns the ms taken."""
    start = time.perf_counter()
    deadline = start + ms / 1e3
    if not spin:
        time.sleep(ms / 1e3)
    elif ms > 2.0:
        time.sleep((ms - 2.0) / 1e3)
    while time.perf_counter() < deadline:
        pass
    return (time.perf_counter() - start) * 1e3


def reference(costs_ms: list[float], nominal: float, what: str, group: int = 1, skip: int = 5) -> float:
    """Median measured cost (``group`` consecutive costs summed, the first ``skip`` left out).

    Also checks that the cost injected stayed near the nominal one (within 35 %), so a test
    cannot pass on a double that stopped injecting.
    """
    sums = [sum(costs_ms[i : i + group]) for i in range(0, len(costs_ms) - group + 1, group)][skip:]
    median = float(np.median(sums))
    assert abs(median - nominal) <= 0.35 * nominal, f"{what}: injected {median:.1f} ms for nominal {nominal}"
    return median


class SleepyDataset(Dataset):
    """Each item sleeps ``item_ms``: a batch of 4 costs 4 x item_ms in whoever loads it."""

    def __init__(self, length: int = 400, item_ms: float = FETCH_MS / BATCH_SIZE, spin: bool = True) -> None:
        self.length = length
        self.item_ms = item_ms
        self.spin = spin  # False: plain sleep, so idle workers do not compete for the cores
        self.costs_ms: list[float] = []  # measured, per item, in the process that loads it

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        self.costs_ms.append(sleep_ms(self.item_ms, self.spin))
        return torch.full((8,), float(index % 7))


class SlowSGD(torch.optim.SGD):
    """SGD whose own work takes ``sleep_ms`` more, after the closure (forward + backward) ran."""

    def __init__(self, params: Any, lr: float = 0.01, sleep_ms: float = OPTIMIZER_MS) -> None:
        super().__init__(params, lr=lr, momentum=0.9)
        self.sleep_ms = sleep_ms
        self.costs_ms: list[float] = []  # measured: the sleep and SGD's own step

    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        start = time.perf_counter()
        sleep_ms(self.sleep_ms)
        super().step()
        self.costs_ms.append((time.perf_counter() - start) * 1e3)
        return loss


class CostModel(L.LightningModule):
    """A linear model whose training_step sleeps ``forward_ms``.

    Args:
        manual: manual optimisation (backward and step inside training_step).
        inf_every: make the loss infinite on every n-th batch (an AMP scaler then skips the step).
        straggler_ms: extra forward time on rank 1.
    """

    def __init__(
        self,
        forward_ms: float = FORWARD_MS,
        manual: bool = False,
        inf_every: int = 0,
        straggler_ms: float = 0.0,
    ) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.forward_ms = forward_ms
        self.automatic_optimization = not manual
        self.inf_every = inf_every
        self.straggler_ms = straggler_ms
        self.costs_ms: list[float] = []  # measured forward sleeps

    def _loss(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        extra = self.straggler_ms if self.global_rank == 1 else 0.0
        self.costs_ms.append(sleep_ms(self.forward_ms + extra))
        loss = self.layer(batch).float().pow(2).mean()
        if self.inf_every and batch_idx % self.inf_every == 0:
            loss = loss * float("inf")
        return loss

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor | None:
        loss = self._loss(batch, batch_idx)
        if self.automatic_optimization:
            return loss
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return SlowSGD(self.parameters())


class IteratorModel(CostModel):
    """training_step takes Lightning's ``dataloader_iter`` (found by the argument's name) and fetches."""

    def training_step(self, dataloader_iter: Any) -> torch.Tensor:  # type: ignore[override]
        batch, batch_idx, _ = next(dataloader_iter)
        return self._loss(batch, batch_idx)


class MemoryLogger(Logger):
    """Keeps every ``log_metrics`` call; its ``save_dir`` is where the report goes."""

    def __init__(self, save_dir: Path) -> None:
        super().__init__()
        self._save_dir = str(save_dir)
        self.logged: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    @property
    def save_dir(self) -> str:
        return self._save_dir

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append((int(step or 0), dict(metrics)))


def make_trainer(root: Path, callback: StepTimeProfiler, max_steps: int = 25, **kwargs: Any) -> L.Trainer:
    kwargs.setdefault("logger", MemoryLogger(root))
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        callbacks=[callback],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=root,
        **kwargs,
    )


def loader(num_workers: int = 0, **kwargs: Any) -> DataLoader:
    return DataLoader(
        SleepyDataset(spin=num_workers == 0),
        batch_size=BATCH_SIZE,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        **kwargs,
    )
