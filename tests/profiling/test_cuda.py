"""The real CUDA-event path (run where CUDA is available; the fakes in test_timing.py elsewhere).

Checks that events are created at every boundary, recorded on the *current* stream, read only
once the device has passed them (never with a blocking wait while a step is young), and that the
busy share is the busy time divided by the device's span of the step.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

from _profiling_doubles import MemoryLogger
from seg_datamodule.profiling import StepTimeAccumulator, StepTimeProfiler
from seg_datamodule.profiling.recorder import StepRecorder, step_metrics
from seg_datamodule.profiling.timing import CudaMarks, PhaseTimer

pytestmark = pytest.mark.needs("cuda")

# torch.cuda._sleep spins the device for a number of cycles: device work of a known order whose
# host-side launch is instant. Calibrated per test against events, never a nominal duration.
_CYCLES = 50_000_000


def _device_ms(cycles: int) -> float:
    """What ``torch.cuda._sleep(cycles)`` takes on this device, by events around it."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def test_marks_record_on_the_current_stream() -> None:
    marks = CudaMarks(torch.device("cuda"))
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(_CYCLES)
        event = marks.record()  # behind the side stream's work, not on the idle default stream
    assert isinstance(event, torch.cuda.Event)
    assert not event.query()
    side.synchronize()
    assert event.query()


def test_rows_are_read_only_after_the_device_passed_them() -> None:
    device = torch.device("cuda")
    sleep_ms = _device_ms(_CYCLES)
    marks = CudaMarks(device)
    marks.reanchor()
    accumulator = StepTimeAccumulator(warmup_steps=0)
    recorder = StepRecorder(accumulator, PhaseTimer(marks=marks))
    recorder.fetch_start()
    recorder.fetch_end()
    recorder.batch_start()
    torch.cuda._sleep(_CYCLES)  # "forward": launched at once, runs on the device for sleep_ms
    recorder.before_backward(automatic=True)
    recorder.after_backward()
    recorder.batch_end(batch=0, epoch=0, global_step=0)
    record = recorder.pending[0]
    # one event per boundary: open, fetch in/out, transfer in/out, forward in/out, backward in/out, close
    assert len(record.events) == len(record.host) == 10
    assert all(isinstance(e, torch.cuda.Event) for e in record.events)
    assert not record.ready()  # the device is still in the forward's work
    assert recorder.drain() == [] and len(accumulator) == 0  # not read before the device is there
    torch.cuda.synchronize(device)
    assert record.ready()
    (row, _, _), = recorder.drain()
    # The host launched the work in no time; the device spent it in the forward.
    assert row["forward_ms"] < 0.5 * sleep_ms
    assert row["device_forward_ms"] == pytest.approx(sleep_ms, rel=0.2)
    assert row["device_step_ms"] >= row["device_forward_ms"]
    # busy: from when all of the forward's work was queued to when the device finished it
    assert 0.0 <= row["device_busy_ms"] <= row["device_step_ms"] + 1e-6
    assert row["device_busy_ms"] >= 0.8 * sleep_ms
    metrics = step_metrics([row])
    assert metrics["step_time/device_busy_share"] == pytest.approx(row["device_busy_ms"] / row["device_step_ms"])
    summary = accumulator.compute()
    assert summary["step"]["device_busy_share"] == pytest.approx(
        min(1.0, row["device_busy_ms"] / row["device_step_ms"])
    )


class GpuModel(L.LightningModule):
    """A forward that keeps the device busy for a known number of cycles."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        torch.cuda._sleep(_CYCLES // 5)
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_gpu_fit_logs_device_phases_per_step(tmp_path: Path) -> None:
    logger = MemoryLogger(tmp_path)
    profiler = StepTimeProfiler(warmup_steps=2, log_every_n_steps=1, save_plot=False)
    trainer = L.Trainer(
        accelerator="gpu", devices=1, max_steps=12, callbacks=[profiler], logger=logger,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    data = torch.utils.data.DataLoader(torch.randn(64, 8), batch_size=4)
    trainer.fit(GpuModel(), data)
    rows = profiler.rows()
    assert len(rows) == 12 and all("device_step_ms" in r for r in rows)
    logged = [m for _, m in logger.logged if "step_time/device_step_ms" in m]
    assert len(logged) == 12
    for metrics, row in zip(logged, rows):
        assert metrics["step_time/device_busy_share"] == pytest.approx(row["device_busy_ms"] / row["device_step_ms"])
        assert 0.0 <= metrics["step_time/device_busy_share"] <= 1.0 + 1e-6
    summary = profiler.summary()
    assert summary["forward"]["device_median_ms"] > summary["backward"]["device_median_ms"]
    assert 0.0 < summary["step"]["device_busy_share"] <= 1.0
