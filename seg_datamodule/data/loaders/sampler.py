"""A rank-sharding, epoch-reseeded sampler that hands the epoch to the dataset with each index.

Why a ``DistributedSampler`` subclass: Lightning replaces any other sampler of a training
DataLoader under DDP (``use_distributed_sampler=True``), silently dropping whatever it carried; it
leaves a ``DistributedSampler`` alone and calls its ``set_epoch`` at the start of every epoch.

Why the epoch travels with the index: persistent DataLoader workers keep their own copy of the
dataset, and the DataLoader prefetches indices before the main process could tell the workers the
epoch. Yielding ``(epoch, index)`` makes each sample's augmentation a pure function of
``(seed, epoch, index)``, so the batches are the same for any ``num_workers`` and the epoch can
never be stale.

Repeat-factor sampling (``repeat_factors``, LVIS's recipe; see
:mod:`~seg_datamodule.data.loaders.repeat_factors`) changes what is permuted: each epoch image ``i``
appears ``floor(r_i)`` times plus once more with probability ``r_i - floor(r_i)``, drawn from
``(seed, epoch)`` before the shuffle and the deal, so it composes with the rest unchanged (the
same draw on every rank, disjoint shards, a resumable position). Each copy travels as
``(epoch, index, copy)`` and is augmented from its own generator. The epoch's length follows the
draw: ``len(sampler)`` is the current epoch's (call ``set_epoch`` first), and Lightning reads a
train loader's length once per loader, so a run needs ``reload_dataloaders_every_n_epochs=1``
(the DataModule checks it).
"""

from __future__ import annotations

import itertools
from typing import Iterator, Sequence, Sized

import numpy as np
from torch.utils.data import DistributedSampler

from seg_datamodule.data.loaders.repeat_factors import draw_repeats
from seg_datamodule.ops.checks import check_int

# Tags the repeat draw's generator apart from the per-sample ``[seed, epoch, index]`` ones.
_REPEAT_STREAM = 0x72666173

__all__ = ["EpochShardSampler"]


class EpochShardSampler(DistributedSampler):
    """Shuffle from ``(seed, epoch)``, give each rank a disjoint shard, yield ``(epoch, index)``.

    Every epoch the indices ``0..len(dataset)-1`` are permuted (when ``shuffle``) and dealt
    round-robin to the ranks. With ``drop_last=False`` the permutation is padded with its own
    first indices up to a multiple of ``num_replicas``, so at most ``num_replicas - 1`` images are
    seen twice in an epoch and none is lost; with ``drop_last=True`` at most
    ``num_replicas - 1`` images are left out of that epoch (a different few each epoch).

    Args:
        dataset: a sized dataset whose ``__getitem__`` accepts ``(epoch, index)``.
        num_replicas (int): number of ranks (``trainer.world_size``).
        rank (int): this rank (``trainer.global_rank``).
        shuffle (bool): permute each epoch.
        seed (int): base seed, the same on every rank.
        drop_last (bool): drop the tail instead of padding it.
        repeat_factors (Sequence[float] | None): per image, how many times it appears per epoch
            on average (each at least 1; see :mod:`~seg_datamodule.data.loaders.repeat_factors`); None:
            once each. With them the sampler yields ``(epoch, index, copy)``.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        repeat_factors: Sequence[float] | np.ndarray | None = None,
    ) -> None:
        check_int("num_replicas", num_replicas, 1)
        if not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}), got {rank!r}")
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self._start: tuple[int, int] | None = None
        self.repeat_factors: np.ndarray | None = None
        if repeat_factors is not None:
            factors = np.asarray(repeat_factors, np.float64)
            if factors.shape != (len(dataset),) or not np.isfinite(factors).all() or (factors < 1).any():
                raise ValueError(
                    f"repeat_factors must be {len(dataset)} finite numbers >= 1 (one per image), got "
                    f"shape {factors.shape}" + (f", min {factors.min()}" if factors.size else "")
                )
            self.repeat_factors = factors
        self._drawn: tuple[int, np.ndarray, np.ndarray] | None = None  # (epoch, indices, copies)

    def epoch_items(self) -> tuple[np.ndarray, np.ndarray]:
        """This rank's image indices and copy numbers of the current epoch, in order.

        Returns:
            indices (ndarray[L] int64) and copies (ndarray[L] int64; all 0 without repeat
            factors).
        """
        epoch = int(self.epoch)
        if self._drawn is not None and self._drawn[0] == epoch:
            return self._drawn[1], self._drawn[2]
        if self.repeat_factors is None:
            indices = np.fromiter(super().__iter__(), np.int64)
            copies = np.zeros_like(indices)
        else:
            indices, copies = self._repeated(epoch)
        self._drawn = (epoch, indices, copies)
        return indices, copies

    def _repeated(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Draw the epoch's copies, shuffle, pad or drop to the ranks, deal (as ``DistributedSampler``)."""
        assert self.repeat_factors is not None
        rng = np.random.default_rng([self.seed, epoch, _REPEAT_STREAM])
        counts = draw_repeats(self.repeat_factors, rng)
        indices = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        copies = np.arange(len(indices), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        if self.shuffle:
            order = rng.permutation(len(indices))
            indices, copies = indices[order], copies[order]
        replicas = self.num_replicas
        if self.drop_last:
            keep = len(indices) - len(indices) % replicas
            indices, copies = indices[:keep], copies[:keep]
        elif len(indices) % replicas:
            pad = np.resize(np.arange(len(indices)), replicas - len(indices) % replicas)
            indices, copies = np.concatenate([indices, indices[pad]]), np.concatenate([copies, copies[pad]])
        return indices[self.rank :: replicas], copies[self.rank :: replicas]

    def __len__(self) -> int:
        if self.repeat_factors is None:
            return int(self.num_samples)
        return len(self.epoch_items()[0])

    def start_at(self, epoch: int, position: int) -> None:
        """Begin the next pass over ``epoch`` at this rank's ``position``-th index (a resume).

        One-shot: it applies to the next ``__iter__`` if the epoch is then ``epoch``, and the
        pass after it starts from the beginning again. Skipping costs O(1) per skipped index:
        nothing is loaded for them.
        """
        self._start = (check_int("epoch", epoch, 0), check_int("position", position, 0))

    def __iter__(self) -> Iterator[tuple[int, ...]]:  # type: ignore[override]
        epoch = int(self.epoch)
        start = 0
        if self._start is not None:
            start = self._start[1] if self._start[0] == epoch else 0
            self._start = None
        if self.repeat_factors is None:
            for index in itertools.islice(super().__iter__(), start, None):
                yield epoch, int(index)
            return
        indices, copies = self.epoch_items()
        for index, copy in zip(indices[start:].tolist(), copies[start:].tolist()):
            yield epoch, index, copy
