"""End-to-end train-loader throughput on coco-mini at 640 with mosaic on: this project vs Ultralytics.

Ours: ``CocoIndex`` -> ``SegDataset`` (4-image mosaic, random affine, flip, a YOLO-recipe
albumentations pipeline, exact polygon clip) -> ``DetectionCollate`` (stride-4 masks), in a
DataLoader of batch 32. Peer: Ultralytics' segmentation loader (``imgsz=640, mosaic=1.0,
mask_ratio=4, overlap_mask=False``, batch 32, its default hyper-parameters) on the same images,
with labels converted from the same JSON by ``ultralytics.data.converter.convert_coco``; measured
in the same run when ``ultralytics`` is importable (install it outside the project environment,
e.g. ``pip install --target /tmp/ultra --no-deps ultralytics`` and ``PYTHONPATH=/tmp/ultra``; it
is never a dependency).

Both sides do the same work per image: decode (or take from a per-worker cache), mosaic, affine,
HSV jitter plus Blur / MedianBlur / ToGray / CLAHE at p=0.01, flip, polygon handling, masks at
stride 4, collate. Ultralytics keeps a buffer of recently decoded images per worker
(``min(n, 8 * batch, 1000)`` images: all 80 of coco-mini) and draws the three mosaic partners
from it, so on any dataset a mosaic decodes at most one new image. Ours draws partners uniformly
over the dataset (so a sample does not depend on which worker built it) and decodes every
visible tile unless its cache holds it. Rows: ours without a cache (``cache_images=0``) against
Ultralytics without its buffer (partners uniform, every tile decoded: the same work), and ours
with a cache of the buffer's size (``cache_images=80``) against Ultralytics as it ships.

Timing: after ``--warmup`` batches (worker start-up, cache fill), images per second over
``--batches`` batches, best of ``--repeat`` runs, the contenders interleaved run by run (the
machine may be shared: the spread of the runs is printed). OpenCV is set to one thread in the main process
too (Ultralytics does this on import), and ``--breakdown`` splits our single-thread CPU time
into stages (CPU time, so other load on the machine inflates it less than wall time).

Run: ``python benchmarks/bench_loader.py [--coco-mini PATH] [--workers 0 2] [--breakdown]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("OMP_NUM_THREADS", "1")

import albumentations as A
import cv2
import torch
from torch.utils.data import DataLoader, RandomSampler

import seg_datamodule.data.dataset as dataset_module
from seg_datamodule.transforms.albu import RandomHSV
from seg_datamodule.io.coco.index import CocoIndex
from seg_datamodule.data.collate import DetectionCollate
from seg_datamodule.data.dataset import SegDataset, worker_init_fn

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "coco-mini"


def yolo_recipe() -> A.Compose:
    """Ultralytics' default pixel augmentations as an albumentations pipeline."""
    return A.Compose([
        RandomHSV(hgain=0.015, sgain=0.7, vgain=0.4, p=1.0),
        A.Blur(p=0.01),
        A.MedianBlur(p=0.01),
        A.ToGray(p=0.01),
        A.CLAHE(p=0.01),
    ])


def _batch_len(batch: Any) -> int:
    """Images in a batch: ours (``DetectionBatch``) or Ultralytics' (a dict with ``img``)."""
    return len(batch["img"]) if isinstance(batch, dict) else len(batch)


def _time_batches(batches: Iterator[Any], warmup: int, count: int) -> float:
    """Images per second over ``count`` batches after ``warmup`` batches.

    Counts the images each batch really holds: Ultralytics' loader ends each pass over the 80
    images with a batch of 16.
    """
    for _ in range(warmup):
        next(batches)
    images = 0
    start = time.perf_counter()
    for _ in range(count):
        images += _batch_len(next(batches))
    return images / (time.perf_counter() - start)


# ----------------------------------------------------------------------------- ours


def build_ours(root: Path, image_size: int, cache_images: int, cache_dir: Path) -> SegDataset:
    index = CocoIndex.build(root / "annotations" / "instances_train2017.json", root / "train2017",
                            cache_dir=cache_dir)
    return SegDataset(index, image_size=image_size, mosaic=1.0, transforms=yolo_recipe(),
                      cache_images=cache_images, seed=0)


def measure_ours(ds: SegDataset, workers: int, batch_size: int, warmup: int, count: int) -> float:
    total = batch_size * (warmup + count)
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        sampler=RandomSampler(ds, num_samples=total, generator=torch.Generator().manual_seed(0)),
        num_workers=workers,
        collate_fn=DetectionCollate(mask_stride=4),
        worker_init_fn=worker_init_fn if workers else None,
    )
    ds.on_worker_start()  # an empty cache for the main process too
    return _time_batches(iter(loader), warmup, count)


