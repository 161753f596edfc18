"""Issue 53's one prepared script for a CUDA machine: the loader in every mode, the device's rate, cores per GPU.

Prints, in one run (under 8 minutes on one GPU with 16 cores, the default sizes):

1. **The loader in every mode at 0/4/8/14 workers** (images/s, ``bench_loader.py``'s rows and
   split: coco-mini's train images repeated to ``--images`` entries, 640 px mosaics, batch 32, no
   cache): pixels and HSV in the workers, HSV on the device, partners over the dataset, and
   ``pixels_on_device`` with partners from the batch and over the dataset (their rows are the
   workers' side only), beside Ultralytics ``cache=False`` when it is importable.
2. **Per mode, the workers' CPU time per image** (one thread), the device's time per batch for
   what the mode leaves it (nothing; the HSV jitter; decode, warp, flip and jitter), CUDA events,
   best of ``--device-repeat``, and so **images per second per GPU** (the device step alone) and
   **CPU cores needed per GPU** to feed that rate (``rate x ms / 1000``).
3. **The seed's step split on CUDA**: ``step_split.py --accelerator cuda`` as a subprocess
   (the profiler's table of the demo model, masks rasterised in the loop vs in the workers).

Where coco-mini is absent (a machine with only this checkout) the CC BY fixture's ten real COCO
photos, tiled, stand in (the printout says which). Without CUDA, section 2 times the device step
on the CPU, one thread, and says so: the script then only checks itself.

Run: ``python benchmarks/gpu_check.py [--workers 0 4 8 14] [--images 2048] [--batches 8]
[--no-step-split]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import torch  # noqa: E402

import bench_loader as bl  # noqa: E402  (the rows, split and peer of the loader benchmark)
from seg_datamodule.data.batching.collate import DetectionCollate  # noqa: E402
from seg_datamodule.data.batching.device_pixels import make_pixels  # noqa: E402
from seg_datamodule.transforms.pixel.hsv import hsv_jitter_batch_  # noqa: E402

FIXTURE = HERE.parent / "tests" / "fixtures" / "coco-cc-by"


def coco_root(requested: Path, work: Path) -> tuple[Path, str]:
    """coco-mini, or the CC BY fixture tiled to 80 train images where it is absent."""
    if (requested / "annotations" / "instances_train2017.json").is_file():
        return requested, f"coco-mini ({requested})"
    from _datasets import tile_coco_root

    return tile_coco_root(FIXTURE, work / "tiled", copies=8), "the CC BY fixture's photos, tiled (coco-mini absent)"


def device_ms(ds: bl.SegDataset, batch_size: int, repeat: int, pixels: bool, device: str) -> float:
    """Milliseconds per batch of the device's share of one collated batch (0 when it has none)."""
    batch = DetectionCollate(mask_stride=4)(ds.__getitems__(list(range(batch_size))))
    if batch.hsv_gains is None and batch.pending_pixels is None:
        return 0.0
    gains = batch.hsv_gains.to(device)
    images = None if pixels else batch.images.to(device)

    def step() -> None:
        hsv_jitter_batch_(make_pixels(batch.pending_pixels, device) if pixels else images.clone(), gains)

    step()  # tables, kernels, nvJPEG handles: built once, not timed
    best = float("inf")
    for _ in range(repeat):
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            step()
            end.record()
            torch.cuda.synchronize()
            best = min(best, begin.elapsed_time(end))
        else:
            start = time.thread_time()
            step()
            best = min(best, 1e3 * (time.thread_time() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coco-mini", type=Path, default=Path(os.environ.get("COCO_MINI", bl.DEFAULT_ROOT)))
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="*", default=[0, 4, 8, 14])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--device-repeat", type=int, default=5)
    parser.add_argument("--no-ultralytics", action="store_true")
    parser.add_argument("--no-step-split", action="store_true")
    args = parser.parse_args()
    begun = time.perf_counter()
    bl.keep_freed_memory()
    bl.cv2.setNumThreads(0)
    torch.set_num_threads(1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    root, where = coco_root(args.coco_mini, work)
    ann_file, images = bl.make_large_split(root, work / "split", args.images)
    datasets = {name: bl.build_ours(ann_file, images, 640, partners, hsv, work / "index", pixels_on_device=pixels)
                for name, (partners, hsv, pixels) in bl.OURS.items()}
    peer = None
    if not args.no_ultralytics:
        try:
            os.environ.setdefault("YOLO_CONFIG_DIR", str(work / "ultralytics_config"))
            peer = bl.prepare_ultralytics(ann_file, images, work / "yolo")
        except ImportError:
            print("ultralytics not importable: ours only")
    gpu = torch.cuda.get_device_name() if device == "cuda" else "no CUDA: the device step timed on the CPU, 1 thread"
    print(f"{where}, {args.images} entries, 640 px, batch {args.batch_size}, {os.cpu_count()} CPUs, {gpu}, "
          f"torch {torch.__version__}")

    print(f"1. images/s over {args.batches} batches after {args.warmup} warm-up (the workers' side):")
    for workers in args.workers:
        row = {name: bl.measure_ours(ds, workers, args.batch_size, args.warmup, args.batches)[0]
               for name, ds in datasets.items()}
        if peer is not None:
            row[bl.PEER] = bl.measure_ultralytics(peer, workers, args.batch_size, 640, args.warmup, args.batches)
        print(f"  workers={workers:<3d}" + "  ".join(f"{name}: {value:.0f}" for name, value in row.items()))
        sys.stdout.flush()

    print("2. per mode: workers' CPU ms/image (1 thread), device ms/batch, images/s per GPU, cores per GPU:")
    cpu_peer = None
    if peer is not None:
        udata = bl.ultralytics_dataset(peer, args.batch_size, 640)
        cpu_peer = bl.cpu_ms_per_image(lambda idx: [udata[i] for i in idx], udata.collate_fn, len(udata),
                                       args.batch_size)
        print(f"  {bl.PEER:34s} {cpu_peer:6.2f} ms/image")
    for name, ds in datasets.items():
        ds.on_worker_start()
        cpu = bl.cpu_ms_per_image(ds.__getitems__, DetectionCollate(mask_stride=4), len(ds), args.batch_size)
        dev = device_ms(ds, args.batch_size, args.device_repeat, bl.OURS[name][2], device)
        # A mode that leaves the device nothing is bounded by its workers, not by the GPU ("-").
        rate = f"{args.batch_size * 1e3 / dev:8.0f}" if dev else f"{'-':>8s}"
        cores = f"{args.batch_size * cpu / dev:.1f}" if dev else "-"
        vs = f" ({cpu_peer / cpu:.2f}x less than Ultralytics)" if cpu_peer else ""
        print(f"  {name:34s} {cpu:6.2f} ms/image{vs}   device {dev:8.2f} ms/batch   "
              f"{rate} images/s per GPU   {cores} cores per GPU")
        sys.stdout.flush()

    if not args.no_step_split:
        print("3. the step split (benchmarks/step_split.py):")
        sys.stdout.flush()
        accelerator = "cuda" if device == "cuda" else "cpu"
        subprocess.run([sys.executable, str(HERE / "step_split.py"), "--accelerator", accelerator, "--steps", "20",
                        "--out", str(work / "step_split")], check=False)
    print(f"done in {time.perf_counter() - begun:.0f} s")


if __name__ == "__main__":
    main()
