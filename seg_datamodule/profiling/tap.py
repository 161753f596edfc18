"""See Lightning's fetch and ``on_after_batch_transfer``: a tap on the Trainer's profiler for the
two phases no callback hook brackets.

Lightning waits for the next batch between ``profiler.start`` and ``profiler.stop`` of
``[_TrainingEpochLoop].train_dataloader_next`` (``loops/training_epoch_loop.py``), and runs the
DataModule's (or the model's) ``on_after_batch_transfer`` under
``[LightningDataModule]<class>.on_after_batch_transfer`` (``trainer/call.py``); no callback hook
runs around either. Every other phase comes from public hooks (see ``callback.py``).

The tap replaces ``start`` and ``stop`` on the profiler *instance* (the class is untouched), so
``trainer.profiler`` stays the user's object: ``isinstance(trainer.profiler, SimpleProfiler)``
holds and the user's profiler still records every action. One tap serves every listener on the
same profiler (two ``StepTimeProfiler`` callbacks both see the fetch); the last one to leave
restores the profiler as it was. The action's name is private to Lightning: the callback checks
that the fetch fires and warns when it does not.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["DEVICE_WORK_ACTION_SUFFIX", "FETCH_ACTION_SUFFIX", "FetchListener", "attach", "detach"]

#: Lightning's action is ``[<loop class>].train_dataloader_next``; the suffix survives a renamed loop.
FETCH_ACTION_SUFFIX = "].train_dataloader_next"
#: The DataModule's or the model's ``on_after_batch_transfer`` (``[LightningDataModule]<class>.<hook>``).
DEVICE_WORK_ACTION_SUFFIX = ".on_after_batch_transfer"
_TAP_ATTRIBUTE = "_step_time_fetch_tap"


class FetchListener(Protocol):
    def on_fetch_start(self) -> None: ...

    def on_fetch_end(self) -> None: ...

    def on_device_work_start(self) -> None: ...

    def on_device_work_end(self) -> None: ...


class _FetchTap:
    """Wraps one profiler instance's ``start`` / ``stop``; calls the listeners around the fetch."""

    def __init__(self, profiler: Any) -> None:
        self.profiler = profiler
        # What `start`/`stop` were on the instance before us (None: the class's), to restore.
        self.saved = {name: vars(profiler).get(name) for name in ("start", "stop")}
        self.inner_start = profiler.start
        self.inner_stop = profiler.stop
        self.listeners: list[FetchListener] = []

    def start(self, action_name: str) -> None:
        self.inner_start(action_name)
        # After the wrapped profiler's start, so its own overhead is not in the phase.
        if action_name.endswith(FETCH_ACTION_SUFFIX):
            for listener in self.listeners:
                listener.on_fetch_start()
        elif action_name.endswith(DEVICE_WORK_ACTION_SUFFIX):
            for listener in self.listeners:
                listener.on_device_work_start()

    def stop(self, action_name: str) -> None:
        if action_name.endswith(FETCH_ACTION_SUFFIX):
            for listener in self.listeners:
                listener.on_fetch_end()
        elif action_name.endswith(DEVICE_WORK_ACTION_SUFFIX):
            for listener in self.listeners:
                listener.on_device_work_end()
        self.inner_stop(action_name)

    def install(self) -> None:
        vars(self.profiler)[_TAP_ATTRIBUTE] = self
        self.profiler.start = self.start
        self.profiler.stop = self.stop

    def uninstall(self) -> None:
        state = vars(self.profiler)
        state.pop(_TAP_ATTRIBUTE, None)
        for name, saved in self.saved.items():
            if saved is None:
                state.pop(name, None)
            else:
                state[name] = saved


def attach(profiler: Any, listener: FetchListener) -> None:
    """Call ``listener.on_fetch_start/on_fetch_end`` around Lightning's fetch; idempotent."""
    tap = vars(profiler).get(_TAP_ATTRIBUTE)
    if tap is None:
        tap = _FetchTap(profiler)
        tap.install()
    if listener not in tap.listeners:
        tap.listeners.append(listener)


def detach(profiler: Any, listener: FetchListener) -> None:
    """Stop calling ``listener``; the last listener out restores the profiler's own methods."""
    tap = vars(profiler).get(_TAP_ATTRIBUTE)
    if tap is None:
        return
    if listener in tap.listeners:
        tap.listeners.remove(listener)
    if not tap.listeners:
        tap.uninstall()
