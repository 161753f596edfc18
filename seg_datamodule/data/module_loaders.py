"""The DataModule's DataLoaders, the train loader's checkpointed state and the device-side step.

A mixin of :class:`~seg_datamodule.data.datamodule.COCOSegDataModule` (its ``__init__`` sets the
attributes read here); the loader arguments themselves come from :mod:`~seg_datamodule.data.loaders`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader

from seg_datamodule.data.accounting import ConsumedCounts
from seg_datamodule.data.dataset import SegDataset
from seg_datamodule.data.loaders import LoaderPlan, loader_kwargs
from seg_datamodule.data.options import AugmentOptions, LoaderOptions, StreamOptions
from seg_datamodule.data.predict import PredictCollate, PredictDataset
from seg_datamodule.data.resume import DeliveredCounts, ResumableDataLoader, batch_counts
from seg_datamodule.data.sampler import EpochShardSampler
from seg_datamodule.transforms.hsv import apply_pending_hsv

__all__ = ["LoaderHooks"]


class LoaderHooks:
    """The ``*_dataloader`` hooks of a ``COCOSegDataModule``, with the train loader's state."""

    trainer: Any
    seed: int
    augment: AugmentOptions
    loader_options: LoaderOptions
    stream_options: StreamOptions | None
    on_resume_mismatch: str
    repeat_factors: np.ndarray | None
    train_dataset: SegDataset | None
    val_dataset: SegDataset | None
    test_dataset: SegDataset | None
    predict_dataset: PredictDataset | None
    val_ann: str | None
    dataset: str | None
    val_split: str | None
    consumed: ConsumedCounts
    _train_loader: Any
    _loader_state: dict[str, Any] | None

    def _loader_kwargs(self, dataset: Any = None, batch_size: int = 1, what: str = "the loader") -> dict[str, Any]:
        local_ranks = 1 if self.trainer is None else max(1, int(self.trainer.num_devices))
        plan = LoaderPlan(self.loader_options.for_node(local_ranks), dataset, batch_size, local_ranks, what)
        return loader_kwargs(plan, (self.image_size, self.image_size), self._on_cuda())

    def _on_cuda(self) -> bool:
        """Pinning only pays (and only works) when batches go to a CUDA device."""
        if self.trainer is None:
            return torch.cuda.is_available()
        return self.trainer.strategy.root_device.type == "cuda"

    def _world(self) -> tuple[int, int]:
        if self.trainer is None:
            return 1, 0
        return int(self.trainer.world_size), int(self.trainer.global_rank)

    def train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            self.setup("fit")
        assert self.train_dataset is not None
        world_size, rank = self._world()
        progress = self._trained_batches if self.trainer is not None else None
        # A reloaded loader keeps counting where the last one was.
        counts = DeliveredCounts(None if self._train_loader is None else self._train_loader.delivered_counts)
        kwargs = self._loader_kwargs(self.train_dataset, self.batch_size, "the train loader")
        loader: Any
        if self.stream_options is not None:  # LitData shards over ranks and workers itself
            from seg_datamodule.data.streaming import stream_train_loader

            kwargs["persistent_workers"] = False  # LitData's epoch lives in workers
            loader = stream_train_loader(self.stream_options, self.train_dataset, kwargs.pop("collate_fn"),
                                         batch_size=self.batch_size, progress=progress, counts=counts, **kwargs)
        else:
            sampler = EpochShardSampler(self.train_dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                        seed=self.seed, repeat_factors=self.repeat_factors)
            if self.trainer is not None:  # a reloaded loader: its length is the coming epoch's
                sampler.set_epoch(int(self.trainer.current_epoch))
            loader = ResumableDataLoader(self.train_dataset, batch_size=self.batch_size, sampler=sampler,
                                         progress=progress, on_mismatch=self.on_resume_mismatch, counts=counts,
                                         epoch_length=self._epoch_batches if self.trainer is not None else None,
                                         **kwargs)
        if self._loader_state is not None:  # a checkpoint being resumed
            loader.load_state_dict(self._loader_state)
            self._loader_state = None
        self._train_loader = loader
        return loader

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Count a consumed evaluation batch, apply the batch's pending HSV jitter (``hsv_on_device``)
        on its device, then run the model's hook.

        Lightning calls this for the batches its loops take, so an evaluation batch's counts are
        added here (:class:`~seg_datamodule.data.accounting.ConsumedCounts`), not when a worker
        builds it. Lightning runs only the DataModule's hook when both define it, so the model's
        own ``on_after_batch_transfer`` is called from here, after the jitter.
        """
        split = self._evaluation_split()
        if split is not None:
            trainer = self.trainer
            run = "sanity" if trainer.sanity_checking else (str(trainer.state.fn), trainer.global_step,
                                                            trainer.current_epoch)
            self.consumed.add(split, run, batch_counts(batch))
        batch = apply_pending_hsv(batch)
        model = None if self.trainer is None else self.trainer.lightning_module
        if model is not None and is_overridden("on_after_batch_transfer", model):
            batch = model.on_after_batch_transfer(batch, dataloader_idx)
        return batch

    def loader_state(self) -> dict[str, Any]:
        """The train loader's state, also kept by the DataModule so a resume can apply it early enough.

        Lightning saves the loader's own ``state_dict`` with the fit loop and restores it in
        ``FitLoop.setup_data``; but when ``configure_optimizers`` reads
        ``trainer.estimated_stepping_batches`` (any schedule sized to the run, as
        :class:`~seg_datamodule.demo.model.YolactLite` does), ``setup_data`` runs before the
        loops are restored, creates and starts the iterator, and is then skipped, so that state
        would never reach the loader. The DataModule's state is restored before that point.
        """
        return {} if self._train_loader is None else {"train_loader": self._train_loader.state_dict()}

    def keep_loader_state(self, state_dict: dict[str, Any]) -> None:
        """Keep the train loader's state for the next ``train_dataloader()`` (see :meth:`loader_state`)."""
        self._loader_state = state_dict.get("train_loader")

    def stepping_batches(self) -> int | float:
        """``trainer.estimated_stepping_batches``, with every epoch's own length under repeat-factor sampling.

        Lightning multiplies the train loader's length at the start of fit (epoch 0's draw) by
        ``max_epochs``; each epoch's draw is a pure function of ``(seed, epoch)``, so this sums
        them, cut by ``limit_train_batches``, gradient accumulation and ``max_steps`` as Lightning
        cuts its estimate. A schedule sized to it then ends with the run (a cosine sized short
        would climb again). Without repeat factors it is Lightning's estimate.
        """
        trainer = self.trainer
        estimate = trainer.estimated_stepping_batches
        if (self.repeat_factors is None or self.train_dataset is None or not math.isfinite(estimate)
                or trainer.max_epochs in (None, -1)):
            return estimate
        world_size, rank = self._world()
        sampler = EpochShardSampler(self.train_dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                    seed=self.seed, repeat_factors=self.repeat_factors)
        limit, steps = trainer.limit_train_batches, 0
        for epoch in range(max(int(trainer.max_epochs), 1)):
            sampler.set_epoch(epoch)
            batches = math.ceil(len(sampler) / self.batch_size)
            batches = min(batches, limit) if isinstance(limit, int) else int(batches * limit)
            steps += math.ceil(batches / trainer.accumulate_grad_batches)
        return min(steps, trainer.max_steps) if trainer.max_steps != -1 else steps

    def _evaluation_split(self) -> str | None:
        """``"val"`` or ``"test"`` while the Trainer runs that loop (sanity check included), else None."""
        trainer = self.trainer
        if trainer is None:
            return None
        return "val" if trainer.validating or trainer.sanity_checking else "test" if trainer.testing else None

    def _epoch_batches(self) -> int:
        """Batches the Trainer takes per epoch (``limit_train_batches`` applied)."""
        return int(min(self.trainer.num_training_batches, 2**62))

    def _trained_batches(self) -> int:
        """Batches of the current epoch the Trainer has trained on (fetched ahead ones not included).

        ``processed``, not ``ready``: the two differ only while a step runs, and a checkpoint
        saved then (on Ctrl-C or an exception, :class:`~seg_datamodule.checkpointing.InterruptCheckpoint`)
        makes Lightning train that batch again on resume, so the loader must hand it out again.
        """
        return int(self.trainer.fit_loop.epoch_loop.batch_progress.current.processed)

    def val_dataloader(self) -> DataLoader | list:
        if self.val_dataset is None and (self.val_ann is not None or (self.dataset and self.val_split)):
            self.setup("validate")
        if self.val_dataset is None:
            return []
        # Sequential; under DDP Lightning shards it with its own DistributedSampler.
        return DataLoader(self.val_dataset, batch_size=self.val_batch_size, shuffle=False,
                          **self._loader_kwargs(self.val_dataset, self.val_batch_size, "the validation loader"))

    def test_dataloader(self) -> DataLoader | list:
        """The ``test_ann`` split, in order, letterboxed (as :meth:`val_dataloader`); ``[]`` without one."""
        self._setup_test()
        if self.test_dataset is None:
            return []
        return DataLoader(self.test_dataset, batch_size=self.val_batch_size, shuffle=False,
                          **self._loader_kwargs(self.test_dataset, self.val_batch_size, "the test loader"))

    def predict_dataloader(self) -> DataLoader:
        """``predict_images`` in order, letterboxed, without targets (see :mod:`~seg_datamodule.data.predict`).

        Raises:
            ValueError: no ``predict_images`` was given.
        """
        self._setup_predict()
        if self.predict_dataset is None:
            raise ValueError("predict needs predict_images (a folder, or the folder of predict_ann's images)")
        kwargs = self._loader_kwargs()
        kwargs["collate_fn"] = PredictCollate(self.image_size, mask_stride=self.mask_stride)
        return DataLoader(self.predict_dataset, batch_size=self.val_batch_size, shuffle=False, **kwargs)
