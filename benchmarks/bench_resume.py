"""How long a mid-epoch resume takes to deliver its first batch: O(1) fast-forward, no replay.

A checkpoint stores the train loader's position (epoch, batches trained); on resume the sampler
starts the epoch at the next batch without building the skipped ones. This measures, on a split
of ``--images`` entries (coco-mini repeated, as in ``bench_loader.py``; COCO-sized, so an epoch
at batch 16 has thousands of steps), the time from ``load_state_dict`` to the first batch when
resuming at step ``--step``, against starting the same epoch at step 0, and what replaying the
skipped batches would have cost (measured per batch, times the steps skipped). The resumed batch
is checked to be the one an uninterrupted pass delivers at that step.

Run: ``python benchmarks/bench_resume.py [--images 81920] [--step 5000] [--workers 0 2]``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loader import DEFAULT_ROOT, YOLO_HSV, make_large_split, yolo_recipe  # noqa: E402

from seg_datamodule import DetectionCollate, EpochShardSampler, SegDataset  # noqa: E402
from seg_datamodule.data.loaders.arguments import worker_init_fn  # noqa: E402
from seg_datamodule.data.config.options import AugmentOptions  # noqa: E402
from seg_datamodule.data.loaders.resume import ResumableDataLoader  # noqa: E402
from seg_datamodule.io.coco import CocoIndex  # noqa: E402
from seg_datamodule.transforms.layouts.mosaic import MosaicAffine  # noqa: E402
from seg_datamodule.transforms.pixel.hsv import HSVJitter  # noqa: E402


def _loader(ds: SegDataset, batch_size: int, workers: int) -> ResumableDataLoader:
    return ResumableDataLoader(ds, batch_size=batch_size, sampler=EpochShardSampler(ds, seed=0),
                               num_workers=workers, collate_fn=DetectionCollate(mask_stride=4),
                               worker_init_fn=worker_init_fn if workers else None)


def _digest(batch) -> str:  # noqa: ANN001
    return hashlib.sha256(batch.images.contiguous().numpy().tobytes() + batch.masks.numpy().tobytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coco-mini", type=Path, default=Path(os.environ.get("COCO_MINI", DEFAULT_ROOT)))
    parser.add_argument("--images", type=int, default=81920)
    parser.add_argument("--step", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, nargs="*", default=[0, 2])
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench_resume_"))
    try:
        ann_file, images = make_large_split(args.coco_mini, work / "split", args.images, annotate_every=16)
        index = CocoIndex.build(ann_file, images, cache_dir=work / "index")
        augment = AugmentOptions(MosaicAffine(image_size=640), transforms=yolo_recipe(), hsv=HSVJitter(YOLO_HSV))
        ds = SegDataset(index, augment, seed=0)
        steps = len(ds) // args.batch_size
        print(f"{len(ds)} images, batch {args.batch_size}: {steps} steps per epoch; resume at step {args.step}")
        for workers in args.workers:
            start = time.perf_counter()
            fresh = iter(_loader(ds, args.batch_size, workers))
            next(fresh)
            first = time.perf_counter() - start
            t = time.perf_counter()
            for _ in range(5):
                next(fresh)
            per_batch = (time.perf_counter() - t) / 5
            del fresh
            # The state a checkpoint at step `step` holds (the loader's own, as Lightning saves it).
            state = _loader(ds, args.batch_size, workers).state_dict() | {"batches": args.step}
            start = time.perf_counter()
            resumed = _loader(ds, args.batch_size, workers)
            resumed.load_state_dict(state)
            batch = next(iter(resumed))
            resume = time.perf_counter() - start
            # The batch an uninterrupted pass delivers at that step (built directly, same plan).
            sampler = EpochShardSampler(ds, seed=0)
            order = list(sampler)[args.step * args.batch_size : (args.step + 1) * args.batch_size]
            want = DetectionCollate(mask_stride=4, shared_memory=False)(ds.__getitems__(order))
            same = _digest(batch) == _digest(want)
            print(f"  workers={workers}: first batch of a fresh epoch {first:.2f} s; resumed at step {args.step} "
                  f"{resume:.2f} s ({resume / first:.2f}x); replaying {args.step} batches would take about "
                  f"{args.step * per_batch:.0f} s ({per_batch * 1e3:.0f} ms/batch); same batch as uninterrupted: {same}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
