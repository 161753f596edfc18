"""What the step-time profiler does once training stops: the summary, the wall time, the report.

The callback (:class:`~seg_datamodule.profiling.callback.StepTimeProfiler`) hands over what it
collected (the accumulator's rows, a :class:`~seg_datamodule.profiling.report.FitFacts`); these
functions build the summary with the isolated optimiser timing, the wall-time account, time the
optimisers alone (with the loader's workers stopped) and print and write the report
(:mod:`~seg_datamodule.profiling.report`, :mod:`~seg_datamodule.profiling.plot`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from seg_datamodule.profiling.accumulator import StepTimeAccumulator
from seg_datamodule.profiling.optimizer import running_beside, time_optimizer_step
from seg_datamodule.profiling.report import FitFacts, build_report, format_table, write_report
from seg_datamodule.profiling.trainer_internals import shut_down_train_workers

__all__ = ["publish_report", "summary_with_isolated", "time_optimizers_alone", "wall_account"]


def summary_with_isolated(
    accumulator: StepTimeAccumulator, isolated_optimizer_ms: Sequence[float] | None
) -> dict[str, dict[str, float]]:
    """The accumulator's summary; with isolated timings, ``optimizer_step`` adds ``isolated_ms``
    (summed over optimisers) and ``in_loop_over_isolated`` (``stepped_median_ms / isolated_ms``)."""
    summary = accumulator.compute()
    if summary and isolated_optimizer_ms:
        isolated = float(sum(isolated_optimizer_ms))
        opt = summary["optimizer_step"]
        opt["isolated_ms"] = isolated
        opt["in_loop_over_isolated"] = opt["stepped_median_ms"] / isolated if isolated > 0 else math.nan
    return summary


def wall_account(train_s: float, accumulator: StepTimeAccumulator) -> dict[str, float]:
    """The report's ``wall``: ``train_s``, ``steps_s`` (every row, warm-up included), the rest."""
    steps_s = float(accumulator.column("step_ms", measured_only=False).sum()) / 1e3
    return {
        "train_s": train_s,
        "steps_s": steps_s,
        # Validation, checkpointing, logging, callbacks after the profiler, epoch starts: no step's.
        "between_steps_s": max(0.0, train_s - steps_s),
        "steps_share": steps_s / train_s if train_s > 0 else math.nan,
    }


def time_optimizers_alone(trainer: Trainer, steps: int) -> tuple[dict[str, Any], list[float] | None]:
    """Each optimiser's step timed alone (ms), after stopping the training loader's workers.

    The loader's workers would still prefetch beside the "alone" timing and hide the very
    starvation it is there to show (issue 12.2); Lightning stops them right after ``on_train_end``
    anyway (``fit_loop.teardown``), so stopping them first changes nothing else.

    Returns:
        (isolated_context, isolated_optimizer_ms): what ran beside the timing, and per optimiser
        its median, or ``None`` (warned) when an optimiser cannot be deep-copied (ZeRO, foreign
        types).
    """
    shut_down = shut_down_train_workers(trainer)
    context = {"loader_workers_shut_down": shut_down, **running_beside()}
    try:
        return context, [time_optimizer_step(opt, steps) for opt in trainer.optimizers]
    except Exception as error:
        rank_zero_warn(f"StepTimeProfiler: could not time the optimiser step in isolation: {error!r}")
        return context, None


def publish_report(
    summary: Mapping[str, Mapping[str, float]],
    rows: Sequence[Mapping[str, float | int]],
    warmup_steps: int,
    facts: FitFacts,
    *,
    dirpath: str | None,
    filename: str,
    save_plot: bool,
    show: Callable[[str], None] = rank_zero_info,
) -> list[Path]:
    """Print the table and write ``<filename>.json`` (and ``.png``) into ``dirpath``; rank 0 calls it.

    Nothing is reported (one line through ``show`` says so) for a fit of no more than ``warmup_steps`` steps,
    unless it stopped early after some: then the partial report has the rows. A fit an exception
    stopped before any step reports nothing and warns of nothing (the exception says what happened).
    ``show`` prints the table and the paths (the callback's goes through the progress bar).

    Returns:
        list[Path]: the files written, the JSON first (none without ``dirpath``).
    """
    steps = len(rows)
    if not summary and not (facts.stopped_by and steps):
        if facts.stopped_by:
            return []
        # One plain line: a short run on purpose (a smoke test, a docs example) is not a defect.
        show(f"StepTimeProfiler: {steps} training steps, not more than warmup_steps={warmup_steps}; nothing to report.")
        return []
    report = build_report(summary, rows, warmup_steps, facts)
    if summary:
        show(
            format_table(
                summary,
                facts.rank_medians_ms,
                steps - warmup_steps,
                wall=facts.wall,
                stopped_by=facts.stopped_by,
                isolated_context=facts.isolated_context,
                verdict=report["verdict"],
            )
        )
    if dirpath is None:
        return []
    paths = write_report(report, Path(dirpath), filename, save_plot)
    what = "partial report" if facts.stopped_by else "report"
    show(f"StepTimeProfiler: {what} written to " + ", ".join(map(str, paths)))
    return paths
