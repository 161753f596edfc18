"""``InterruptCheckpoint``: a checkpoint to resume from when ``fit`` stops on Ctrl-C or an exception.

``ModelCheckpoint`` saves every N steps, so a run stopped between two saves loses up to N steps.
Lightning calls ``on_exception`` for Ctrl-C (``KeyboardInterrupt``, after its "attempting graceful
shutdown") and for any exception raised in ``fit``; this callback then saves the run where it
stopped, as Lightning's ``OnExceptionCheckpoint`` does, but into the run's own checkpoint folder
(that of its ``ModelCheckpoint``, ``runs/coco/version_<N>/checkpoints/``: nothing to configure,
nothing shared with another run) and only when there is something to resume (a ``fit`` that took
an optimiser step). It is not an ``OnExceptionCheckpoint``: with one of those among the callbacks,
Lightning turns every ``fit`` without ``ckpt_path`` into ``ckpt_path="last"`` (with a warning, and a
second one when there is no such checkpoint), so a fresh run could resume an older one. Nor a
``Checkpoint``: it works beside ``enable_checkpointing=False`` too. Resumed from it, the train loader continues at the batch the stopped step
was training on (:class:`~seg_datamodule.data.loaders.resume.ResumableDataLoader` counts the batches
the Trainer finished, so the interrupted one is trained again).

Under DDP it saves on Ctrl-C (every rank gets it) but not on an exception, which may have
stopped one rank only: a save is collective and would wait for the others forever.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from seg_datamodule.console import print_summary

__all__ = ["InterruptCheckpoint"]


class InterruptCheckpoint(Callback):
    """Save ``<dirpath>/<filename>.ckpt`` when ``fit`` stops on Ctrl-C or an exception.

    Args:
        dirpath (str | None): where to save; ``None`` (default) is the run's checkpoint folder,
            resolved when training starts: that of the Trainer's ``ModelCheckpoint``, else
            ``<log_dir>/checkpoints``.
        filename (str): the file name without ``.ckpt`` (default ``"interrupted"``).

    Attributes:
        saved (str | None): the checkpoint this run wrote, once it did.
    """

    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: str | None = None, filename: str = "interrupted") -> None:
        super().__init__()
        if dirpath is not None and not isinstance(dirpath, (str, os.PathLike)):
            raise TypeError(f"dirpath must be a folder path or None, got {dirpath!r}")
        if not isinstance(filename, str) or not filename or os.sep in filename:
            raise ValueError(f"filename must be a non-empty file name without a folder, got {filename!r}")
        self.dirpath = None if dirpath is None else os.fspath(dirpath)  # None: resolved when training starts
        self.filename = filename
        self.saved: str | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Here, where every rank comes: trainer.log_dir is a collective under DDP, and on_exception
        # may be reached by the failing rank alone.
        if self.dirpath is None:
            folder = getattr(trainer.checkpoint_callback, "dirpath", None)  # resolved in its setup
            if folder is None:
                folder = os.path.join(trainer.log_dir or trainer.default_root_dir, "checkpoints")
            self.dirpath = str(folder)

    @property
    def ckpt_path(self) -> str | None:
        """The checkpoint's path (``None`` until its folder is known, at the start of training)."""
        return None if self.dirpath is None else os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if trainer.state.fn != "fit" or trainer.global_step == 0 or self.dirpath is None:
            return  # nothing trained yet: resuming would gain nothing
        if trainer.world_size > 1 and not isinstance(exception, KeyboardInterrupt):
            return  # the other ranks may never reach the save's collectives
        try:
            trainer.save_checkpoint(self.ckpt_path)
        except Exception as error:  # never hide the exception being handled
            rank_zero_warn(f"InterruptCheckpoint: could not save {self.ckpt_path}: {error!r}")
            return
        self.saved = self.ckpt_path
        print_summary(trainer, f"{type(exception).__name__} at step {trainer.global_step}: saved {self.saved}; "
                               f"resume with --ckpt_path {self.saved}")

    def teardown(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        # A fit that raised, then was run again to its end by the same Trainer: its checkpoint is
        # stale. Only what this callback wrote is removed.
        if self.saved is not None:
            trainer.strategy.remove_checkpoint(self.saved)
            self.saved = None
