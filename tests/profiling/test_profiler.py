"""StepTimeProfiler: accuracy against injected costs, not presence.

Trainer runs use a model and data whose costs are known: ``__getitem__`` sleeps so a batch of 4
takes 40 ms with ``num_workers=0``, ``training_step`` sleeps 10 ms, the optimiser's ``step``
sleeps 30 ms after its closure. The summary's medians must land within 10 % (or 3 ms) of them.

On a loaded machine the OS stretches sleeps (several ms each at a load of 2 per core), so each
test double also times what it actually injected, and the profiler is held to that reference;
the reference itself must stay near the nominal cost. The pieces below the callback
(accumulator, phase timer, device split, profiler tap) are tested on their own with exact,
made-up times.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import Logger
from lightning.pytorch.plugins import MixedPrecision
from lightning.pytorch.profilers import SimpleProfiler
from torch.utils.data import DataLoader, Dataset

from seg_datamodule.profiling.callback import PHASES, StepTimeAccumulator, StepTimeProfiler, _attribute, _device_split, format_table, _PhaseTimer, _split_record, _TapProfiler, plot_step_split, time_optimizer_step

# torch 2.14 deprecates pytree's LeafSpec, which Lightning 2.6 still builds for every batch.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning"
)

FETCH_MS, FORWARD_MS, OPTIMIZER_MS = 40.0, 10.0, 30.0
BATCH_SIZE = 4
SPLIT = [p for p in PHASES if p != "step"]


def assert_close(measured: float, expected: float, what: str) -> None:
    """Within 10 % or 3 ms, whichever is looser (sleep overshoots on a loaded machine)."""
    tolerance = max(0.1 * expected, 3.0)
    message = f"{what}: {measured:.2f} ms, expected {expected:.2f} +- {tolerance:.1f}"
    assert abs(measured - expected) <= tolerance, message


# ---------------------------------------------------------------------------- test doubles


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


# ---------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"warmup_steps": -1}, ValueError, "warmup_steps must be >= 0, got -1"),
        ({"warmup_steps": 2.5}, TypeError, "warmup_steps must be an int >= 0, got 2.5"),
        ({"warmup_steps": True}, TypeError, "warmup_steps must be an int"),
        ({"log_every_n_steps": -3}, ValueError, "log_every_n_steps must be >= 0, got -3"),
        ({"log_every_n_steps": "5"}, TypeError, "log_every_n_steps must be an int >= 0 or None, got '5'"),
        ({"synchronize": 1}, TypeError, "synchronize must be a bool, got 1"),
        ({"isolated_optimizer_steps": -1}, ValueError, "isolated_optimizer_steps must be >= 0"),
        ({"dirpath": 3}, TypeError, "dirpath must be a str"),
        ({"filename": ""}, ValueError, "filename must be a non-empty file stem"),
        ({"filename": "a/b"}, ValueError, "without a path separator, got 'a/b'"),
        ({"filename": None}, TypeError, "filename must be a str, got None"),
        ({"save_plot": "yes"}, TypeError, "save_plot must be a bool, got 'yes'"),
    ],
)
def test_init_rejects_bad_arguments(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        StepTimeProfiler(**kwargs)


def test_init_arguments_are_plain_and_stored() -> None:
    profiler = StepTimeProfiler(
        warmup_steps=0, log_every_n_steps=10, synchronize=True, isolated_optimizer_steps=3, dirpath="out"
    )
    assert (profiler.warmup_steps, profiler.log_every_n_steps, profiler.synchronize) == (0, 10, True)
    assert (profiler.isolated_optimizer_steps, profiler.dirpath, profiler.filename) == (3, "out", "step_time")
    assert profiler.summary() == {}


# ---------------------------------------------------------------------------- accumulator


def test_accumulator_empty_and_warmup_only() -> None:
    acc = StepTimeAccumulator(warmup_steps=2)
    assert acc.compute() == {} and acc.rows() == [] and len(acc) == 0
    acc.update(10.0, {"forward": 4.0})
    acc.update(10.0, {"forward": 4.0})
    assert acc.compute() == {}  # both rows are warm-up
    assert len(acc.rows()) == 2 and acc.rows()[1]["batch"] == 1


def test_accumulator_statistics_and_shares() -> None:
    acc = StepTimeAccumulator(warmup_steps=1)
    acc.update(1000.0, {"train_dataloader_next": 990.0})  # warm-up: left out of the summary
    fetch = [40.0, 42.0, 44.0, 46.0]
    for i, f in enumerate(fetch):
        phases = {"train_dataloader_next": f, "optimizer_step": 30.0}
        acc.update(f + 30.0 + 5.0, phases, optimizer_calls=i % 2)
    summary = acc.compute()
    assert set(summary) == set(PHASES)
    s = summary["train_dataloader_next"]
    assert s["median_ms"] == pytest.approx(43.0)
    assert s["mean_ms"] == pytest.approx(43.0)
    assert s["p90_ms"] == pytest.approx(np.percentile(fetch, 90))
    assert s["total_s"] == pytest.approx(sum(fetch) / 1e3)
    assert summary["other"]["median_ms"] == pytest.approx(5.0)
    assert summary["forward"]["median_ms"] == 0.0
    assert sum(summary[p]["share"] for p in SPLIT) == pytest.approx(1.0)
    assert summary["step"]["share"] == 1.0
    assert summary["optimizer_step"]["share"] == pytest.approx(120.0 / (sum(fetch) + 120 + 20))
    assert summary["optimizer_step"]["stepped_median_ms"] == pytest.approx(30.0)
    assert "device_median_ms" not in summary["step"]


def test_accumulator_clamps_other_and_shares_still_sum_to_one() -> None:
    acc = StepTimeAccumulator(warmup_steps=0)
    acc.update(10.0, {"forward": 6.0, "backward": 6.0})  # named phases exceed the step (clock skew)
    acc.update(10.0, {"forward": 2.0})
    row = acc.rows()[0]
    assert row["other_ms"] == 0.0
    summary = acc.compute()
    assert sum(summary[p]["share"] for p in SPLIT) == pytest.approx(1.0)


def test_accumulator_rejects_bad_rows() -> None:
    acc = StepTimeAccumulator()
    with pytest.raises(ValueError, match=r"unknown \['fwd'\]"):
        acc.update(10.0, {"fwd": 1.0})
    with pytest.raises(ValueError, match="forward_ms must be a finite time >= 0, got -1.0"):
        acc.update(10.0, {"forward": -1.0})
    with pytest.raises(ValueError, match="step_ms must be a finite time >= 0, got nan"):
        acc.update(float("nan"), {})
    with pytest.raises(ValueError, match="warmup_steps must be >= 0"):
        StepTimeAccumulator(-1)
    assert len(acc) == 0


def test_accumulator_device_columns_and_reset() -> None:
    acc = StepTimeAccumulator(warmup_steps=0)
    acc.update(10.0, {"forward": 4.0})  # a host-only row before device rows: NaN-filled
    device = {"forward": 6.0, "backward": 2.0, "other": 2.0, "step": 10.0}
    for _ in range(3):
        acc.update(10.0, {"forward": 4.0}, device_ms=device, device_busy_ms=7.0)
    summary = acc.compute()
    assert summary["forward"]["device_median_ms"] == pytest.approx(6.0)
    assert sum(summary[p]["device_share"] for p in SPLIT) == pytest.approx(1.0)
    assert summary["step"]["device_busy_share"] == pytest.approx(0.7)
    assert summary["step"]["device_idle_share"] == pytest.approx(0.3)
    assert math.isnan(acc.rows()[0]["device_forward_ms"])
    acc.reset()
    assert len(acc) == 0 and acc.rows() == []


# ---------------------------------------------------------------------------- phase timer


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_phase_timer_exclusive_nesting_sums_to_step() -> None:
    clock = FakeClock()
    timer = _PhaseTimer(clock=clock)
    fetch, to_device, forward, backward, optimizer = range(5)

    def at(ms: float) -> _PhaseTimer:
        clock.now = ms / 1e3
        return timer

    timer.enter(forward)  # no step open: ignored
    at(0).open()
    timer.enter(fetch)
    at(4).exit(fetch)
    at(5).enter(to_device)
    at(6).exit(to_device)
    at(7).enter(forward)
    at(8).enter(fetch)  # a dataloader_iter fetch inside training_step
    at(9).exit(fetch)
    at(10).enter(backward)  # manual_backward inside training_step
    at(12).exit(backward)
    at(13).enter(optimizer)  # opt.step() inside training_step
    at(13).enter(optimizer)  # re-entry (LBFGS closures): ignored
    at(16).exit(optimizer)
    at(18).exit(forward)
    at(20)
    record = timer.close(batch=0)
    assert record is not None and not timer.is_open and timer.close() is None
    step_ms, phase_ms, device_ms, busy_ms = _split_record(record)
    assert step_ms == pytest.approx(20.0)
    expected = {
        "train_dataloader_next": 5.0, "batch_to_device": 1.0, "forward": 5.0, "backward": 2.0, "optimizer_step": 3.0
    }
    assert phase_ms == pytest.approx(expected)
    assert device_ms is None and busy_ms is None
    other = step_ms - sum(phase_ms.values())
    assert other == pytest.approx(1.0 + 1.0 + 2.0)


def test_phase_timer_exit_closes_nested_and_discard() -> None:
    clock = FakeClock()
    timer = _PhaseTimer(clock=clock)
    timer.open()
    timer.enter(2)
    clock.now = 0.001
    timer.enter(4)  # never exited by itself
    clock.now = 0.003
    timer.exit(2)  # closes 4 too
    timer.exit(4)  # already closed: ignored
    clock.now = 0.004
    record = timer.close()
    assert record is not None
    assert record.active == [-1, 2, 4, -1, -1]
    timer.open()
    timer.discard()
    assert not timer.is_open


def test_attribute_maps_none_to_other() -> None:
    # intervals of 1, 2 and 3 s after boundaries running none, fetch and optimizer_step
    out = _attribute([0.0, 1.0, 3.0, 6.0], [-1, 0, 4, -1], scale=1.0)
    assert out == [2.0, 0.0, 0.0, 0.0, 3.0, 1.0]


# ---------------------------------------------------------------------------- device split


def test_device_split_busy_lower_bound() -> None:
    active = [-1, 2, -1]
    # Starved device: each marker runs the moment it is enqueued -> nothing provably busy.
    per_phase, span, busy = _device_split([5.0, 20.0], 1.0, [1.0, 1.005, 1.025], active)
    assert span == pytest.approx(25.0) and busy == pytest.approx(0.0)
    assert per_phase[2] == pytest.approx(20.0) and per_phase[5] == pytest.approx(5.0)
    # Device behind: the host enqueued the forward's work in 2 ms, the device ran it for 20 ms
    # starting when it reached the marker -> busy from 1.005 s (end of enqueue is earlier) to 1.025 s.
    _, _, busy = _device_split([5.0, 20.0], 1.0, [0.990, 0.992, 0.994], active)
    assert busy == pytest.approx(25.0)
    # Partly: the last work was enqueued 15 ms into the device's 20 ms interval -> 5 ms certain.
    _, _, busy = _device_split([5.0, 20.0], 1.0, [1.0, 1.005, 1.020], active)
    assert busy == pytest.approx(5.0)


class FakeEvent:
    """A CUDA event stand-in: reached by the fake device at ``device_s``."""

    def __init__(self, device_s: float, done: bool = True) -> None:
        self.device_s = device_s
        self.done = done

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def elapsed_time(self, other: FakeEvent) -> float:
        return (other.device_s - self.device_s) * 1e3


class FakeMarks:
    """``_CudaMarks`` stand-in: the device runs ``lag_s`` behind the host clock."""

    def __init__(self, clock: FakeClock, lag_s: float) -> None:
        self.clock = clock
        self.lag_s = lag_s
        self.anchor = (FakeEvent(0.0), 0.0)
        self.synchronized = 0

    def record(self) -> FakeEvent:
        return FakeEvent(self.clock.now + self.lag_s)

    def synchronize(self) -> None:
        self.synchronized += 1


def test_timer_with_device_marks_reports_device_split() -> None:
    clock = FakeClock()
    marks = FakeMarks(clock, lag_s=0.010)  # the device is 10 ms behind throughout: always busy
    timer = _PhaseTimer(clock=clock, marks=marks)
    timer.open()
    clock.now = 0.002
    timer.enter(2)
    clock.now = 0.012
    timer.exit(2)
    clock.now = 0.015
    record = timer.close()
    assert record is not None and record.ready() and len(record.events) == 4
    step_ms, phase_ms, device_ms, busy_ms = _split_record(record)
    assert phase_ms["forward"] == pytest.approx(10.0) and step_ms == pytest.approx(15.0)
    assert device_ms is not None and device_ms["forward"] == pytest.approx(10.0)
    assert device_ms["step"] == pytest.approx(15.0)
    assert busy_ms == pytest.approx(15.0)
    record.events[-1].done = False
    assert not record.ready()
    # synchronize=True waits at every boundary
    timer = _PhaseTimer(clock=clock, marks=marks, synchronize=True)
    timer.open()
    timer.close()
    assert marks.synchronized == 2


# ---------------------------------------------------------------------------- profiler tap


def test_tap_profiler_forwards_and_taps_in_order() -> None:
    inner = SimpleProfiler()
    calls: list[str] = []
    tap = _TapProfiler(inner, {"a": lambda: calls.append("start a")}, {"a": lambda: calls.append("stop a")})
    tap.start("a")
    tap.stop("a")
    with tap.profile("a"):
        calls.append("body")
    with tap.profile("b"):  # untapped: straight to the inner profiler
        calls.append("body b")
    assert calls == ["start a", "stop a", "start a", "body", "stop a", "body b"]
    assert len(inner.recorded_durations["a"]) == 2 and len(inner.recorded_durations["b"]) == 1
    assert tap.recorded_durations is inner.recorded_durations  # attributes read through
    tap.__del__()  # must not tear down the wrapped profiler


# ---------------------------------------------------------------------------- isolated optimiser step


def test_time_optimizer_step_leaves_the_original_untouched() -> None:
    layer = torch.nn.Linear(4, 2)
    optimizer = SlowSGD(layer.parameters(), sleep_ms=5.0)
    layer(torch.randn(3, 4)).sum().backward()
    optimizer.step()  # momentum buffers now exist
    before = [p.detach().clone() for p in layer.parameters()]
    momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in layer.parameters()]
    median = time_optimizer_step(optimizer, repeats=3)
    assert_close(median, 5.0, "isolated step")
    for p, b, m in zip(layer.parameters(), before, momentum):
        assert torch.equal(p, b) and torch.equal(optimizer.state[p]["momentum_buffer"], m)
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        time_optimizer_step(optimizer, repeats=0)


# ---------------------------------------------------------------------------- plot and table


def _report(steps: int = 12, device: bool = False) -> dict[str, Any]:
    acc = StepTimeAccumulator(warmup_steps=2)
    for i in range(steps):
        kwargs: dict[str, Any] = {}
        if device:
            kwargs = {"device_ms": {"forward": 8.0, "other": 2.0, "step": 10.0}, "device_busy_ms": 6.0}
        acc.update(20.0 + i, {"train_dataloader_next": 10.0 + i, "forward": 5.0}, **kwargs)
    return {"phases": list(PHASES), "warmup_steps": 2, "summary": acc.compute(), "rows": acc.rows()}


@pytest.mark.parametrize("device", [False, True])
def test_plot_step_split_from_dict_and_json(tmp_path: Path, device: bool) -> None:
    report = _report(device=device)
    figure = plot_step_split(report, max_bars=5)
    steps_ax, share_ax = figure.axes
    assert len(steps_ax.patches) == 5 * len(SPLIT)  # 5 bars of the 12 steps, one segment per phase
    assert len(share_ax.get_xticks()) == (3 if device else 1)  # host [, device, busy]
    path = tmp_path / "step_time.json"
    path.write_text(json.dumps(report))
    figure = plot_step_split(path)
    figure.savefig(tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_plot_step_split_rejects_bad_input() -> None:
    with pytest.raises(TypeError, match="report must be a report dict or a path"):
        plot_step_split(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="report has no 'phases'"):
        plot_step_split({})
    with pytest.raises(ValueError, match="max_bars must be a positive int, got 0"):
        plot_step_split(_report(), max_bars=0)
    figure = plot_step_split({"phases": list(PHASES), "rows": [], "summary": {}})  # empty run
    assert len(figure.axes) == 2


def test_format_table_with_ranks() -> None:
    summary = _report()["summary"]
    ranks = {p: [1.0, 3.0] for p in PHASES}
    table = format_table(summary, ranks, num_steps=10)
    lines = table.splitlines()
    assert lines[0] == "StepTimeProfiler: 10 steps after warm-up"
    assert "slowest rank" in lines[1]
    assert len([line for line in lines if line.split()[0] in PHASES]) == len(PHASES)
    assert lines[3].split()[-2:] == ["1", "3.00"]


# ---------------------------------------------------------------------------- real Trainer runs


class NoCudaEvents:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a CUDA event was created off CUDA")


@dataclass
class Run:
    profiler: StepTimeProfiler
    trainer: L.Trainer
    model: CostModel
    dataset: SleepyDataset
    root: Path

    @property
    def optimizer_costs_ms(self) -> list[float]:
        return self.trainer.optimizers[0].costs_ms


def fit(root: Path, callback: StepTimeProfiler, model: CostModel, num_workers: int = 0, **kwargs: Any) -> Run:
    trainer = make_trainer(root, callback, **kwargs)
    data = loader(num_workers)
    trainer.fit(model, data)
    return Run(callback, trainer, model, data.dataset, root)


@pytest.fixture(scope="module")
def serial_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One fit with num_workers=0 (the fetch costs 40 ms in the main process), 25 steps."""
    profiler = StepTimeProfiler(log_every_n_steps=1, isolated_optimizer_steps=3)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "Event", NoCudaEvents)
        return fit(tmp_path_factory.mktemp("serial"), profiler, CostModel())