@contextlib.contextmanager
def stage_timer() -> Iterator[dict[str, float]]:
    """Time our stages in this process by wrapping the functions the dataset calls."""
    totals: dict[str, float] = defaultdict(float)
    patched: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str, stage: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                totals[stage] += time.thread_time() - t

        patched.append((owner, name, original))
        setattr(owner, name, timed)

    wrap(CocoIndex, "load_image", "decode (libjpeg)")
    wrap(dataset_module, "warp_tiles", "warp (one resample per tile, crowd masks)")
    wrap(dataset_module, "transform_polygons", "polygons (clip, map, clip)")
    wrap(dataset_module, "drop_reasons", "polygons (clip, map, clip)")
    wrap(dataset_module.AlbumentationsTransform, "__call__", "albumentations (HSV, blur, ...)")
    wrap(CocoIndex, "crowd_mask", "crowd RLE decode")
    wrap(DetectionCollate, "__call__", "collate (stride-4 masks, stack)")
    try:
        yield totals
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)


def breakdown(ds: SegDataset, batch_size: int, batches: int) -> None:
    collate = DetectionCollate(mask_stride=4)
    gen = torch.Generator().manual_seed(1)
    order = torch.randint(0, len(ds), (batch_size * batches,), generator=gen).tolist()
    ds.on_worker_start()
    for i in order[:batch_size]:  # warm the cache as the timed loaders do
        ds[i]
    with stage_timer() as totals:
        start = time.thread_time()
        for b in range(batches):
            collate([ds[i] for i in order[b * batch_size : (b + 1) * batch_size]])
        wall = time.thread_time() - start
    n = batch_size * batches
    print(f"  where the CPU time goes (one thread, cache_images={ds.cache_images}, {n} images, "
          f"{1e3 * wall / n:.2f} ms/image):")
    other = wall - sum(totals.values())
    for stage, t in sorted(totals.items(), key=lambda kv: -kv[1]) + [("other (draws, Python)", other)]:
        print(f"    {stage:44s} {1e3 * t / n:6.2f} ms/image  {100 * t / wall:5.1f} %")


# ----------------------------------------------------------------------------- ultralytics


def prepare_ultralytics(root: Path, work: Path) -> Path:
    """YOLO-format copy of coco-mini train (image symlinks, labels from convert_coco)."""
    from ultralytics.data.converter import convert_coco

    ann_dir = work / "annotations"
    ann_dir.mkdir(parents=True)
    shutil.copy(root / "annotations" / "instances_train2017.json", ann_dir)
    out = work / "converted"
    with contextlib.redirect_stdout(io.StringIO()):
        convert_coco(labels_dir=str(ann_dir), save_dir=str(out), use_segments=True, cls91to80=True)
    images = out / "images" / "train2017"
    images.mkdir(parents=True)
    for f in (root / "train2017").iterdir():
        (images / f.name).symlink_to(f)
    return images


def measure_ultralytics(images: Path, workers: int, batch_size: int, image_size: int, warmup: int,
                        count: int, buffer: bool = True) -> float:
    from ultralytics.data.build import build_dataloader

    dataset = ultralytics_dataset(images, batch_size, image_size, buffer)
    loader = build_dataloader(dataset, batch=batch_size, workers=workers, shuffle=True, pin_memory=False,
                              device="cpu")

    def forever() -> Iterator[Any]:
        while True:
            yield from loader

    return _time_batches(forever(), warmup, count)


# ----------------------------------------------------------------------------- CPU time


def cpu_ms_per_image(get: Any, collate: Any, n: int, batch_size: int, repeat: int = 7) -> float:
    """Single-thread CPU ms per image (sample + collate), the best of ``repeat`` passes.

    CPU time of one thread, unlike wall time, barely moves when other processes share the
    machine, so this ratio is the stable one; the wall-clock loader figures above are the goal.
    """
    best = float("inf")
    for r in range(repeat):
        start = time.thread_time()
        collate([get((r * batch_size + j) % n) for j in range(batch_size)])
        best = min(best, (time.thread_time() - start) / batch_size * 1e3)
    return best


def _ultralytics_mosaics(transform: Any) -> Iterator[Any]:
    """Every ``Mosaic`` inside Ultralytics' nested transforms."""
    from ultralytics.data.augment import Mosaic

    if isinstance(transform, Mosaic):
        yield transform
    for child in getattr(transform, "transforms", None) or []:
        yield from _ultralytics_mosaics(child)
    if getattr(transform, "pre_transform", None) is not None:
        yield from _ultralytics_mosaics(transform.pre_transform)


