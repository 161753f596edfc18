"""The off-diagonal cells of the training-parity 2x2: each trainer fed the other side's batches.

``benchmarks/train_parity.py --cell NAME`` runs one of them in a subprocess of its own::

    python benchmarks/_parity_cells.py ultralytics-loop-our-data SPEC.json
    python benchmarks/_parity_cells.py our-loop-ultralytics-data SPEC.json

* ``ultralytics-loop-our-data``: Ultralytics' ``SegmentationTrainer`` (its warmup, accumulation,
  optimiser groups, clipping, EMA, loss) with its train loader replaced by this project's
  DataModule, built by the project's own CLI from the same configs ``seg-datamodule fit`` reads.
  Each batch goes through the DataModule's ``on_after_batch_transfer`` (the HSV jitter it leaves
  to the device) and :func:`~seg_datamodule.integrations.ultralytics_batch.to_ultralytics_batch`,
  so the loss sees per-instance masks: the trainer runs with ``overlap_mask=False``.
* ``our-loop-ultralytics-data``: the Lightning loop and ``YOLOSegModule`` (built by the CLI from the
  same configs) trained on Ultralytics' own train loader (``build_yolo_dataset`` and
  ``build_dataloader``, as its trainer builds them), its overlap masks read by the loss as
  Ultralytics reads them (``overlap_mask=True``), mosaic closed for the last ``close_mosaic`` epochs
  as its trainer closes it.

``SPEC.json`` holds what ``train_parity.py`` passes: ``run`` (the folder), ``configs`` (the CLI's
``--config`` files), ``ultralytics`` (the keyword arguments of ``YOLO(...).train``), ``weights`` and
``stop_after`` (``--stop-after``: the last epoch to train, None for all; this project's loop reads
it from the configs, as ``benchmarks._parity_stop.StopAfterEpoch``).
"""

from __future__ import annotations

import json
import sys
from copy import copy
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]


def _cli(configs: list[str]) -> Any:
    """The project's LightningCLI, built from ``configs`` and not run: its model, DataModule and Trainer."""
    from lightning.pytorch import LightningModule

    from seg_datamodule.cli import SegCLI
    from seg_datamodule import COCOSegDataModule

    args = [item for path in configs for item in ("--config", path)]
    return SegCLI(LightningModule, COCOSegDataModule, subclass_mode_model=True, args=args, run=False)


# ------------------------------------------------------------------------------ Ultralytics' loop, our batches


