"""Test doubles for the profiler's Trainer runs: costs that are injected and measured.

``__getitem__`` sleeps so a batch of 4 takes 40 ms with ``num_workers=0``, ``training_step`` sleeps
10 ms, the optimiser's ``step`` sleeps 30 ms after its closure. On a loaded machine the OS
stretches sleeps and everything between them (tens of ms at a load of 3 on 2 cores), so nominal
costs mean little: each double times, step by step, the interval the profiler should report
(``TimedLoader`` the wait in ``next()``, ``CostModel`` its ``training_step`` less what is nested
in it, ``SlowSGD`` its own work, ``StepEnds`` the end of the step), and :func:`assert_tracks`
holds the profiler to those per-step references, pairing step with step so that a preemption
inside an interval stretches both sides alike.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
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


def injected(costs_ms: list[float], nominal: float, what: str, group: int = 1) -> list[float]:
    """Costs summed per ``group`` consecutive ones (a batch's items), checked to be injected.

    A sleep never ends early and load only stretches it, so the median must reach 90 % of the
    nominal cost: a double that stopped injecting fails here rather than passing vacuously.
    """
    sums = [sum(costs_ms[i : i + group]) for i in range(0, len(costs_ms) - group + 1, group)]
    assert sums and float(np.median(sums)) >= 0.9 * nominal, f"{what}: injected {sums} for nominal {nominal}"
    return sums


def assert_contains(measured: Sequence[float], inner: Sequence[float], what: str) -> None:
    """Every step's phase holds the interval the double measured inside it (the same clock, so
    no tolerance for load: a bracket cannot be shorter than what it brackets)."""
    assert len(measured) == len(inner) > 0, f"{what}: {len(measured)} steps, {len(inner)} inner intervals"
    short = [(k, m, i) for k, (m, i) in enumerate(zip(measured, inner)) if m < i - 0.05]
    assert not short, f"{what}: (step, measured ms, inner ms) shorter than what they hold: {short}"


def assert_tracks(measured: Sequence[float], reference: Sequence[float], what: str, skip: int = 5) -> None:
    """The profiler's per-step times against the test's own per-step measurement of the same span.

    Pairs step ``k`` with step ``k`` (the first ``skip`` left out): the median difference must stay
    within 10 % of the reference's median or 3 ms, whichever is looser.
    """
    measured = np.asarray(measured, dtype=np.float64)[skip:]
    reference = np.asarray(reference, dtype=np.float64)[skip : skip + len(measured)]
    assert len(measured) == len(reference) > 0, f"{what}: {len(measured)} steps measured, {len(reference)} references"
    difference = float(np.median(measured - reference))
    tolerance = max(0.1 * float(np.median(reference)), 3.0)
    assert abs(difference) <= tolerance, (
        f"{what}: measured - reference, median over steps, {difference:+.2f} ms"
        f" (reference median {np.median(reference):.2f} ms), tolerance {tolerance:.1f}"
    )


class ClockReadings:
    """Stands in for the ``time`` module of ``seg_datamodule.profiling.optimizer``: the real
    ``perf_counter``, every reading kept, so a test sees the exact brackets the isolated timing took.

    Why not a tolerance on the double's own cost: on a busy machine the OS takes the process off
    the core for a scheduler tick (4 ms here) now and then, and it lands between the timer's clock
    and the double's in several percent of the steps (measured beside two busy processes), which a
    3 ms tolerance on a median of 3 does not survive. The brackets themselves are the reference,
    stretched by load alike.
    """

    def __init__(self) -> None:
        self.readings: list[float] = []

    def perf_counter(self) -> float:
        now = time.perf_counter()
        self.readings.append(now)
        return now


def assert_isolated_timing(median_ms: float, clock: ClockReadings, spans: Sequence[tuple[float, float]],
                           what: str) -> None:
    """``time_optimizer_step``'s result against what it timed: each of its brackets (two readings of
    ``clock``) holds exactly one step of the double (``spans``, the double's own measurements, in
    order), nothing of the step before or after it, and the result is the median of the brackets."""
    brackets = list(zip(clock.readings[::2], clock.readings[1::2]))
    assert len(clock.readings) % 2 == 0 and len(brackets) == len(spans) > 0, (what, len(clock.readings), len(spans))
    for k, ((t0, t1), (start, end)) in enumerate(zip(brackets, spans)):
        assert t0 <= start and end <= t1, f"{what}: bracket {k} ({t0}, {t1}) does not hold the step ({start}, {end})"
        if k + 1 < len(spans):
            assert t1 <= spans[k + 1][0], f"{what}: bracket {k} reaches into the next step"
        if k > 0:
            assert spans[k - 1][1] <= t0, f"{what}: bracket {k} reaches into the step before"
    assert median_ms == float(np.median([(t1 - t0) * 1e3 for t0, t1 in brackets])), what
    assert median_ms >= float(np.median([(end - start) * 1e3 for start, end in spans])), what


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
        self.spans: list[tuple[float, float]] = []  # the same intervals, (start, end) perf_counter s

    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        start = time.perf_counter()
        sleep_ms(self.sleep_ms)
        super().step()
        end = time.perf_counter()
        self.costs_ms.append((end - start) * 1e3)
        self.spans.append((start, end))
        return loss


class CostModel(L.LightningModule):
    """A linear model whose training_step sleeps ``forward_ms``.

    Args:
        manual: manual optimisation (backward and step inside training_step).
        inf_every: make the loss infinite on every n-th batch (an AMP scaler then skips the step).
        straggler_ms: extra forward time on rank 1.
        costs_dir: write ``forward_rank<r>.json`` there at the end of fit (``forward_ref_ms`` and
            the rank's profiler rows), for runs in spawned processes.
    """

    def __init__(
        self,
        forward_ms: float = FORWARD_MS,
        manual: bool = False,
        inf_every: int = 0,
        straggler_ms: float = 0.0,
        costs_dir: Path | None = None,
    ) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.forward_ms = forward_ms
        self.automatic_optimization = not manual
        self.inf_every = inf_every
        self.straggler_ms = straggler_ms
        self.costs_dir = costs_dir
        self.costs_ms: list[float] = []  # measured forward sleeps
        #: per training_step, its duration less the backward, optimiser step and fetch inside it
        self.forward_ref_ms: list[float] = []

    def _loss(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        extra = self.straggler_ms if self.global_rank == 1 else 0.0
        self.costs_ms.append(sleep_ms(self.forward_ms + extra))
        loss = self.layer(batch).float().pow(2).mean()
        if self.inf_every and batch_idx % self.inf_every == 0:
            loss = loss * float("inf")
        return loss

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor | None:
        start = time.perf_counter()
        loss = self._loss(batch, batch_idx)
        if self.automatic_optimization:
            self.forward_ref_ms.append((time.perf_counter() - start) * 1e3)
            return loss
        optimizer = self.optimizers()
        optimizer.zero_grad()
        # What follows is backward and optimizer_step to the profiler, and then the step returns.
        self.forward_ref_ms.append((time.perf_counter() - start) * 1e3)
        self.manual_backward(loss)
        optimizer.step()
        return None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return SlowSGD(self.parameters())

    def on_train_end(self) -> None:
        if self.costs_dir is not None:
            # Callbacks' on_train_end ran before this hook: the profiler's rows are complete.
            profiler = next(c for c in self.trainer.callbacks if isinstance(c, StepTimeProfiler))
            path = Path(self.costs_dir) / f"forward_rank{self.global_rank}.json"
            path.write_text(json.dumps({"forward_ref_ms": self.forward_ref_ms, "rows": profiler.rows()}))


class IteratorModel(CostModel):
    """training_step takes Lightning's ``dataloader_iter`` (found by the argument's name) and fetches."""

    def training_step(self, dataloader_iter: Any) -> torch.Tensor:  # type: ignore[override]
        batch, batch_idx, _ = next(dataloader_iter)  # train_dataloader_next to the profiler
        start = time.perf_counter()
        loss = self._loss(batch, batch_idx)
        self.forward_ref_ms.append((time.perf_counter() - start) * 1e3)
        return loss


class TimedLoader(DataLoader):
    """A DataLoader that times each ``next()`` on its iterator: the wait the profiler calls the fetch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fetches: list[tuple[float, float]] = []  # (start, end) perf_counter seconds

    def __iter__(self) -> Any:
        iterator = super().__iter__()
        while True:
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self.fetches.append((start, time.perf_counter()))
            yield batch

    @property
    def fetch_ms(self) -> list[float]:
        return [(end - start) * 1e3 for start, end in self.fetches]


