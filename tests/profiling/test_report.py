"""The report: the console table and the plot, from a summary or the JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from _profiling_doubles import SPLIT
from seg_datamodule.profiling import PHASES, StepTimeAccumulator, format_table, plot_step_split



def _report(steps: int = 12, device: bool = False) -> dict[str, Any]:
    acc = StepTimeAccumulator(warmup_steps=2)
    for i in range(steps):
        kwargs: dict[str, Any] = {}
        if device:
            kwargs = {"device_ms": {"forward": 8.0, "other": 2.0, "step": 10.0}, "device_busy_ms": 6.0}
        acc.update(20.0 + i, {"train_dataloader_next": 10.0 + i, "forward": 5.0}, **kwargs)
    return {"phases": list(PHASES), "warmup_steps": 2, "summary": acc.compute(), "rows": acc.rows()}


@pytest.mark.parametrize("device", [False, True])
def test_plot_step_split_from_dict_and_json(tmp_path: Path, device: bool) -> None:
    report = _report(device=device)
    figure = plot_step_split(report, max_bars=5)
    steps_ax, share_ax = figure.axes
    assert len(steps_ax.patches) == 5 * len(SPLIT)  # 5 bars of the 12 steps, one segment per phase
    assert len(share_ax.get_xticks()) == (3 if device else 1)  # host [, device, busy]
    path = tmp_path / "step_time.json"
    path.write_text(json.dumps(report))
    figure = plot_step_split(path)
    figure.savefig(tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_plot_step_split_rejects_bad_input() -> None:
    with pytest.raises(TypeError, match="report must be a report dict or a path"):
        plot_step_split(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="report has no 'phases'"):
        plot_step_split({})
    with pytest.raises(ValueError, match="max_bars must be a positive int, got 0"):
        plot_step_split(_report(), max_bars=0)
    figure = plot_step_split({"phases": list(PHASES), "rows": [], "summary": {}})  # empty run
    assert len(figure.axes) == 2


def test_format_table_with_ranks() -> None:
    summary = _report()["summary"]
    ranks = {p: [1.0, 3.0] for p in PHASES}
    table = format_table(summary, ranks, num_steps=10)
    lines = table.splitlines()
    assert lines[0] == "StepTimeProfiler: 10 steps after warm-up"
    assert "slowest rank" in lines[1]
    assert len([line for line in lines if line.split()[0] in PHASES]) == len(PHASES)
    assert lines[3].split()[-2:] == ["1", "3.00"]
