"""Pictures of the data at fit start, in the run folder and the logger: ``FitPictures``.

At the start of every fit, rank 0 writes into the run's log folder (``trainer.log_dir``; nothing
without a logger):

- ``labels_<split>.png`` for the training and validation splits: :func:`~seg_datamodule.pictures.labels.label_figure`
  of the split's index (class counts, instances per image, COCO object sizes, box sizes and centres);
- ``train_batch0.jpg`` .. ``train_batch2.jpg``: the first training batches as the model gets them
  (after the DataModule's device-side HSV jitter), masks, boxes and class names drawn, copies
  pasted by copy-paste outlined in white and marked ``P``, MixUp's instances marked ``M``.

A logger that takes images gets them too (TensorBoard: ``add_image`` under ``data/``); CSV and
others keep the files. The drawing runs on one background thread
(:class:`~seg_datamodule.pictures.writer.PictureWriter`): the training loop only copies each batch
to host memory, so the first step is not held up by the drawing (the files appear a moment later;
the end of fit waits for them). The DataModule's ``plots`` key (the default) adds it and
:class:`~seg_datamodule.pictures.validation.ValPictures` (:func:`attach_run_pictures`).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer

from seg_datamodule.pictures.labels import figure_rgb, label_figure, label_stats
from seg_datamodule.pictures.validation import ValPictures
from seg_datamodule.pictures.writer import DrawingCallback, PictureWriter, host_copy, run_folder
from seg_datamodule.structures import DetectionBatch
from seg_datamodule.visualize import batch_grid

__all__ = ["FitPictures", "attach_run_pictures"]


class FitPictures(DrawingCallback):
    """Draw the label pictures and the first training batches of each fit (see the module docstring).

    Args:
        batches: how many of the first training batches to draw.
        max_images: at most this many images of a batch (a 4-column grid).
    """

    def __init__(self, batches: int = 3, max_images: int = 16) -> None:
        if batches < 0 or max_images < 1:
            raise ValueError(f"FitPictures needs batches >= 0 and max_images >= 1, got {batches}, {max_images}")
        self.batches, self.max_images = batches, max_images
        super().__init__()
        self._drawn = 0
        self._names: list[str] = []

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        folder = run_folder(trainer)
        self._drawn = 0
        self._writer = None if folder is None else PictureWriter(folder, trainer)
        if self._writer is None:
            return
        datamodule = trainer.datamodule
        self._names = list(getattr(datamodule, "class_names", []) or [])
        sources = getattr(datamodule, "sources", None)
        for split in ("train", "val"):
            index = None if sources is None else getattr(sources, f"{split}_index", None)
            if index is not None and hasattr(index, "instance_columns"):
                self._writer.submit(f"labels_{split}.png", lambda s=split, i=index: figure_rgb(label_figure(
                    label_stats(s, i))), trainer.global_step)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self._writer is None or self._drawn >= self.batches or not isinstance(batch, DetectionBatch):
            return
        host = host_copy(batch, self.max_images)  # the only work on the training loop's thread
        names = self._names or None
        self._writer.submit(f"train_batch{self._drawn}.jpg", lambda: batch_grid(host, self.max_images, 4, names),
                            trainer.global_step)
        self._drawn += 1

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish()


def attach_run_pictures(trainer: Trainer | None, on: bool) -> None:
    """Add :class:`FitPictures` and :class:`~seg_datamodule.pictures.validation.ValPictures` to
    ``trainer``'s callbacks (the DataModule's ``plots`` key), unless ``on`` is False, there is no
    Trainer, or the user added their own (theirs keep their settings)."""
    if not on or trainer is None:
        return
    for kind in (FitPictures, ValPictures):
        if not any(isinstance(c, kind) for c in trainer.callbacks):
            trainer.callbacks.append(kind())