@pytest.mark.slow
def test_medians_match_injected_costs(serial_run: Run) -> None:
    profiler = serial_run.profiler
    summary = profiler.summary()
    fetch = reference(serial_run.dataset.costs_ms, FETCH_MS, "fetch", group=BATCH_SIZE)
    forward = reference(serial_run.model.costs_ms, FORWARD_MS, "forward")
    optimizer = reference(serial_run.optimizer_costs_ms[:25], OPTIMIZER_MS, "optimizer")
    assert_close(summary["train_dataloader_next"]["median_ms"], fetch, "train_dataloader_next")
    assert_close(summary["forward"]["median_ms"], forward, "forward")
    assert_close(summary["optimizer_step"]["median_ms"], optimizer, "optimizer_step")
    assert_close(summary["step"]["median_ms"], fetch + forward + optimizer, "step")
    assert summary["backward"]["median_ms"] < 3.0 and summary["batch_to_device"]["median_ms"] < 3.0
    assert sum(summary[p]["share"] for p in SPLIT) == pytest.approx(1.0)
    # Every row adds up, and the warm-up rows are recorded but not summarised.
    rows = profiler.rows()
    assert len(rows) == 25 and [r["batch"] for r in rows] == list(range(25))
    for row in rows:
        assert sum(row[f"{p}_ms"] for p in SPLIT) == pytest.approx(row["step_ms"])
        assert row["optimizer_calls"] == 1
    assert summary["step"]["total_s"] == pytest.approx(sum(r["step_ms"] for r in rows[5:]) / 1e3)
    # The isolated optimiser step sleeps too: in-loop / isolated is near 1 (not starved).
    opt = summary["optimizer_step"]
    assert_close(opt["isolated_ms"], optimizer, "isolated optimizer step")
    assert opt["in_loop_over_isolated"] == pytest.approx(1.0, abs=0.15)


