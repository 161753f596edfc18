"""The DataModule's datasets and DataLoaders, built from its option objects; the train loader's state.

:class:`LoaderFactory` is a collaborator of :class:`~seg_datamodule.data.datamodule.COCOSegDataModule`
that works alone too: give it the option objects and the indices, and it builds the datasets,
the samplers and the loaders exactly as the DataModule does (the DataModule's loaders are its).
What a loader needs to know of the run (ranks, device, epoch, the loop's progress) comes as a
:class:`LoaderContext`, :meth:`LoaderContext.of` a Trainer or none. The loader arguments
themselves come from :mod:`~seg_datamodule.data.loaders.arguments`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from seg_datamodule.data.batching.allocator import keep_freed_memory
from seg_datamodule.data.samples.dataset import SegDataset
from seg_datamodule.data.loaders.arguments import LoaderPlan, loader_kwargs
from seg_datamodule.data.config.options import AugmentOptions, LoaderOptions, StreamOptions
from seg_datamodule.data.samples.predict import PredictCollate, PredictDataset
from seg_datamodule.data.loaders.repeat_factors import fit_repeat_factors
from seg_datamodule.data.counts import ConsumedCounts, DeliveredCounts
from seg_datamodule.data.loaders.resume import CountingLoader, ResumableDataLoader
from seg_datamodule.data.loaders.sampler import EpochShardSampler
from seg_datamodule.io.predict_source import PredictImages

__all__ = ["AUTO_CACHE_MAX_IMAGES", "LoaderContext", "LoaderFactory"]

#: With ``cache_images=None``, datasets up to this many images are cached whole in each worker.
AUTO_CACHE_MAX_IMAGES = 512


@dataclass(frozen=True)
class LoaderContext:
    """What a loader needs to know of the run; the defaults are a single process without a Trainer.

    Attributes:
        local_ranks (int): processes on this node (they share the cores and ``/dev/shm``).
        world_size (int): processes in the run.
        rank (int): this process's global rank.
        on_cuda (bool): batches go to a CUDA device (pinning only pays, and only works, then).
        epoch (int | None): the epoch a (re)loaded train loader starts; None: the sampler's own.
        progress (Callable[[], int] | None): batches of the epoch the loop has trained on.
        epoch_length (Callable[[], int] | None): batches the loop takes per epoch.
    """

    local_ranks: int = 1
    world_size: int = 1
    rank: int = 0
    on_cuda: bool = False
    epoch: int | None = None
    progress: Callable[[], int] | None = None
    epoch_length: Callable[[], int] | None = None

    @classmethod
    def of(cls, trainer: Any) -> LoaderContext:
        """The context of ``trainer``'s run, or (``None``) of a process alone."""
        if trainer is None:
            return cls(on_cuda=torch.cuda.is_available())
        return cls(max(1, int(trainer.num_devices)), int(trainer.world_size), int(trainer.global_rank),
                   trainer.strategy.root_device.type == "cuda", int(trainer.current_epoch),
                   partial(_trained_batches, trainer), partial(_epoch_batches, trainer))


def _trained_batches(trainer: Any) -> int:
    """Batches of the current epoch the Trainer has trained on (fetched ahead ones not included).

    ``processed``, not ``ready``: the two differ only while a step runs, and a checkpoint
    saved then (on Ctrl-C or an exception, :class:`~seg_datamodule.checkpointing.InterruptCheckpoint`)
    makes Lightning train that batch again on resume, so the loader must hand it out again.
    """
    return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)


def _epoch_batches(trainer: Any) -> int:
    """Batches the Trainer takes per epoch (``limit_train_batches`` applied)."""
    return int(min(trainer.num_training_batches, 2**62))