class StepEnds(L.Callback):
    """Listed right after the profiler: when each step started its forward, its backward, and
    ended, as seen from the hooks the profiler uses (so load stretches both sides alike)."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.backward_starts: list[float] = []
        self.ends: list[float] = []

    def on_train_batch_start(self, *args: Any) -> None:
        self.starts.append(time.perf_counter())

    def on_before_backward(self, *args: Any) -> None:
        self.backward_starts.append(time.perf_counter())

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends.append(time.perf_counter())

    def forward_ms(self, nested_ms: Sequence[float] | None = None) -> list[float]:
        """Automatic optimisation: per step, on_train_batch_start to on_before_backward, less
        ``nested_ms`` (a fetch inside training_step)."""
        spans = [(b - s) * 1e3 for s, b in zip(self.starts, self.backward_starts)]
        return spans if nested_ms is None else [span - n for span, n in zip(spans, nested_ms)]

    def step_ms(self, loader: TimedLoader) -> list[float]:
        """Per step, from the start of its fetch to its end (sized loaders: one fetch per step)."""
        return [(end - start) * 1e3 for (start, _), end in zip(loader.fetches, self.ends)]


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
        callbacks=[callback, StepEnds()],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=root,
        **kwargs,
    )


def loader(num_workers: int = 0, **kwargs: Any) -> TimedLoader:
    return TimedLoader(
        SleepyDataset(spin=num_workers == 0),
        batch_size=BATCH_SIZE,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        **kwargs,
    )


class NoCudaEvents:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a CUDA event was created off CUDA")


@dataclass
class Run:
    profiler: StepTimeProfiler
    trainer: L.Trainer
    model: CostModel
    loader: TimedLoader
    root: Path

    @property
    def dataset(self) -> SleepyDataset:
        return self.loader.dataset

    @property
    def optimizer_costs_ms(self) -> list[float]:
        return self.trainer.optimizers[0].costs_ms

    def column(self, name: str, stepped: bool = False) -> list[float]:
        """The profiler's ``<name>_ms`` per step, warm-up included (only stepping ones if ``stepped``)."""
        return [r[f"{name}_ms"] for r in self.profiler.rows() if r["optimizer_calls"] or not stepped]

    @property
    def probe(self) -> StepEnds:
        return next(c for c in self.trainer.callbacks if isinstance(c, StepEnds))

    def check_forward(self, skip: int = 5, nested_fetch: bool = False) -> None:
        """``forward`` holds each training_step's own work and tracks the span between the hooks
        that bound it (automatic optimisation)."""
        forward = self.column("forward")
        injected(self.model.costs_ms, self.model.forward_ms, "forward")
        assert_contains(forward, self.model.forward_ref_ms, "forward")
        nested = self.loader.fetch_ms if nested_fetch else None
        assert_tracks(forward, self.probe.forward_ms(nested), "forward", skip=skip)

    @property
    def step_ref_ms(self) -> list[float]:
        """The test's own step: from the start of the fetch to the end of the profiler's hook."""
        return self.probe.step_ms(self.loader)


def fit(root: Path, callback: StepTimeProfiler, model: CostModel, num_workers: int = 0, **kwargs: Any) -> Run:
    trainer = make_trainer(root, callback, **kwargs)
    data = loader(num_workers)
    trainer.fit(model, data)
    return Run(callback, trainer, model, data, root)