@pytest.mark.slow
def test_json_and_logged_metrics_match_summary(serial_run: Run) -> None:
    profiler, root = serial_run.profiler, serial_run.root
    assert profiler.report_paths == [root / "step_time.json", root / "step_time.png"]
    report = json.loads((root / "step_time.json").read_text())
    assert report["phases"] == list(PHASES) and report["ranks"] is None
    summary = profiler.summary()
    assert report["summary"].keys() == summary.keys()
    for phase, stats in summary.items():
        assert report["summary"][phase] == pytest.approx(stats)
    assert len(report["rows"]) == len(profiler.rows())
    for saved, row in zip(report["rows"], profiler.rows()):
        assert saved == pytest.approx(row)
    for phase in PHASES:  # the summary is recomputable from the JSON rows
        values = [row[f"{phase}_ms"] for row in report["rows"][report["warmup_steps"] :]]
        assert np.median(values) == pytest.approx(report["summary"][phase]["median_ms"])
    logger = serial_run.trainer.logger
    assert isinstance(logger, MemoryLogger)
    logged = [(step, m) for step, m in logger.logged if "step_time/step_ms" in m]
    assert len(logged) == 25
    for (step, metrics), row in zip(logged, profiler.rows()):
        assert step == row["global_step"] - 1  # Lightning's x for this batch's metrics
        assert metrics == pytest.approx({f"step_time/{p}_ms": row[f"{p}_ms"] for p in PHASES})
    for phase in PHASES:
        values = [m[f"step_time/{phase}_ms"] for _, m in logged[5:]]
        assert np.median(values) == pytest.approx(summary[phase]["median_ms"])
    assert (root / "step_time.png").stat().st_size > 1000


