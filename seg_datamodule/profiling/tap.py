"""A Lightning profiler that forwards everything to the Trainer's and calls taps around chosen actions.

Lightning times the fetch with ``profiler.start/stop`` of
``[_TrainingEpochLoop].train_dataloader_next``; no public hook brackets it, so seeing the profiler's
calls is the only way to time it without patching a loop.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from typing import Any, Callable

from lightning.pytorch.profilers import Profiler

__all__ = ["_TapProfiler"]


class _TapProfiler(Profiler):
    """Forwards everything to the Trainer's profiler, calling taps around chosen actions.

    Lightning times the fetch with ``profiler.start/stop`` and hooks with ``profiler.profile``;
    installing this as ``trainer.profiler`` is the only way to see the fetch without patching a
    loop. Taps run inside the wrapped profiler's bracket, so its overhead is not in our phases.
    ``Profiler.__init__`` is deliberately not called: attributes not set here read through to
    the wrapped profiler.
    """

    def __init__(
        self,
        inner: Profiler,
        on_start: dict[str, Callable[[], None]],
        on_stop: dict[str, Callable[[], None]],
    ) -> None:
        self.inner = inner
        self._on_start = on_start
        self._on_stop = on_stop

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "_on_start", "_on_stop"):  # unpickling: not set yet
            raise AttributeError(name)
        return getattr(self.inner, name)

    def start(self, action_name: str) -> None:
        self.inner.start(action_name)
        tap = self._on_start.get(action_name)
        if tap is not None:
            tap()

    def stop(self, action_name: str) -> None:
        tap = self._on_stop.get(action_name)
        if tap is not None:
            tap()
        self.inner.stop(action_name)

    def profile(self, action_name: str) -> Any:
        if action_name in self._on_start or action_name in self._on_stop:
            return self._tapped(action_name)
        return self.inner.profile(action_name)

    @contextmanager
    def _tapped(self, action_name: str) -> Generator[str, None, None]:
        with self.inner.profile(action_name):
            tap = self._on_start.get(action_name)
            if tap is not None:
                tap()
            try:
                yield action_name
            finally:
                tap = self._on_stop.get(action_name)
                if tap is not None:
                    tap()

    def summary(self) -> str:
        return self.inner.summary()

    def describe(self) -> None:
        self.inner.describe()

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        self.inner.setup(stage, local_rank=local_rank, log_dir=log_dir)

    def teardown(self, stage: str | None) -> None:
        self.inner.teardown(stage)

    def __del__(self) -> None:
        # The base class tears down on deletion; the wrapped profiler is not ours to close.
        pass
