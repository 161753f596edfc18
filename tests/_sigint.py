"""``SigintAt``: a real Ctrl-C for tests of a CLI run, sent by the run to itself when a step starts.

Added to a run with ``--trainer.callbacks+=_sigint.SigintAt`` (``tests/`` on ``PYTHONPATH``); the
step comes from ``$SIGINT_AT_STEP``, so a run resumed from the saved ``config.yaml`` without it
is not interrupted again.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from lightning.pytorch import Callback, Trainer


class SigintAt(Callback):
    """Sends SIGINT to this process when training step ``$SIGINT_AT_STEP`` starts (never without it)."""

    def __init__(self) -> None:
        self.step = int(os.environ.get("SIGINT_AT_STEP", "-1"))

    def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)
