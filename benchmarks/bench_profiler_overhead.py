"""The StepTimeProfiler's own overhead against the step time, measured in one run.

A small conv net (3 conv layers + head, 64 x 64 random images, batch 32) trains on random data
with ``num_workers=0``; the same Trainer set-up runs alternately without and with the callback
(``--rounds`` pairs), so both see the same machine load. Reported:

1. **Self time** (the number that matters on a noisy machine): every callback hook and profiler
   tap of the profiler is wrapped with ``perf_counter``; per step, their summed time against the
   step time, as the ratio of the medians (robust to the preemptions a shared machine inflicts
   on any code, ours included) and of the totals. Includes the wrapping's own cost, so it is an
   upper bound.
2. **Tap dispatch**: what passing every Lightning profiler action through the fetch tap
   costs, per step (counted actions x a micro-benchmarked per-action cost).
3. **A/B**: median step time (batch end to batch end) without and with the callback. On a shared
   machine the noise is larger than the effect; it is printed as a sanity check.
4. The end-of-fit report (table, JSON, PNG), once per fit, not per step.

Run: ``python benchmarks/bench_profiler_overhead.py [--steps 60] [--rounds 3] [--batch-size 32]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.profilers import PassThroughProfiler, Profiler
from torch import nn
from torch.utils.data import DataLoader, Dataset

from seg_datamodule.profiling import StepTimeProfiler
from seg_datamodule.profiling.tap import attach

# Hooks and taps of StepTimeProfiler that run every step.
_PER_STEP_METHODS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_train_batch_end",
    "on_fetch_start",
    "on_fetch_end",
    "_on_optimizer_step_end",
)


class RandomImages(Dataset):
    def __init__(self, length: int, size: int = 64) -> None:
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randn(length, 3, size, size, generator=generator)
        self.labels = torch.randint(0, 10, (length,), generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]


class SmallConvNet(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
        )

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        return nn.functional.cross_entropy(self.net(images), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class StepClock(L.Callback):
    """Batch-end to batch-end intervals: the step time either run sees, profiler or not."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends.append(time.perf_counter())

    def intervals_ms(self, skip: int) -> list[float]:
        return [(b - a) * 1e3 for a, b in zip(self.ends[skip:], self.ends[skip + 1 :])]


