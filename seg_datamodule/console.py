"""Printing a run's summaries (per-epoch AP, the end-of-fit reports) beside Lightning's progress bar.

A line printed or logged while tqdm draws its bar lands inside the bar (``[AEpoch 0: 100%|...
epoch 0: COCO val segm AP ...``). :func:`print_summary` goes through the bar instead: with
Lightning's tqdm bar, ``tqdm.write`` clears every live bar, writes the text and draws them again
(and simply prints once the bars are closed); another enabled bar prints with its own ``print``;
without a bar (``enable_progress_bar: false``) or a Trainer the text is logged with
``rank_zero_info``, as before. Only rank 0 prints.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.utilities.rank_zero import rank_zero_info

__all__ = ["print_summary"]


def print_summary(trainer: Any, text: str) -> None:
    """Print ``text`` once, on rank 0, without garbling the trainer's progress bar.

    Args:
        trainer: the ``Trainer`` (``None`` outside one: the text is logged).
        text: one or more lines.
    """
    bar = None if trainer is None else getattr(trainer, "progress_bar_callback", None)
    if bar is None or not bar.is_enabled:
        rank_zero_info(text)
        return
    if not trainer.is_global_zero:
        return
    if isinstance(bar, TQDMProgressBar):
        from tqdm import tqdm

        tqdm.write(text)
    else:
        bar.print(text)
