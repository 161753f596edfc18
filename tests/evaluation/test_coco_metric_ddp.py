"""COCOMaskMAP under DDP: two gloo processes on the CPU give exactly the single-process numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from _ddp_worker import predict, worker
from seg_datamodule.evaluation import COCOMaskMAP


@pytest.mark.slow
def test_two_ranks_equal_one_process(coco_mini: Path, tmp_path: Path) -> None:
    val_ann = str(coco_mini / "annotations" / "instances_val2017.json")
    single = COCOMaskMAP(val_ann)
    image_ids = sorted(single.coco.imgs)[:25]  # odd: the sampler pads rank 1 with a repeat
    predict(single, image_ids)
    expected = {k: v.item() for k, v in single.compute().items()}

    # A file rendezvous in the test's own folder: a free port picked here could be taken by another
    # process (a parallel run, another DDP test) before rank 0 binds it.
    rendezvous = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(worker, args=(2, rendezvous, val_ann, image_ids, str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    shards = [r["shard"] for r in ranks]
    assert len(shards[0]) == len(shards[1]) == 13
    assert len(shards[0] + shards[1]) == 26 and set(shards[0] + shards[1]) == set(image_ids)  # one repeat
    for r in ranks:
        assert r["results"] == expected  # bit for bit, on both ranks