class OurBatches:
    """This project's train loader as Ultralytics' trainer reads one (``len``, ``sampler``, ``dataset``,
    ``reset``), handing out Ultralytics' batch dicts; each ``iter()`` is the next epoch."""

    def __init__(self, datamodule: Any) -> None:
        from lightning.fabric.utilities.data import _set_sampler_epoch

        self._set_epoch = _set_sampler_epoch
        self.datamodule = datamodule
        datamodule.setup("fit")
        self.loader = datamodule.train_dataloader()
        self.batch_size = self.loader.batch_size or datamodule.batch_size
        # Ultralytics' trainer reads only len(loader.sampler) (its warmup and logging); the order
        # is the DataModule's own sampler's.
        self.sampler = range(len(self.loader) * self.batch_size)
        self.dataset = self.loader.dataset
        self.drop_last, self.num_workers, self.epoch = False, self.loader.num_workers, 0

    def __len__(self) -> int:
        return len(self.loader)

    def reset(self) -> None:
        """Nothing to rebuild: mosaic closes by the epoch (the sampler's), as the DataModule closes it."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from seg_datamodule.integrations.ultralytics_batch import to_ultralytics_batch

        self._set_epoch(self.loader, self.epoch)
        for batch in self.loader:
            batch = self.datamodule.on_after_batch_transfer(batch, 0)
            out = to_ultralytics_batch(batch)
            out["img"] = batch.images  # uint8: the trainer's preprocess_batch divides by 255
            yield out
        self.epoch += 1


def ultralytics_loop_our_data(spec: dict[str, Any]) -> None:
    """Ultralytics' ``SegmentationTrainer`` with its train loader replaced by this DataModule's.

    Args:
        spec: the run (``configs``: the project's config files, the DataModule read from them;
            ``ultralytics``: ``model.train`` keyword arguments; ``weights``: a start or None).
    """
    from ultralytics import YOLO
    from ultralytics.models.yolo.segment import SegmentationTrainer

    cli = _cli(spec["configs"])
    datamodule = cli.datamodule
    datamodule.trainer = cli.trainer  # its max_epochs, for close_mosaic

    class OurDataTrainer(SegmentationTrainer):
        def get_dataloader(self, dataset_path: str, batch_size: int = 16, rank: int = 0, mode: str = "train") -> Any:
            if mode != "train":
                return super().get_dataloader(dataset_path, batch_size, rank, mode)
            if batch_size != datamodule.batch_size:
                raise ValueError(f"Ultralytics' batch {batch_size} != the DataModule's {datamodule.batch_size}")
            return OurBatches(datamodule)

    model = YOLO(spec["weights"] or "yolo11n-seg.yaml")
    if spec.get("stop_after") is not None:
        from benchmarks._parity_stop import stop_ultralytics_after

        model.add_callback("on_fit_epoch_end", stop_ultralytics_after(int(spec["stop_after"])))
    model.train(trainer=OurDataTrainer, **{**spec["ultralytics"], "overlap_mask": False})


# ------------------------------------------------------------------------------ our loop, Ultralytics' batches


def _ultralytics_loader(spec: dict[str, Any], overlap_mask: bool = True) -> tuple[Any, Any, Any]:
    """Ultralytics' train dataset and loader, built as its trainer builds them; returns them and the args.

    Args:
        spec: the run (``ultralytics``: ``model.train`` keyword arguments).
        overlap_mask: Ultralytics' default, one (H / 4, W / 4) mask an image; False: one per instance.
    """
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.utils import DEFAULT_CFG
    from ultralytics.utils.torch_utils import init_seeds

    u = spec["ultralytics"]
    args = get_cfg(DEFAULT_CFG, {**u, "task": "segment", "mode": "train", "overlap_mask": overlap_mask})
    init_seeds(args.seed + 1)  # as BaseTrainer.__init__ seeds before it builds the loaders
    data = check_det_dataset(args.data)
    dataset = build_yolo_dataset(args, data["train"], args.batch, data, mode="train", rect=False, stride=32)
    loader = build_dataloader(dataset, batch=args.batch, workers=args.workers, shuffle=True, rank=-1, drop_last=False)
    return dataset, loader, args


def our_loop_ultralytics_data(spec: dict[str, Any]) -> None:
    """The Lightning loop and ``YOLOSegModule`` (from ``spec["configs"]``) fed Ultralytics' own train loader.

    Args:
        spec: the run, as :func:`ultralytics_loop_our_data` reads it.
    """
    import lightning as L
    import torch

    from seg_datamodule.integrations._stages import check_loss

    cli = _cli(spec["configs"])
    model, trainer = cli.model, cli.trainer
    dataset, loader, args = _ultralytics_loader(spec)

    class UltralyticsData(L.LightningDataModule):
        batch_size = int(args.batch)  # read by the module's nominal batch

        def train_dataloader(self) -> Any:
            return loader

    class CloseMosaic(L.Callback):
        """Ultralytics' ``_close_dataloader_mosaic`` at the first of the last ``close_mosaic`` epochs."""

        def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            if args.close_mosaic and trainer.current_epoch == trainer.max_epochs - args.close_mosaic:
                dataset.mosaic = False
                dataset.close_mosaic(hyp=copy(args))
                loader.reset()

    def training_step(batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        criterion = model.criterion()
        criterion.overlap = True  # masks (B, H/4, W/4): i + 1 marks each image's i-th instance
        images = batch["img"].float() / 255
        outputs = model.model(images)
        loss, items = criterion(outputs, {**batch, "img": images})
        loss = loss.sum()
        model._skipped = not check_loss(model, loss, items, "train")
        if model._skipped:
            return None  # type: ignore[return-value]
        model.log("train/loss", loss, batch_size=len(images))
        return loss * model._loss_scale if model._loss_scale != 1.0 else loss

    model.training_step = training_step  # the module's own, but on Ultralytics' dict
    trainer.callbacks.append(CloseMosaic())
    L.seed_everything(cli.config["seed_everything"])
    trainer.fit(model, datamodule=UltralyticsData())


CELLS = {"ultralytics-loop-our-data": ultralytics_loop_our_data, "our-loop-ultralytics-data": our_loop_ultralytics_data}

if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # the configs' class paths: benchmarks._parity_stop
    if len(sys.argv) != 3 or sys.argv[1] not in CELLS:
        sys.exit(f"usage: {Path(sys.argv[0]).name} {{{','.join(CELLS)}}} SPEC.json")
    CELLS[sys.argv[1]](json.loads(Path(sys.argv[2]).read_text()))
