"""Where the run pictures are drawn and written: one background thread per fit (``PictureWriter``).

The training loop only hands over host copies (:func:`host_copy`) and a function that draws; the
thread draws, writes the file into the run folder and gives it to the loggers that take images
(TensorBoard's ``SummaryWriter.add_image``, which queues its events and is safe off the main
thread). :meth:`PictureWriter.finish` waits for what is pending; a picture that fails is one line.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import cv2
import numpy as np
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from seg_datamodule.structures import DetectionBatch

__all__ = ["DrawingCallback", "PictureWriter", "host_copy", "run_folder", "write_picture"]


def run_folder(trainer: Trainer) -> Path | None:
    """``trainer.log_dir`` on rank 0 when the Trainer has a logger, else None. Every rank must call it
    (under DDP ``log_dir`` is a collective)."""
    folder = trainer.log_dir if trainer.loggers else None
    return Path(folder) if folder is not None and trainer.is_global_zero else None


def host_copy(batch: DetectionBatch, max_images: int) -> DetectionBatch:
    """The first ``max_images`` images of ``batch`` and their targets, on the host (a drawing's input)."""
    counts = batch.boxes_per_image[:max_images].cpu()
    n = int(counts.sum())
    return dataclasses.replace(
        batch, images=batch.images[:max_images].cpu(), boxes=batch.boxes[:n].cpu(), labels=batch.labels[:n].cpu(),
        masks=batch.masks[:n].cpu(), boxes_per_image=counts, image_ids=batch.image_ids[:max_images].cpu(),
        annotation_ids=batch.annotation_ids[:n].cpu(), ignore_masks=batch.ignore_masks[:max_images].cpu(),
        scales=batch.scales[:max_images].cpu(), pads=batch.pads[:max_images].cpu(),
        orig_sizes=batch.orig_sizes[:max_images].cpu(),
        origins=None if batch.origins is None else batch.origins[:n].cpu(), counts=None)


def write_picture(path: Path, rgb: np.ndarray) -> Path:
    """Write an RGB picture (JPEG quality 90 without chroma subsampling, so thin coloured outlines
    and class names stay legible; PNG by the suffix)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    params = [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444] \
        if path.suffix == ".jpg" else []
    if not cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), params):
        raise OSError(f"could not write {path}")
    return path


class PictureWriter:
    """Draw, write and log pictures on one background thread.

    Args:
        folder: the run folder.
        trainer: its loggers that take images (``experiment.add_image``) get each picture.
    """

    def __init__(self, folder: Path, trainer: Trainer) -> None:
        self.folder = folder
        self.drawing_seconds = 0.0  # CPU time of the thread: the pictures' cost beside the training loop
        self._experiments = [lg.experiment for lg in trainer.loggers if hasattr(lg.experiment, "add_image")]
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="run-pictures")
        self._pending: list[Future] = []

    def submit(self, name: str, draw: Callable[[], np.ndarray], step: int = 0) -> None:
        """Draw ``draw()`` into ``folder / name`` and log it as ``data/<stem>`` at ``step``."""
        path = self.folder / name

        def job() -> Path:
            start = time.thread_time()
            rgb = draw()
            write_picture(path, rgb)
            for experiment in self._experiments:
                experiment.add_image(f"data/{path.stem}", rgb, global_step=step, dataformats="HWC")
            self.drawing_seconds += time.thread_time() - start  # one thread: no race
            return path

        self._pending.append(self._pool.submit(job))

    def finish(self) -> list[Path]:
        """Wait for every picture submitted; return the files written, in order (each once)."""
        written: list[Path] = []
        for future in self._pending:
            try:
                path = future.result()
            except Exception as error:  # a picture is never worth a stopped fit
                rank_zero_info(f"seg_datamodule: a run picture was not drawn: {error!r}")
                continue
            if path not in written:
                written.append(path)
        self._pending = []
        self._pool.shutdown(wait=True)
        return written


class DrawingCallback(Callback):
    """What :class:`~seg_datamodule.pictures.callback.FitPictures` and
    :class:`~seg_datamodule.pictures.validation.ValPictures` share: a :class:`PictureWriter` while
    a fit runs, the files it wrote (``paths``) and its thread's CPU time (``drawing_seconds``),
    waited for at the end of fit or on an exception."""

    def __init__(self) -> None:
        self.paths: list[Path] = []  # the files written, in order
        self.drawing_seconds = 0.0
        self._writer: PictureWriter | None = None

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._finish()

    def _finish(self) -> None:
        if self._writer is not None:
            self.paths += self._writer.finish()
            self.drawing_seconds += self._writer.drawing_seconds
            self._writer = None
