"""What a CLI run writes and prints unless told otherwise: its own folder only, and only what matters.

* :class:`RunFolderConfig`: the run's configuration is saved as ``config.yaml`` in the logger's
  folder of that run (``runs/coco/version_<N>/``, new for every run) and nowhere else. A run
  without a logger (``trainer.logger: false``) has no folder of its own, so it saves no config:
  Lightning would write it into ``default_root_dir``, the working directory unless set, over a
  user's own ``config.yaml``. A ``config.yaml`` already in the run's folder (a logger given a
  fixed ``version``) is never replaced: the run stops with a :class:`RunFolderError`.
* :func:`default_precision`: ``trainer.precision`` left unset is ``16-mixed`` where the run
  trains on a CUDA GPU and Lightning's ``32-true`` elsewhere (fp16 AMP does not exist on CPU:
  Lightning would warn and fall back to ``bf16-mixed``, which is slower than fp32 on most CPUs).
* :func:`quiet_console`: Lightning's advertising tips are dropped, and so are the third-party
  warnings a user can do nothing about (:data:`KNOWN_THIRD_PARTY_WARNINGS`, each with its cause).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback

from seg_datamodule.errors import UserInputError

__all__ = ["KNOWN_THIRD_PARTY_WARNINGS", "RunFolderConfig", "RunFolderError", "default_precision", "quiet_console"]

#: ``(message regex, category, why)`` of warnings raised inside other packages about their own code.
KNOWN_THIRD_PARTY_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    (r".*isinstance\(treespec, LeafSpec\).*", FutureWarning,
     "Lightning 2.6 calls a pytree API that torch 2.14 deprecates; nothing in the user's code"),
    (r"Your `IterableDataset` has `__len__` defined", UserWarning,
     "Lightning's generic doubt about any iterable dataset's length with workers; the streaming train "
     "loader's (LitData's) is per rank and worker shard, and its batches are tested to be each image once"),
)


class RunFolderError(UserInputError, FileExistsError):
    """A file the run would write is already there (from an earlier run), and nobody asked to replace it."""


class RunFolderConfig(SaveConfigCallback):
    """LightningCLI's config saving, into the run's own log folder only, never over a file.

    Raises:
        RunFolderError: at setup, when the run's folder already holds a ``config.yaml``.
    """

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        if not trainer.loggers:  # log_dir would be default_root_dir: not a folder of this run's own
            self.already_saved = True
            return
        path = Path(str(trainer.log_dir)) / self.config_filename
        exists = trainer.strategy.broadcast(path.is_file() if trainer.is_global_zero else False)
        if exists:
            raise RunFolderError(
                f"{path} exists (an earlier run's): a run saves its config only into a folder of its own; "
                "leave the logger's version unset (a new version_<N> per run), give it another one, or move the "
                "file away"
            )
        super().setup(trainer, pl_module, stage)


def default_precision(accelerator: Any) -> str | None:
    """``trainer.precision`` for a run that did not set it: ``"16-mixed"`` on a CUDA GPU, else ``None``.

    Args:
        accelerator: the config's ``trainer.accelerator`` (``"auto"``, ``"gpu"``, ``"cuda"``,
            ``"cpu"``, ... or an ``Accelerator``).

    Returns:
        ``"16-mixed"`` when the run will train on CUDA, ``None`` (Lightning's ``32-true``) otherwise.
    """
    name = accelerator if isinstance(accelerator, str) else type(accelerator).__name__.lower()
    cuda = name in ("auto", "gpu", "cuda") or name.startswith("cuda")
    return "16-mixed" if cuda and torch.cuda.is_available() else None


class _DropTips(logging.Filter):
    """Drops Lightning's "💡 Tip: ... try installing ..." advertisements (rank_zero_info lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).lstrip().startswith("💡 Tip")


def quiet_console() -> None:
    """Drop Lightning's tips and :data:`KNOWN_THIRD_PARTY_WARNINGS` for this process (the CLI's)."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropTips) for f in logger.filters):
            logger.addFilter(_DropTips())
    for message, category, _why in KNOWN_THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
