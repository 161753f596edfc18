"""The profiler tap: forwards every call to the wrapped profiler, taps in order."""

from __future__ import annotations

from lightning.pytorch.profilers import SimpleProfiler

from seg_datamodule.profiling.tap import _TapProfiler



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