class SelfTimedProfiler(StepTimeProfiler):
    """StepTimeProfiler with its per-step methods timed (instance attributes shadow the class)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.self_times_s: Counter[str] = Counter()
        self.per_step_s: list[float] = []  # self time of each step
        self._bucket = 0.0
        self._depth = 0
        self.end_of_fit_s = 0.0
        for name in _PER_STEP_METHODS:
            setattr(self, name, self._timed(name, getattr(self, name)))

    @property
    def self_time_s(self) -> float:
        return sum(self.self_times_s.values())

    def _timed(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self._depth:  # called from another timed method (a hook calling _enter): counted there
                return method(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self.self_times_s[name] += elapsed
                self._bucket += elapsed
                self._depth -= 1
                if name == "on_train_batch_end":  # a step's hooks and taps end here
                    self.per_step_s.append(self._bucket)
                    self._bucket = 0.0

        return wrapper

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        start = time.perf_counter()
        super().on_train_end(trainer, pl_module)
        self.end_of_fit_s = time.perf_counter() - start


class CountingProfiler(PassThroughProfiler):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def start(self, action_name: str) -> None:
        self.counts[action_name] += 1


def run_fit(
    steps: int, batch_size: int, profiler: StepTimeProfiler | None, root: Path, counting: bool = False
) -> tuple[StepClock, L.Trainer]:
    clock = StepClock()
    callbacks: list[L.Callback] = [clock] if profiler is None else [profiler, clock]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        callbacks=callbacks,
        logger=CSVLogger(root),
        profiler=CountingProfiler() if counting else None,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=root,
    )
    torch.manual_seed(0)
    data = DataLoader(RandomImages(steps * batch_size), batch_size=batch_size, num_workers=0)
    trainer.fit(SmallConvNet(), data)
    return clock, trainer


class _NullListener:
    def on_fetch_start(self) -> None:
        pass

    def on_fetch_end(self) -> None:
        pass


def tap_dispatch_cost_us(counts: Counter[str], steps: int, tapped: set[str], repeat: int = 20000) -> float:
    """Per-step cost of the fetch tap on the Trainer's profiler: every action passes through it."""
    plain: Profiler = PassThroughProfiler()
    tapped_profiler: Profiler = PassThroughProfiler()
    attach(tapped_profiler, _NullListener())

    def per_call(profiler: Profiler, name: str) -> float:
        start = time.perf_counter()
        for _ in range(repeat):
            with profiler.profile(name):
                pass
        return (time.perf_counter() - start) / repeat

    names = {"tapped": next(iter(tapped)), "untapped": "[Callback]X.on_train_batch_end"}
    extra = {kind: per_call(tapped_profiler, name) - per_call(plain, name) for kind, name in names.items()}
    calls_tapped = sum(c for name, c in counts.items() if name in tapped) / steps
    calls_untapped = sum(c for name, c in counts.items() if name not in tapped) / steps
    return max(0.0, calls_tapped * extra["tapped"] + calls_untapped * extra["untapped"]) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    skip = 10  # warm-up steps left out of every figure

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # Count the profiler actions of one profiled fit (each passes through the fetch tap).
        counter_run = StepTimeProfiler(save_plot=False)
        _, trainer = run_fit(args.steps, args.batch_size, counter_run, root / "count", counting=True)
        counts: Counter[str] = trainer.profiler.counts  # type: ignore[attr-defined]
        tapped = {"[_TrainingEpochLoop].train_dataloader_next"}  # the only action the tap acts on

        without: list[float] = []
        with_profiler: list[float] = []
        self_ratio: list[float] = []
        median_ratio: list[float] = []
        end_of_fit: list[float] = []
        for r in range(args.rounds):
            clock, _ = run_fit(args.steps, args.batch_size, None, root / f"a{r}")
            without += clock.intervals_ms(skip)
            profiler = SelfTimedProfiler(save_plot=True)
            clock, _ = run_fit(args.steps, args.batch_size, profiler, root / f"b{r}")
            with_profiler += clock.intervals_ms(skip)
            # Self time of the measured steps only: scale by their share of all steps.
            steps_total_s = sum(profiler.accumulator.column("step_ms", measured_only=False)) / 1e3
            self_ratio.append(profiler.self_time_s / steps_total_s)
            step_s = profiler.accumulator.column("step_ms") / 1e3
            median_ratio.append(statistics.median(profiler.per_step_s[skip:]) / statistics.median(step_s))
            end_of_fit.append(profiler.end_of_fit_s)
        summary = profiler.summary()

    step_ms = statistics.median(with_profiler)
    dispatch_us = tap_dispatch_cost_us(counts, args.steps, tapped)
    print(f"small conv net, batch {args.batch_size} of 3x64x64, CPU, 1 thread,"
          f" {args.steps} steps x {args.rounds} rounds")
    print(f"profiler actions per step: {sum(counts.values()) / args.steps:.1f}"
          f" ({sum(c for n, c in counts.items() if n in tapped) / args.steps:.1f} tapped)")
    print("last profiled run's split (median ms):",
          ", ".join(f"{p} {s['median_ms']:.2f}" for p, s in summary.items()))
    print()
    print(f"1. self time of hooks + taps:        {statistics.median(median_ratio):.3%} of step time"
          f" (ratio of per-step medians; of totals: {statistics.median(self_ratio):.3%},"
          f" max over rounds {max(self_ratio):.3%})")
    print("   by method (us per step):", ", ".join(
        f"{name} {t / args.steps * 1e6:.1f}" for name, t in profiler.self_times_s.most_common()))
    dispatch_ratio = dispatch_us / 1e3 / step_ms
    print(f"2. tap dispatch:                     {dispatch_us:.1f} us per step = {dispatch_ratio:.3%}")
    print(f"   total overhead estimate (1 + 2):  {statistics.median(median_ratio) + dispatch_ratio:.3%}")
    a, b = statistics.median(without), statistics.median(with_profiler)
    print(f"3. A/B median step: without {a:.2f} ms, with {b:.2f} ms, difference {(b - a) / a:+.2%}"
          f" (noise: IQR without {_iqr(without) / a:.1%} of the median)")
    report_ms = statistics.median(end_of_fit) * 1e3
    print(f"4. end-of-fit report (table, JSON, PNG): {report_ms:.0f} ms once per fit")


def _iqr(values: list[float]) -> float:
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


if __name__ == "__main__":
    main()
