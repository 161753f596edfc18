"""The end-of-fit report: the console table (:func:`format_table`) and the JSON-safe report dict.

Works from summaries (:meth:`~seg_datamodule.profiling.accumulator.StepTimeAccumulator.compute`), so a notebook can format a finished
run's ``step_time.json`` without the Trainer.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seg_datamodule.profiling.accumulator import PHASES
from seg_datamodule.profiling.plot import plot_step_split
from seg_datamodule.profiling.verdict import judge_step_time

__all__ = ["FitFacts", "build_report", "format_table", "write_report"]


@dataclass(frozen=True)
class FitFacts:
    """What a fit measured beside its per-step rows: the report's figures other than the summary.

    Attributes:
        rank_medians_ms: per phase, each rank's median (ms), gathered under DDP; ``None`` on one
            process.
        isolated_optimizer_ms: per optimiser, the median of its step timed alone (ms); ``None``
            when not measured.
        isolated_context: what ran beside that timing (threads, child processes, whether the
            loader's workers were shut down first).
        wall: ``train_s``, ``steps_s``, ``between_steps_s``, ``steps_share``.
        stopped_by: the exception that ended the fit early, or ``None``.
        loader: the train loader's ``num_workers``, ``batch_size``, ``pin_memory`` and ``cores``.
    """

    rank_medians_ms: Mapping[str, Sequence[float]] | None = None
    isolated_optimizer_ms: Sequence[float] | None = None
    isolated_context: Mapping[str, Any] | None = None
    wall: Mapping[str, float] | None = None
    stopped_by: str | None = None
    loader: Mapping[str, Any] | None = None


_NO_FACTS = FitFacts()


def _slowest(medians: Sequence[float]) -> int | None:
    values = np.asarray(medians, dtype=np.float64)
    if not np.isfinite(values).any():
        return None
    return int(np.nanargmax(values))


def _finite(value: Any) -> Any:
    """Replace NaN and infinities with None, recursively, so the JSON is standard."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def build_report(
    summary: Mapping[str, Mapping[str, float]],
    rows: Sequence[Mapping[str, float | int]],
    warmup_steps: int,
    facts: FitFacts = _NO_FACTS,
) -> dict[str, Any]:
    """What ``step_time.json`` holds, NaN written as ``null``.

    Keys: ``phases``; ``warmup_steps``; ``partial`` (bool: the fit stopped early) and
    ``stopped_by`` (the exception, or None); ``summary`` (per phase, over the steps after the
    warm-up); ``wall`` (``train_s`` from the start to the end of training, ``steps_s`` in steps,
    warm-up included, ``between_steps_s`` in none: validation, checkpointing, logging, epoch
    starts; ``steps_share``), so the phases' shares can be read against wall time; ``ranks``
    (``None`` on one process, else ``{"median_ms": {phase: [per rank]}, "slowest_rank": {phase:
    rank}}``); ``isolated_optimizer_ms`` and ``isolated_context`` (what ran beside that timing);
    ``loader`` (what the callback saw of the train loader: ``num_workers``, ``batch_size``,
    ``pin_memory``, ``cores``); ``verdict``
    (:func:`~seg_datamodule.profiling.verdict.judge_step_time` over the summary, the wall time,
    the loader and the isolated context; ``None`` for an empty summary); ``rows`` (every step).

    Args:
        summary: :meth:`~seg_datamodule.profiling.callback.StepTimeProfiler.summary`.
        rows: every step's row, warm-up included.
        warmup_steps: the steps left out of the summary.
        facts: what the fit measured beside the rows (:class:`FitFacts`).
    """
    ranks = None
    if facts.rank_medians_ms is not None:
        ranks = {
            "median_ms": dict(facts.rank_medians_ms),
            "slowest_rank": {p: _slowest(v) for p, v in facts.rank_medians_ms.items()},
        }
    return _finite(
        {
            "phases": list(PHASES),
            "warmup_steps": warmup_steps,
            "partial": facts.stopped_by is not None,
            "stopped_by": facts.stopped_by,
            "summary": dict(summary),
            "wall": None if facts.wall is None else dict(facts.wall),
            "ranks": ranks,
            "isolated_optimizer_ms": None if facts.isolated_optimizer_ms is None else list(facts.isolated_optimizer_ms),
            "isolated_context": None if facts.isolated_context is None else dict(facts.isolated_context),
            "loader": None if facts.loader is None else dict(facts.loader),
            "verdict": judge_step_time(
                summary, wall=facts.wall, loader=facts.loader, isolated_context=facts.isolated_context
            ),
            "rows": list(rows),
        }
    )


