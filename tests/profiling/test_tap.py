"""The fetch tap: forwards every call to the profiler it wraps, calls listeners around the fetch."""

from __future__ import annotations

from lightning.pytorch.profilers import PassThroughProfiler, SimpleProfiler

from seg_datamodule.profiling.tap import attach, detach

FETCH = "[_TrainingEpochLoop].train_dataloader_next"


class Listener:
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name = name
        self.calls = calls

    def on_fetch_start(self) -> None:
        self.calls.append(f"{self.name} start")

    def on_fetch_end(self) -> None:
        self.calls.append(f"{self.name} end")

    def on_device_work_start(self) -> None:
        self.calls.append(f"{self.name} device start")

    def on_device_work_end(self) -> None:
        self.calls.append(f"{self.name} device end")


def test_tap_forwards_and_calls_listeners_in_order() -> None:
    profiler = SimpleProfiler()
    calls: list[str] = []
    first, second = Listener("a", calls), Listener("b", calls)
    attach(profiler, first)
    attach(profiler, second)
    attach(profiler, first)  # idempotent
    profiler.start(FETCH)
    profiler.stop(FETCH)
    with profiler.profile("[Strategy]X.training_step"):  # any other action: not a fetch
        calls.append("body")
    with profiler.profile("[_EvaluationLoop].val_next"):
        pass
    assert calls == ["a start", "b start", "a end", "b end", "body"]
    assert isinstance(profiler, SimpleProfiler)
    assert len(profiler.recorded_durations[FETCH]) == 1  # the wrapped profiler still records
    assert len(profiler.recorded_durations["[Strategy]X.training_step"]) == 1
    detach(profiler, first)
    profiler.start(FETCH)
    profiler.stop(FETCH)
    assert calls[-2:] == ["b start", "b end"]
    detach(profiler, second)  # the last one out restores the class's methods
    assert not {"start", "stop", "_step_time_fetch_tap"} & set(vars(profiler))
    detach(profiler, second)  # already gone: nothing to do


def test_tap_sees_on_after_batch_transfer_of_the_datamodule_or_the_model() -> None:
    profiler = SimpleProfiler()
    calls: list[str] = []
    listener = Listener("a", calls)
    attach(profiler, listener)
    for action in ("[LightningDataModule]COCOSegDataModule.on_after_batch_transfer",
                   "[LightningModule]YolactLite.on_after_batch_transfer"):
        with profiler.profile(action):
            calls.append("hook")
    with profiler.profile("[LightningModule]YolactLite.transfer_batch_to_device"):  # the copy: not device work
        calls.append("copy")
    assert calls == ["a device start", "hook", "a device end"] * 2 + ["copy"]
    detach(profiler, listener)


def test_tap_restores_methods_a_user_set_on_the_instance() -> None:
    profiler = PassThroughProfiler()
    seen: list[str] = []
    profiler.start = seen.append  # a user's own instance-level wrapper
    attach(profiler, Listener("a", []))
    profiler.start(FETCH)
    assert seen == [FETCH]
    detach(profiler, profiler._step_time_fetch_tap.listeners[0])
    assert profiler.start == seen.append