@pytest.mark.slow
def test_trainer_is_left_as_found(serial_run: Run) -> None:
    trainer = serial_run.trainer
    assert not isinstance(trainer.profiler, _TapProfiler)
    assert all(not opt._optimizer_step_post_hooks for opt in trainer.optimizers)


@pytest.mark.slow
def test_workers_that_keep_up_hide_the_fetch(tmp_path: Path) -> None:
    profiler = StepTimeProfiler(log_every_n_steps=0, save_plot=False)
    run = fit(tmp_path, profiler, CostModel(), num_workers=2, max_steps=30)
    summary = profiler.summary()
    # Two workers each make a batch per ~40 ms; the loop eats one per ~45 ms. What is left is
    # the hand-over (an fd fetched from the worker per tensor): under 10 % of the serial fetch.
    assert summary["train_dataloader_next"]["median_ms"] < 0.1 * FETCH_MS, summary["train_dataloader_next"]
    forward = reference(run.model.costs_ms, FORWARD_MS, "forward")
    assert_close(summary["forward"]["median_ms"], forward, "forward")
    optimizer = reference(run.optimizer_costs_ms, OPTIMIZER_MS, "optimizer")
    assert_close(summary["optimizer_step"]["median_ms"], optimizer, "optimizer_step")
    assert sum(summary[p]["share"] for p in SPLIT) == pytest.approx(1.0)


