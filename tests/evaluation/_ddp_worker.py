"""The per-rank body of the DDP test (a module of its own, so spawned processes can import it)."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from _coco_gt import gt_on_canvas, letterbox_batch, letterboxed, perturbed
from seg_datamodule.evaluation import COCOMaskMAP

CANVAS = 640


def predict(metric: COCOMaskMAP, image_ids: list[int], batch_size: int = 4) -> None:
    """Update with the same deterministic imperfect predictions the single-process run makes."""
    coco, num_classes = metric.coco, len(metric.category_ids)
    for start in range(0, len(image_ids), batch_size):
        ids = image_ids[start : start + batch_size]
        geometry = [letterboxed(coco, i, CANVAS) for i in ids]
        batch = letterbox_batch(ids, [g[0] for g in geometry], [g[1] for g in geometry], [g[2] for g in geometry],
                                (CANVAS, CANVAS))
        metric.update([perturbed(gt_on_canvas(coco, i, CANVAS, 4), num_classes, i) for i in ids], batch)


def worker(rank: int, world_size: int, init_method: str, val_ann: str, image_ids: list[int], out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    try:
        # Lightning's validation sampler: contiguous shards, padded with repeats to equal length.
        sampler = DistributedSampler(range(len(image_ids)), num_replicas=world_size, rank=rank, shuffle=False)
        shard = [image_ids[k] for k in sampler]
        metric = COCOMaskMAP(val_ann)
        predict(metric, shard)
        results = {k: v.item() for k, v in metric.compute().items()}
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"shard": shard, "results": results}, f)
    finally:
        dist.destroy_process_group()