class LoaderFactory:
    """Builds and holds the datasets and loaders of one DataModule, and the train loader's state.

    Args:
        augment (AugmentOptions): what a training sample draws (and the canvas size).
        loader_options (LoaderOptions): what every DataLoader shares.
        seed (int): base seed of shuffling and augmentation.
        stream_options (StreamOptions | None): train from a LitData chunk set instead of an index.
        on_resume_mismatch (str): ``"raise"`` or ``"restart"`` on a checkpoint saved for another run.
        repeat_factor_threshold (float | None): repeat-factor sampling of the train loader; None: off.
    """

    def __init__(self, augment: AugmentOptions, loader_options: LoaderOptions, seed: int = 0,
                 stream_options: StreamOptions | None = None, on_resume_mismatch: str = "raise",
                 repeat_factor_threshold: float | None = None) -> None:
        self.augment, self.loader_options, self.seed = augment, loader_options, seed
        self.stream_options, self.on_resume_mismatch = stream_options, on_resume_mismatch
        self.repeat_factor_threshold = repeat_factor_threshold
        self.repeat_factors: np.ndarray | None = None
        self.train_dataset: SegDataset | None = None
        self.val_dataset: SegDataset | None = None
        self.test_dataset: SegDataset | None = None
        self.predict_dataset: PredictDataset | None = None
        #: The last train loader built (a reloaded one keeps counting where it was).
        self.train_loader: Any = None
        #: What the evaluation loaders handed out, per split, the last pass of each (:class:`CountingLoader`).
        self.eval_counts = ConsumedCounts()
        self._loader_state: dict[str, Any] | None = None

    # ------------------------------------------------------------------ datasets

    def setup_train(self, index: Any, cache_images: int | None, max_epochs: int | None) -> SegDataset:
        """The training dataset over ``index`` (built once; later calls only update ``max_epochs``).

        ``cache_images=None`` caches a dataset of at most :data:`AUTO_CACHE_MAX_IMAGES` images whole.
        """
        if self.train_dataset is None:
            if cache_images is None:
                cache_images = len(index) if len(index) <= AUTO_CACHE_MAX_IMAGES else 0
            self.train_dataset = SegDataset(index, self.augment, train=True, seed=self.seed,
                                            cache_images=cache_images, max_epochs=max_epochs)
        elif max_epochs is not None:  # set up before a Trainer was attached, or a new Trainer
            self.train_dataset.set_max_epochs(max_epochs)
        return self.train_dataset

    def fit_repeat_factors(self, index: Any, trainer: Any) -> None:
        """Repeat factors of ``index`` for ``fit`` (computed once), when ``repeat_factor_threshold`` is set."""
        if self.repeat_factor_threshold is not None:  # every epoch's own length (the Trainer reloads)
            self.repeat_factors = fit_repeat_factors(self.repeat_factors, index, self.repeat_factor_threshold,
                                                     trainer)

    def setup_eval(self, split: str, index: Any) -> SegDataset | None:
        """The ``"val"`` or ``"test"`` dataset over ``index`` (letterboxed), built once; None without an index."""
        attribute = f"{split}_dataset"
        if index is not None and getattr(self, attribute) is None:
            setattr(self, attribute, SegDataset(index, self.augment, train=False, seed=self.seed))
        return getattr(self, attribute)

    def setup_predict(self, images: PredictImages | None, on_bad_sample: str) -> PredictDataset | None:
        """The predict dataset over ``images``, built once; None without images."""
        if images is not None and self.predict_dataset is None:
            self.predict_dataset = PredictDataset(images, image_size=self.augment.image_size,
                                                  on_bad_sample=on_bad_sample)
        return self.predict_dataset

    # ------------------------------------------------------------------ loaders

    def loader_kwargs(self, context: LoaderContext, dataset: Any = None, batch_size: int = 1,
                      what: str = "the loader") -> dict[str, Any]:
        """The ``DataLoader`` arguments for ``dataset`` in ``context`` (:func:`~seg_datamodule.data.loaders.arguments.loader_kwargs`)."""
        plan = LoaderPlan(self.loader_options.for_node(context.local_ranks), dataset, batch_size,
                          context.local_ranks, what)
        size = self.augment.image_size
        return loader_kwargs(plan, (size, size), context.on_cuda)

    def sampler(self, context: LoaderContext) -> EpochShardSampler:
        """The train sampler: this rank's shard of ``(seed, epoch)``'s shuffle (repeat factors applied)."""
        assert self.train_dataset is not None
        return EpochShardSampler(self.train_dataset, num_replicas=context.world_size, rank=context.rank,
                                 shuffle=True, seed=self.seed, repeat_factors=self.repeat_factors)

    def train_loader_for(self, context: LoaderContext) -> Any:
        """A train loader (resumable, or streaming), continuing the last one's counts and a kept state.

        Raises:
            RuntimeError: no training dataset was set up (:meth:`setup_train`).
        """
        dataset = self.train_dataset
        if dataset is None:
            raise RuntimeError("set up the training dataset (setup_train) before its loader")
        batch_size = self.loader_options.batch_size
        # A reloaded loader keeps counting where the last one was.
        counts = DeliveredCounts(None if self.train_loader is None else self.train_loader.delivered_counts)
        kwargs = self.loader_kwargs(context, dataset, batch_size, "the train loader")
        if kwargs.get("num_workers", 0) == 0:  # samples are built here: keep their freed canvases
            keep_freed_memory()
        loader: Any
        if self.stream_options is not None:  # LitData shards over ranks and workers itself
            from seg_datamodule.data.loaders.streaming import stream_train_loader

            kwargs["persistent_workers"] = False  # LitData's epoch lives in workers
            loader = stream_train_loader(self.stream_options, dataset, kwargs.pop("collate_fn"),
                                         batch_size=batch_size, progress=context.progress, counts=counts, **kwargs)
            # The Trainer's processes of one node share its cache: their workers split its downloads.
            loader.dataset.ranks_on_node = context.local_ranks
        else:
            sampler = self.sampler(context)
            if context.epoch is not None:  # a reloaded loader: its length is the coming epoch's
                sampler.set_epoch(context.epoch)
            loader = ResumableDataLoader(dataset, batch_size=batch_size, sampler=sampler, progress=context.progress,
                                         on_mismatch=self.on_resume_mismatch, counts=counts,
                                         epoch_length=context.epoch_length, **kwargs)
        if self._loader_state is not None:  # a checkpoint being resumed
            loader.load_state_dict(self._loader_state)
            self._loader_state = None
        self.train_loader = loader
        return loader

    def eval_loader(self, split: str, context: LoaderContext) -> DataLoader | list:
        """The ``"val"`` or ``"test"`` split in order, letterboxed; ``[]`` when it was not set up."""
        dataset = getattr(self, f"{split}_dataset")
        if dataset is None:
            return []
        what = {"val": "the validation loader", "test": "the test loader"}[split]
        batch_size = self.loader_options.val_batch_size
        # Sequential; under DDP Lightning shards it with its own DistributedSampler.
        return CountingLoader(dataset, batch_size=batch_size, shuffle=False, split=split, counts=self.eval_counts,
                              **self.loader_kwargs(context, dataset, batch_size, what))

    def predict_loader(self, context: LoaderContext) -> DataLoader:
        """The predict images in order, letterboxed, without targets.

        Raises:
            ValueError: no predict dataset was set up (no ``predict_images``).
        """
        if self.predict_dataset is None:
            raise ValueError("predict needs predict_images (a folder, or the folder of predict_ann's images)")
        kwargs = self.loader_kwargs(context)
        kwargs["collate_fn"] = PredictCollate(self.augment.image_size, mask_stride=self.loader_options.mask_stride)
        return DataLoader(self.predict_dataset, batch_size=self.loader_options.val_batch_size, shuffle=False,
                          **kwargs)

    # ------------------------------------------------------------------ resume and schedule

    def loader_state(self) -> dict[str, Any]:
        """``{"train_loader": state}`` of the last train loader built; empty before one."""
        return {} if self.train_loader is None else {"train_loader": self.train_loader.state_dict()}

    def keep_loader_state(self, state_dict: dict[str, Any]) -> None:
        """Keep a checkpoint's train-loader state (:meth:`loader_state`) for the next train loader built."""
        self._loader_state = state_dict.get("train_loader")

    def stepping_batches(self, trainer: Any) -> int | float:
        """``trainer.estimated_stepping_batches``, with every epoch's own length under repeat-factor sampling.

        Lightning multiplies the train loader's length at the start of fit (epoch 0's draw) by
        ``max_epochs``; each epoch's draw is a pure function of ``(seed, epoch)``, so this sums
        them, cut by ``limit_train_batches``, gradient accumulation and ``max_steps`` as Lightning
        cuts its estimate. A schedule sized to it then ends with the run (a cosine sized short
        would climb again). Without repeat factors it is Lightning's estimate.
        """
        estimate = trainer.estimated_stepping_batches
        if (self.repeat_factors is None or self.train_dataset is None or not math.isfinite(estimate)
                or trainer.max_epochs in (None, -1)):
            return estimate
        sampler = self.sampler(LoaderContext(world_size=int(trainer.world_size), rank=int(trainer.global_rank)))
        limit, steps = trainer.limit_train_batches, 0
        for epoch in range(max(int(trainer.max_epochs), 1)):
            sampler.set_epoch(epoch)
            batches = math.ceil(len(sampler) / self.loader_options.batch_size)
            batches = min(batches, limit) if isinstance(limit, int) else int(batches * limit)
            steps += math.ceil(batches / trainer.accumulate_grad_batches)
        return min(steps, trainer.max_steps) if trainer.max_steps != -1 else steps
