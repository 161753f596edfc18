"""EpochShardSampler on its own: defaults, the permutation it draws, its argument checks."""

from __future__ import annotations

import pytest
import torch

from seg_datamodule import EpochShardSampler


def test_defaults_are_one_rank_seed_zero_epoch_zero() -> None:
    # The permutation a DistributedSampler draws: torch.randperm from seed + epoch.
    want = torch.randperm(5, generator=torch.Generator().manual_seed(0)).tolist()
    assert list(EpochShardSampler(range(5))) == [(0, i) for i in want]
    sampler = EpochShardSampler(range(5), seed=3)
    sampler.set_epoch(2)
    want = torch.randperm(5, generator=torch.Generator().manual_seed(5)).tolist()
    assert list(sampler) == [(2, i) for i in want]


def test_unshuffled_ranks_deal_round_robin() -> None:
    shards = [[i for _, i in EpochShardSampler(range(7), num_replicas=2, rank=r, shuffle=False)] for r in (0, 1)]
    assert shards == [[0, 2, 4, 6], [1, 3, 5, 0]]  # padded with the first index, not lost


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="num_replicas must be >= 1, got 0"):
        EpochShardSampler(range(5), num_replicas=0)
    with pytest.raises(TypeError, match="num_replicas must be an int >= 1, got 1.5"):
        EpochShardSampler(range(5), num_replicas=1.5)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2"):
        EpochShardSampler(range(5), num_replicas=2, rank=2)
