"""Where the step time goes: a Lightning-free accumulator, phase timing, the callback, the report.

Imports nothing from the data path.
"""

from seg_datamodule.profiling.callback import PHASES, StepTimeAccumulator, StepTimeProfiler, format_table
from seg_datamodule.profiling.plot import plot_step_split

__all__ = ["PHASES", "StepTimeAccumulator", "StepTimeProfiler", "format_table", "plot_step_split"]
