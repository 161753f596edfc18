"""Draw a ``StepTimeProfiler`` report: the per-step split as stacked bars, the shares as one bar.

Works from the report dict (:meth:`~seg_datamodule.profiling.callback.StepTimeProfiler.report`) or the ``step_time.json`` it
writes, so a notebook can plot a finished run without the Trainer. Uses
``matplotlib.figure.Figure`` directly (no pyplot): no global figure state, no GUI backend, safe in
DataLoader workers and on headless machines; Jupyter displays the returned figure.
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_step_split"]

# One colour per phase, the same in every plot (matplotlib's tab10 order).
_COLORS = {
    "train_dataloader_next": "#d62728",
    "batch_to_device": "#9467bd",
    "device_work": "#e377c2",
    "forward": "#1f77b4",
    "backward": "#2ca02c",
    "optimizer_step": "#ff7f0e",
    "other": "#7f7f7f",
}


def _load(report: Mapping[str, Any] | str | os.PathLike) -> Mapping[str, Any]:
    if isinstance(report, (str, os.PathLike)):
        return json.loads(Path(report).read_text())
    if isinstance(report, Mapping):
        return report
    raise TypeError(f"report must be a report dict or a path to step_time.json, got {type(report).__name__}")


def _value(row: Mapping[str, Any], key: str) -> float:
    value = row.get(key)
    return 0.0 if value is None else float(value)


def plot_step_split(
    report: Mapping[str, Any] | str | os.PathLike,
    *,
    figure: Figure | None = None,
    max_bars: int = 400,
) -> Figure:
    """Plot where the step time goes.

    Left: one stacked bar per step (batch index on x, ms on y), one segment per phase other
    than ``step``; warm-up steps are shaded. Right: the phases' shares of the step as one
    stacked bar, plus the device's shares and its busy / idle split when the run was on CUDA.
    Above both, the report's ``verdict`` (:func:`~seg_datamodule.profiling.verdict.judge_step_time`)
    when it has one.

    Args:
        report: :meth:`~seg_datamodule.profiling.callback.StepTimeProfiler.report`, or the path of the ``step_time.json`` it wrote.
        figure (matplotlib.figure.Figure | None): draw into this (e.g. ``plt.figure()``); a new
            11 x 4.5 in figure when ``None``.
        max_bars (int): at most this many steps are drawn, evenly spaced over the run, so long
            runs stay legible; the share bar always covers every step past the warm-up.

    Returns:
        matplotlib.figure.Figure: the figure drawn into.

    Raises:
        TypeError: ``report`` is neither a mapping nor a path.
        ValueError: ``max_bars`` < 1, or the report has no ``phases``.
    """
    from matplotlib.colors import to_rgba
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    if isinstance(max_bars, bool) or not isinstance(max_bars, int) or max_bars < 1:
        raise ValueError(f"max_bars must be a positive int, got {max_bars!r}")
    data = _load(report)
    phases: Sequence[str] = data.get("phases") or ()
    if not phases:
        raise ValueError("report has no 'phases': pass StepTimeProfiler.report() or its step_time.json")
    split = [p for p in phases if p != "step"]
    rows: Sequence[Mapping[str, Any]] = data.get("rows") or []
    summary: Mapping[str, Mapping[str, Any]] = data.get("summary") or {}
    warmup = int(data.get("warmup_steps") or 0)

    fig = figure if figure is not None else Figure(figsize=(11, 4.5), layout="constrained")
    steps_ax, share_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [5, 1]})

    # 1. Per-step stacked bars.
    if rows:
        picked = np.unique(np.linspace(0, len(rows) - 1, min(max_bars, len(rows))).round().astype(int))
        x = np.array([_value(rows[i], "batch") for i in picked])
        alpha = np.where(picked < warmup, 0.35, 1.0)  # warm-up steps drawn faded
        bottom = np.zeros(len(picked))
        handles = []
        for phase in split:
            heights = np.array([_value(rows[i], f"{phase}_ms") for i in picked])
            color = _COLORS.get(phase, "0.5")
            steps_ax.bar(x, heights, bottom=bottom, width=1.0, color=[to_rgba(color, a) for a in alpha], linewidth=0)
            handles.append(Patch(color=color, label=phase))
            bottom += heights
        if warmup > 0:
            handles.append(Patch(color="0.5", alpha=0.35, label=f"faded: {warmup} warm-up steps"))
        steps_ax.set_xlim(x.min() - 0.5, x.max() + 0.5)
        steps_ax.legend(
            handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.15), ncol=4, frameon=False, fontsize="small"
        )
    else:
        steps_ax.text(0.5, 0.5, "no steps recorded", ha="center", va="center", transform=steps_ax.transAxes)
    steps_ax.set_xlabel("batch")
    steps_ax.set_ylabel("ms")
    steps_ax.set_title("step time by phase")

    # 2. Shares: host, and on CUDA the device and its busy / idle split.
    bars: list[tuple[str, list[tuple[str, float, str | None]]]] = []
    if summary:
        for name, key in (("host", "share"), ("device", "device_share")):
            if key in summary.get("step", {}):
                bars.append((name, [(p, float(summary[p].get(key) or 0.0), _COLORS.get(p)) for p in split]))
        if "device_busy_share" in summary.get("step", {}):
            busy = float(summary["step"]["device_busy_share"] or 0.0)
            bars.append(("busy", [("busy (lower bound)", busy, "0.25"), ("idle", 1.0 - busy, "0.85")]))
    for position, (name, parts) in enumerate(bars):
        bottom_share = 0.0
        for label, share, color in parts:
            share_ax.bar(position, share, bottom=bottom_share, color=color, width=0.7, linewidth=0)
            if share >= 0.04:
                share_ax.text(
                    position, bottom_share + share / 2, f"{share:.0%}", ha="center", va="center", fontsize="small"
                )
            bottom_share += share
    share_ax.set_xticks(range(len(bars)), [name for name, _ in bars])
    share_ax.set_ylim(0, 1)
    share_ax.set_title("share of step")
    if not bars:
        share_ax.text(0.5, 0.5, "no summary", ha="center", va="center", transform=share_ax.transAxes)

    # 3. The verdict, as the table ends with it.
    verdict = data.get("verdict")
    if verdict:
        text = textwrap.fill(f"verdict ({verdict['key']}): {verdict['sentence']}", width=150)
        fig.suptitle(text, x=0.01, ha="left", fontsize="small")
    return fig