@pytest.mark.slow
def test_gradient_accumulation_and_a_user_profiler(tmp_path: Path) -> None:
    user_profiler = SimpleProfiler()
    profiler = StepTimeProfiler(warmup_steps=4, save_plot=False)
    run = fit(
        tmp_path, profiler, CostModel(), max_steps=10, accumulate_grad_batches=2, profiler=user_profiler
    )
    rows = profiler.rows()
    assert len(rows) == 20
    assert [r["optimizer_calls"] for r in rows] == [0, 1] * 10
    assert all(r["optimizer_step_ms"] == 0.0 for r in rows if not r["optimizer_calls"])
    summary = profiler.summary()
    optimizer = reference(run.optimizer_costs_ms, OPTIMIZER_MS, "optimizer", skip=2)
    assert_close(summary["optimizer_step"]["stepped_median_ms"], optimizer, "stepped median")
    assert_close(summary["optimizer_step"]["mean_ms"], OPTIMIZER_MS / 2, "mean over all batches")
    forward = reference(run.model.costs_ms, FORWARD_MS, "forward", skip=4)
    assert_close(summary["forward"]["median_ms"], forward, "forward")
    # The user's profiler still saw every action, the fetch included.
    assert run.trainer.profiler is user_profiler
    assert len(user_profiler.recorded_durations["[_TrainingEpochLoop].train_dataloader_next"]) >= 20


