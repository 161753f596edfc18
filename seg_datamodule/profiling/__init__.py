"""Where the step time goes: a Lightning-free accumulator, phase timing, the callback, the report.

``accumulator`` (rows in, statistics out), ``timing`` (host clock and CUDA events), ``recorder``
(which hook opens and closes which phase), ``tap`` (the fetch, seen on the Trainer's profiler),
``optimizer`` (the optimiser step timed alone), ``report`` and ``plot`` (table, JSON, PNG),
``verdict`` (what the report says to do: rules over its figures), ``callback`` (the Lightning
adapter), ``end_of_fit`` (what it does once training stops), ``trainer_internals`` (its few
private reaches). Imports nothing from the data path.
"""

from seg_datamodule.profiling.accumulator import PHASES, StepLabels, StepTimeAccumulator
from seg_datamodule.profiling.callback import StepTimeProfiler
from seg_datamodule.profiling.optimizer import time_optimizer_step
from seg_datamodule.profiling.report import format_table
from seg_datamodule.profiling.plot import plot_step_split
from seg_datamodule.profiling.verdict import THRESHOLDS, judge_step_time

__all__ = [
    "PHASES",
    "THRESHOLDS",
    "StepLabels",
    "StepTimeAccumulator",
    "StepTimeProfiler",
    "format_table",
    "judge_step_time",
    "plot_step_split",
    "time_optimizer_step",
]