def write_report(report: Mapping[str, Any], dirpath: Path, filename: str, save_plot: bool) -> list[Path]:
    """Write ``<filename>.json`` (and ``<filename>.png`` with ``save_plot``) into ``dirpath``.

    Returns:
        list[Path]: the files written, the JSON first.
    """
    dirpath.mkdir(parents=True, exist_ok=True)
    json_path = dirpath / f"{filename}.json"
    json_path.write_text(json.dumps(report, indent=1))
    paths = [json_path]
    if save_plot:
        figure = plot_step_split(report)
        png_path = dirpath / f"{filename}.png"
        figure.savefig(png_path, dpi=100)
        paths.append(png_path)
    return paths


def format_table(
    summary: Mapping[str, Mapping[str, float]],
    rank_medians_ms: Mapping[str, Sequence[float]] | None = None,
    num_steps: int | None = None,
    *,
    wall: Mapping[str, float] | None = None,
    stopped_by: str | None = None,
    isolated_context: Mapping[str, Any] | None = None,
    verdict: Mapping[str, Any] | None = None,
) -> str:
    """The console table of a summary, with each phase's slowest rank under DDP.

    Args:
        summary: :meth:`~seg_datamodule.profiling.callback.StepTimeProfiler.summary` (or :meth:`~seg_datamodule.profiling.accumulator.StepTimeAccumulator.compute`).
        rank_medians_ms: per phase, each rank's median; adds "slowest rank" columns.
        num_steps: steps summarised, for the title.
        wall: the report's ``wall``; adds the line of time in steps against time between them.
        stopped_by: the exception that ended the fit early; marks the table partial.
        isolated_context: the report's ``isolated_context``; says what ran beside the
            isolated optimiser timing.
        verdict: the report's ``verdict``
            (:func:`~seg_datamodule.profiling.verdict.judge_step_time`); adds it, and the other
            findings that fired, as the last lines.

    Returns:
        str: the table, one line per phase.
    """
    title = "StepTimeProfiler"
    if num_steps is not None:
        title += f": {num_steps} steps after warm-up"
    if stopped_by is not None:
        title += f" (PARTIAL: the fit stopped early, {stopped_by})"
    header = f"{'phase':<22} {'median ms':>10} {'mean ms':>10} {'p90 ms':>10} {'total s':>9} {'share':>7}"
    device = "device_median_ms" in summary.get("step", {})
    if device:
        header += f" {'device ms':>10} {'dev share':>9}"
    if rank_medians_ms is not None:
        header += f" {'slowest rank':>12} {'its median':>10}"
    lines = [title, header, "-" * len(header)]
    for phase in PHASES:
        s = summary[phase]
        line = (
            f"{phase:<22} {s['median_ms']:>10.2f} {s['mean_ms']:>10.2f} {s['p90_ms']:>10.2f}"
            f" {s['total_s']:>9.2f} {s['share']:>7.1%}"
        )
        if device:
            line += f" {s['device_median_ms']:>10.2f} {s['device_share']:>9.1%}"
        if rank_medians_ms is not None:
            medians = rank_medians_ms[phase]
            rank = _slowest(medians)
            slowest = math.nan if rank is None else medians[rank]
            line += f" {'-' if rank is None else rank:>12} {slowest:>10.2f}"
        lines.append(line)
    step = summary["step"]
    if "device_busy_share" in step:
        lines.append(
            f"accelerator busy >= {step['device_busy_share']:.1%} of the step,"
            f" idle <= {step['device_idle_share']:.1%}"
        )
    if wall is not None:
        lines.append(
            f"wall: {wall['train_s']:.2f} s of training, {wall['steps_s']:.2f} s in steps"
            f" ({wall['steps_share']:.1%}), {wall['between_steps_s']:.2f} s between steps"
            " (validation, checkpointing, logging, epoch starts)"
        )
    opt = summary["optimizer_step"]
    if "in_loop_over_isolated" in opt:
        line = (
            f"optimizer step: {opt['stepped_median_ms']:.2f} ms in the loop,"
            f" {opt['isolated_ms']:.2f} ms alone (x{opt['in_loop_over_isolated']:.2f})"
        )
        if isolated_context is not None:
            threads = isolated_context.get("threads", [])
            line += (
                f"; alone beside {len(threads)} other threads and"
                f" {isolated_context.get('child_processes', 0)} child processes"
            )
            if not isolated_context.get("loader_workers_shut_down", False):
                line += " (the loader's workers could not be stopped first)"
        lines.append(line)
    if verdict is not None:
        lines.append(textwrap.fill(f"verdict ({verdict['key']}): {verdict['sentence']}", 100, subsequent_indent="  "))
        for finding in verdict.get("also", ()):
            text = f"also ({finding['key']}): {finding['sentence']}"
            lines.append(textwrap.fill(text, 100, initial_indent="  ", subsequent_indent="    "))
    return "\n".join(lines)