@pytest.mark.slow
def test_manual_optimisation(tmp_path: Path) -> None:
    profiler = StepTimeProfiler(save_plot=False)
    run = fit(tmp_path, profiler, CostModel(manual=True), max_steps=20)
    summary = profiler.summary()
    # forward is training_step less the backward and optimiser step nested in it
    forward = reference(run.model.costs_ms, FORWARD_MS, "forward")
    assert_close(summary["forward"]["median_ms"], forward, "forward")
    optimizer = reference(run.optimizer_costs_ms, OPTIMIZER_MS, "optimizer")
    assert_close(summary["optimizer_step"]["median_ms"], optimizer, "optimizer_step")
    fetch = reference(run.dataset.costs_ms, FETCH_MS, "fetch", group=BATCH_SIZE)
    assert_close(summary["train_dataloader_next"]["median_ms"], fetch, "train_dataloader_next")
    assert summary["backward"]["median_ms"] < 3.0
    assert all(row["optimizer_calls"] == 1 for row in profiler.rows())


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:You are using the `dataloader_iter` step flavor:UserWarning")
@pytest.mark.filterwarnings("ignore:Found `dataloader_iter` argument in the `training_step`:UserWarning")
def test_dataloader_iter_fetch_nested_in_training_step(tmp_path: Path) -> None:
    profiler = StepTimeProfiler(save_plot=False)
    run = fit(tmp_path, profiler, IteratorModel(), max_steps=20)
    summary = profiler.summary()
    fetch = reference(run.dataset.costs_ms, FETCH_MS, "fetch", group=BATCH_SIZE)
    assert_close(summary["train_dataloader_next"]["median_ms"], fetch, "train_dataloader_next")
    # the fetch inside training_step is not counted as forward
    forward = reference(run.model.costs_ms, FORWARD_MS, "forward")
    assert_close(summary["forward"]["median_ms"], forward, "forward")
    optimizer = reference(run.optimizer_costs_ms, OPTIMIZER_MS, "optimizer")
    assert_close(summary["optimizer_step"]["median_ms"], optimizer, "optimizer_step")


