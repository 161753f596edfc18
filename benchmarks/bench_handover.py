"""What receiving and dropping a collated batch costs the training thread, and whether memory grows.

The main process runs the training loop, so every millisecond it spends receiving a batch from a
worker (unpickling file descriptors, mapping the segment) or freeing one (unmapping about 135 MB
of shared memory for 64 x 640^2 images with masks) is taken from the optimiser step.

Setup: 64 mosaic canvases of 640 x 640 built once from coco-mini (about 2,500 real instances),
served by a dataset that returns them as they are, one worker, ``DetectionCollate`` with
``buffer_slots=0`` (a fresh segment per batch, the behaviour before slots) and with the default
``buffer_slots=4`` (segments reused, kept mapped in the main process). For each batch the main
thread times ``next(iterator)`` (receive; the main thread first waits ``--gap`` seconds, longer
than the worker needs per batch, so the batch is ready and the wait for the worker is not
counted), a copy of every image and mask byte into a preallocated buffer (what a transfer to
the device does; first touches of a fresh mapping fault pages in here) and ``del batch`` (free). Medians over ``--batches`` batches; the main process's RSS and the size of /dev/shm are
sampled at the start and the end to show whether memory grows.

Run: ``python benchmarks/bench_handover.py [--coco-mini PATH] [--batches 500]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_raster import build_mosaic_batch  # noqa: E402  (the same 64-canvas batch)

from seg_datamodule import DetectionCollate, Sample  # noqa: E402

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "coco-mini"


class Fixed(Dataset):
    """The same prebuilt samples, batch after batch (the collate is what is measured)."""

    def __init__(self, samples: list[Sample], batches: int) -> None:
        self.samples, self.batches = samples, batches

    def __len__(self) -> int:
        return len(self.samples) * self.batches

    def __getitem__(self, i: int) -> Sample:
        return self.samples[i % len(self.samples)]


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _shm_mb() -> float:
    usage = shutil.disk_usage("/dev/shm") if os.path.isdir("/dev/shm") else None
    return usage.used / 2**20 if usage else float("nan")


def run(samples: list[Sample], slots: int, batches: int, gap: float) -> dict[str, float]:
    loader = DataLoader(Fixed(samples, batches), batch_size=len(samples), num_workers=1,
                        collate_fn=DetectionCollate(mask_stride=4, buffer_slots=slots), prefetch_factor=2)
    receive, read, free = [], [], []
    it = iter(loader)
    rss0 = shm0 = 0.0
    images = masks = None
    for k in range(batches):
        time.sleep(gap)
        t0 = time.perf_counter()
        batch = next(it)
        t1 = time.perf_counter()
        if images is None:
            images, masks = torch.empty_like(batch.images), torch.empty_like(batch.masks)
        images.copy_(batch.images)  # every byte read once, as a copy to the device would
        masks.copy_(batch.masks)
        t2 = time.perf_counter()
        del batch
        t3 = time.perf_counter()
        receive.append(t1 - t0)
        read.append(t2 - t1)
        free.append(t3 - t2)
        if k == 9:
            gc.collect()
            rss0, shm0 = _rss_mb(), _shm_mb()
    rss1, shm1 = _rss_mb(), _shm_mb()
    del it
    ms = lambda xs: 1e3 * statistics.median(xs[10:])  # noqa: E731
    return {"receive": ms(receive), "read": ms(read), "free": ms(free), "rss": rss1 - rss0, "shm": shm1 - shm0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coco-mini", type=Path, default=Path(os.environ.get("COCO_MINI", DEFAULT_ROOT)))
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--gap", type=float, default=0.2, help="seconds the main thread waits per batch")
    args = parser.parse_args()
    torch.set_num_threads(1)
    samples = build_mosaic_batch(args.coco_mini)
    n = sum(s.num_instances for s in samples)
    print(f"{len(samples)} canvases of 640x640, {n} instances, 1 worker, {args.batches} batches; "
          "main-thread ms per batch (median after 10), memory change from batch 10 to the end")
    print(f"{'collate':<34}{'receive':>9}{'read':>8}{'free':>8}{'recv+free':>11}{'RSS MB':>9}{'shm MB':>9}")
    for slots in (0, 4):
        r = run(samples, slots, args.batches, args.gap)
        name = f"buffer_slots={slots}" + (" (fresh segment each)" if slots == 0 else " (reused, default)")
        print(f"{name:<34}{r['receive']:>9.2f}{r['read']:>8.2f}{r['free']:>8.2f}"
              f"{r['receive'] + r['free']:>11.2f}{r['rss']:>+9.0f}{r['shm']:>+9.0f}")


if __name__ == "__main__":
    main()
