"""Lightning's hook order, on which the phase split rests, is checked per step: the first hook
out of order under automatic optimisation is kept for the one warning; manual optimisation, whose
backward and optimiser steps come inside training_step in any number, is not judged."""

from __future__ import annotations

from seg_datamodule.profiling.accumulator import StepTimeAccumulator
from seg_datamodule.profiling.recorder import StepRecorder
from seg_datamodule.profiling.timing import PhaseTimer


def _recorder() -> StepRecorder:
    return StepRecorder(StepTimeAccumulator(warmup_steps=0), PhaseTimer())


def _step(recorder: StepRecorder, events: list[str], automatic: bool = True, batch: int = 0) -> None:
    recorder.fetch_start()
    recorder.fetch_end()
    recorder.batch_start(automatic)
    for event in events:
        if event == "before_backward":
            recorder.before_backward(automatic)
        elif event == "before_optimizer_step":
            recorder.before_optimizer_step(automatic)
        else:
            getattr(recorder, event)()
    recorder.batch_end(batch=batch, epoch=0, global_step=batch)


LIGHTNING = ["before_backward", "after_backward", "before_optimizer_step", "optimizer_step_end"]


def test_lightnings_order_and_its_shorter_forms_pass() -> None:
    recorder = _recorder()
    for k, events in enumerate([LIGHTNING, LIGHTNING[:2], LIGHTNING[2:], [], LIGHTNING]):
        _step(recorder, events, batch=k)  # full, accumulating, training_step returned None, nothing
    assert recorder.hook_order_problem is None and len(recorder.pending) == 5


def test_an_optimiser_step_before_the_backward_is_named() -> None:
    recorder = _recorder()
    _step(recorder, LIGHTNING)
    _step(recorder, ["before_optimizer_step", "optimizer_step_end", "before_backward", "after_backward"], batch=1)
    assert recorder.hook_order_problem == "on_before_backward came after optimizer step post hook in one step"


def test_a_second_backward_in_an_automatic_step_is_named() -> None:
    recorder = _recorder()
    _step(recorder, LIGHTNING[:2] + LIGHTNING)
    assert recorder.hook_order_problem == "on_before_backward came after on_after_backward in one step"


def test_manual_optimisation_is_not_judged() -> None:
    recorder = _recorder()
    _step(recorder, LIGHTNING + LIGHTNING, automatic=False)
    assert recorder.hook_order_problem is None
