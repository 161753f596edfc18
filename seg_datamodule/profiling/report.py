"""The end-of-fit report: the console table (:func:`format_table`) and the JSON-safe report dict.

Works from summaries (:meth:`StepTimeAccumulator.compute`), so a notebook can format a finished
run's ``step_time.json`` without the Trainer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seg_datamodule.profiling.accumulator import PHASES
from seg_datamodule.profiling.plot import plot_step_split

__all__ = ["build_report", "format_table", "write_report"]


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
    rank_medians_ms: Mapping[str, Sequence[float]] | None = None,
    isolated_optimizer_ms: Sequence[float] | None = None,
) -> dict[str, Any]:
    """What ``step_time.json`` holds: ``phases``, ``warmup_steps``, ``summary``, ``ranks``, ``rows``.

    ``ranks`` is ``None`` on one process, else ``{"median_ms": {phase: [per rank]},
    "slowest_rank": {phase: rank}}``. NaN is written as ``null``.
    """
    ranks = None
    if rank_medians_ms is not None:
        ranks = {
            "median_ms": dict(rank_medians_ms),
            "slowest_rank": {p: _slowest(v) for p, v in rank_medians_ms.items()},
        }
    return _finite(
        {
            "phases": list(PHASES),
            "warmup_steps": warmup_steps,
            "summary": dict(summary),
            "ranks": ranks,
            "isolated_optimizer_ms": None if isolated_optimizer_ms is None else list(isolated_optimizer_ms),
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
) -> str:
    """The console table of a summary, with each phase's slowest rank under DDP.

    Args:
        summary: :meth:`StepTimeProfiler.summary` (or :meth:`StepTimeAccumulator.compute`).
        rank_medians_ms: per phase, each rank's median; adds "slowest rank" columns.
        num_steps: steps summarised, for the title.

    Returns:
        str: the table, one line per phase.
    """
    title = "StepTimeProfiler"
    if num_steps is not None:
        title += f": {num_steps} steps after warm-up"
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
    opt = summary["optimizer_step"]
    if "in_loop_over_isolated" in opt:
        lines.append(
            f"optimizer step: {opt['stepped_median_ms']:.2f} ms in the loop,"
            f" {opt['isolated_ms']:.2f} ms alone (x{opt['in_loop_over_isolated']:.2f})"
        )
    return "\n".join(lines)