def ultralytics_dataset(images: Path, batch_size: int, image_size: int, buffer: bool = True) -> Any:
    """Ultralytics' training dataset.

    With ``buffer=False`` it works as ours does without a cache: mosaic partners drawn uniformly
    from the whole dataset (``Mosaic.buffer_enabled = False``; by default Ultralytics draws them
    from its buffer of recently decoded images, so a mosaic decodes one new image, not four) and
    no decoded image kept (``max_buffer_length = 2`` keeps one).
    """
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_yolo_dataset

    cfg = get_cfg(overrides={"imgsz": image_size, "mosaic": 1.0, "mask_ratio": 4, "overlap_mask": False,
                             "task": "segment", "cache": False})
    data = {"names": {i: str(i) for i in range(80)}, "nc": 80, "channels": 3}
    dataset = build_yolo_dataset(cfg, str(images), batch=batch_size, data=data, mode="train", stride=32)
    if not buffer:
        dataset.max_buffer_length = 2  # BaseDataset.load_image then keeps one image
        for mosaic in _ultralytics_mosaics(dataset.transforms):
            mosaic.buffer_enabled = False
    return dataset


# ----------------------------------------------------------------------------- main

#: The peer rows: Ultralytics as it ships (a buffer of decoded images that mosaic partners come
#: from), and without the buffer (partners uniform over the dataset, every tile decoded, as ours).
PEERS = {"ultralytics": True, "ultralytics no buffer": False}


def _ratio(name: str, row: dict[str, float], value: float, inverse: bool = False) -> str:
    """Ours against the peer that caches alike: no cache <-> no buffer, a cache <-> its buffer."""
    if not name.startswith("ours"):
        return ""
    peer = "ultralytics no buffer" if name.endswith("cache_images=0") else "ultralytics"
    if peer not in row:
        return ""
    ratio = row[peer] / value if inverse else value / row[peer]
    return f"  ({ratio:.2f}x {peer})"



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coco-mini", type=Path, default=Path(os.environ.get("COCO_MINI", DEFAULT_ROOT)))
    parser.add_argument("--image-size", type=int, default=640)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="*", default=[0, 2])
    parser.add_argument("--cache-images", type=int, nargs="+", default=[0, 80])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--no-ultralytics", action="store_true")
    parser.add_argument("--breakdown", action="store_true")
    args = parser.parse_args()

    cv2.setNumThreads(0)
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench_loader_"))
    try:
        datasets = {c: build_ours(args.coco_mini, args.image_size, c, work / "index") for c in args.cache_images}
        peer: Path | None = None
        if not args.no_ultralytics:
            try:
                os.environ.setdefault("YOLO_CONFIG_DIR", str(work / "ultralytics_config"))
                import ultralytics

                peer = prepare_ultralytics(args.coco_mini, work / "yolo")
                print(f"ultralytics {ultralytics.__version__} from {Path(ultralytics.__file__).parent}")
            except ImportError:
                print("ultralytics not importable: measuring ours only")
        print(f"coco-mini train ({len(next(iter(datasets.values())))} images), imgsz {args.image_size}, "
              f"batch {args.batch_size}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
              f"albumentations {A.__version__}, opencv {cv2.__version__}")
        print(f"images/s over {args.batches} batches after {args.warmup} warm-up, best of {args.repeat}")
        for workers in args.workers:
            # Interleave the contenders repeat by repeat, so load from elsewhere hits both alike.
            runs: dict[str, list[float]] = defaultdict(list)
            for _ in range(args.repeat):
                for c, ds in datasets.items():
                    runs[f"ours cache_images={c}"].append(
                        measure_ours(ds, workers, args.batch_size, args.warmup, args.batches))
                if peer is not None:
                    for name, buffer in PEERS.items():
                        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                            runs[name].append(measure_ultralytics(peer, workers, args.batch_size, args.image_size,
                                                                  args.warmup, args.batches, buffer))
            row = {name: max(values) for name, values in runs.items()}
            for name, value in row.items():
                spread = ", ".join(f"{v:.0f}" for v in runs[name])
                print(f"  workers={workers}  {name:30s} {value:7.1f} img/s{_ratio(name, row, value)}   "
                      f"[runs: {spread}]")
            sys.stdout.flush()

        # Single-thread CPU per image, warm caches / buffers on both sides.
        print("single-thread CPU time per image (sample + collate), best of 7 batches:")
        cpu: dict[str, float] = {}
        for c, ds in datasets.items():
            collate = DetectionCollate(mask_stride=4)
            ds.on_worker_start()
            for i in range(2 * len(ds)):
                ds[i % len(ds)]
            cpu[f"ours cache_images={c}"] = cpu_ms_per_image(ds.__getitem__, collate, len(ds), args.batch_size)
        if peer is not None:
            for name, buffer in PEERS.items():
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    udata = ultralytics_dataset(peer, args.batch_size, args.image_size, buffer)
                    for i in range(2 * len(udata)):
                        udata[i % len(udata)]
                    cpu[name] = cpu_ms_per_image(udata.__getitem__, udata.collate_fn, len(udata), args.batch_size)
        for name, value in cpu.items():
            print(f"  {name:30s} {value:6.2f} ms/image{_ratio(name, cpu, value, inverse=True)}")
        if args.breakdown:
            for ds in datasets.values():
                breakdown(ds, args.batch_size, args.batches)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
