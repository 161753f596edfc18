"""A rank-sharding, epoch-reseeded sampler that hands the epoch to the dataset with each index.

Why a ``DistributedSampler`` subclass: Lightning replaces any other sampler of a training
DataLoader under DDP (``use_distributed_sampler=True``), silently dropping whatever it carried; it
leaves a ``DistributedSampler`` alone and calls its ``set_epoch`` at the start of every epoch.

Why the epoch travels with the index: persistent DataLoader workers keep their own copy of the
dataset, and the DataLoader prefetches indices before the main process could tell the workers the
epoch. Yielding ``(epoch, index)`` makes each sample's augmentation a pure function of
``(seed, epoch, index)``, so the batches are the same for any ``num_workers`` and the epoch can
never be stale.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Sized

from torch.utils.data import DistributedSampler

from seg_datamodule.ops.checks import check_int

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
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        check_int("num_replicas", num_replicas, 1)
        if not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}), got {rank!r}")
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self._start: tuple[int, int] | None = None

    def start_at(self, epoch: int, position: int) -> None:
        """Begin the next pass over ``epoch`` at this rank's ``position``-th index (a resume).

        One-shot: it applies to the next ``__iter__`` if the epoch is then ``epoch``, and the
        pass after it starts from the beginning again. Skipping costs O(1) per skipped index:
        nothing is loaded for them.
        """
        self._start = (check_int("epoch", epoch, 0), check_int("position", position, 0))

    def __iter__(self) -> Iterator[tuple[int, int]]:  # type: ignore[override]
        epoch = int(self.epoch)
        start = 0
        if self._start is not None:
            start = self._start[1] if self._start[0] == epoch else 0
            self._start = None
        for index in itertools.islice(super().__iter__(), start, None):
            yield epoch, int(index)