@pytest.mark.slow
def test_amp_scaler_skipped_steps_stay_sane(tmp_path: Path) -> None:
    # fp16 AMP is refused on CPU by the Trainer flag; the plugin with a CPU GradScaler runs the
    # same scaler.step path as on CUDA.
    # init_scale=1 so that only the injected inf losses skip steps (fp16 grads overflow at 2**16).
    amp = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=1.0))
    profiler = StepTimeProfiler(warmup_steps=0, save_plot=False)
    run = fit(tmp_path, profiler, CostModel(inf_every=3), max_steps=12, plugins=[amp])
    rows = profiler.rows()
    assert len(rows) == 12
    assert all(row["optimizer_calls"] == 1 for row in rows)  # on_before_optimizer_step runs either way
    # inf loss on every 3rd batch: the scaler skips optimizer.step (and its sleep)
    assert len(run.optimizer_costs_ms) == 8
    skipped = [row for row in rows if row["batch"] % 3 == 0]
    stepped = [row for row in rows if row["batch"] % 3 != 0]
    assert np.median([row["optimizer_step_ms"] for row in skipped]) < 3.0
    optimizer = reference(run.optimizer_costs_ms, OPTIMIZER_MS, "optimizer", skip=1)
    assert_close(float(np.median([row["optimizer_step_ms"] for row in stepped])), optimizer, "optimizer_step")
    # a skipped step's optimizer_step ends with Lightning's hook, not in `other`
    assert np.median([row["other_ms"] for row in skipped]) < 3.0
    for row in rows:
        assert sum(row[f"{p}_ms"] for p in SPLIT) == pytest.approx(row["step_ms"])


@pytest.mark.slow
def test_fewer_steps_than_warmup_warns_and_writes_nothing(tmp_path: Path) -> None:
    profiler = StepTimeProfiler(warmup_steps=5)
    with pytest.warns(UserWarning, match="3 training steps, not more than warmup_steps=5"):
        fit(tmp_path, profiler, CostModel(forward_ms=0.0), max_steps=3)
    assert profiler.summary() == {} and len(profiler.rows()) == 3
    assert not (tmp_path / "step_time.json").exists()


@pytest.mark.slow
def test_ddp_report_names_the_slowest_rank(tmp_path: Path) -> None:
    profiler = StepTimeProfiler(warmup_steps=3, save_plot=False)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_steps=10,
        callbacks=[profiler],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(CostModel(forward_ms=5.0, straggler_ms=20.0), loader())
    report = json.loads((tmp_path / "step_time.json").read_text())
    ranks = report["ranks"]
    forward = ranks["median_ms"]["forward"]
    assert len(forward) == 2 and ranks["slowest_rank"]["forward"] == 1
    assert forward[1] - forward[0] == pytest.approx(20.0, abs=6.0)
    # rank 0 waits for the straggler in backward's gradient all-reduce
    assert ranks["slowest_rank"]["backward"] == 0
    assert report["summary"]["forward"]["median_ms"] == pytest.approx(forward[0])


class _TransferCostDataModule(L.LightningDataModule):
    """A DataModule whose own on_before_batch_transfer takes 20 ms (Lightning names it apart)."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(SleepyDataset(item_ms=0.5), batch_size=BATCH_SIZE)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        sleep_ms(20.0)
        return batch


def test_datamodule_transfer_hook_counts_as_batch_to_device(tmp_path: Path) -> None:
    profiler = StepTimeProfiler(warmup_steps=3)
    make_trainer(tmp_path, profiler, max_steps=12).fit(CostModel(forward_ms=1.0), datamodule=_TransferCostDataModule())
    summary = profiler.summary()
    assert_close(summary["batch_to_device"]["median_ms"], 20.0, "batch_to_device")
    assert summary["other"]["median_ms"] < 5.0


def test_a_held_column_does_not_block_updates() -> None:
    acc = StepTimeAccumulator(warmup_steps=0)
    phases = {p: 1.0 for p in ("train_dataloader_next", "batch_to_device", "forward", "backward", "optimizer_step")}
    acc.update(10.0, phases)
    held = acc.column("forward_ms")
    acc.update(12.0, phases)
    assert len(held) == 1 and len(acc.column("forward_ms")) == 2 and len(acc) == 2
