"""Crowded scenes: how a batch's CPU cost grows with the instances per image, ours and Ultralytics'.

Dataset: coco-mini's 80 train JPEGs repeated through ``--images`` entries (nothing fits a cache),
each entry given exactly ``N`` instances for ``N`` in ``--counts`` (12 to 384 by default): real
coco-mini polygons, cycled through in a seeded order, each scaled by a seeded factor (so that it
covers 1-6 % of its image, about the size of a crowded scene's people or cars) and placed at a seeded
spot inside the image. The JPEGs, the recipe and every draw are the same for every ``N``; only the
instances change.

Ours: the loader of ``benchmarks/bench_loader.py`` (640 mosaic, batch 32, YOLO's albumentations
steps, HSV jitter in the workers, ``cache_images=0``). Peer (when ``ultralytics`` imports): its
segmentation loader with ``cache=False`` over the same annotations converted by its
``convert_coco``, in the same run. Each: single-thread CPU ms per output image (a batch of samples
plus its collate, best of ``--repeat`` batches), printed with its growth from the smallest ``N``.
The instances kept on an output canvas (mosaic: parts of four images, after clipping and
drops) are printed under each count. What it shows: that per-instance work (polygon transport, exact rasterising) stays small next to
the per-image work (decode, warp, jitter), so a crowded scene costs little more than a sparse one.

Run: ``python benchmarks/bench_crowded.py [--counts 12 48 192 384] [--images 512] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_loader as B  # noqa: E402  (the same loader, peer and timer)

from seg_datamodule.data.batching.allocator import keep_freed_memory  # noqa: E402
from seg_datamodule.data.batching.collate import DetectionCollate  # noqa: E402


def _polygon_pool(root: Path) -> list[list[np.ndarray]]:
    """coco-mini's non-crowd polygon instances, each a list of ``(K, 2)`` rings, centred on 0."""
    data = json.loads((root / "annotations" / "instances_train2017.json").read_text())
    pool = []
    for ann in data["annotations"]:
        if ann["iscrowd"] or not isinstance(ann["segmentation"], list):
            continue
        rings = [np.asarray(r, np.float64).reshape(-1, 2) for r in ann["segmentation"] if len(r) >= 6]
        if rings:
            allv = np.concatenate(rings)
            centre = (allv.min(0) + allv.max(0)) / 2
            pool.append([r - centre for r in rings])
    return pool


def make_crowded_split(root: Path, work: Path, num_images: int, count: int) -> tuple[Path, Path]:
    """:func:`bench_loader.make_large_split`'s entries, each with exactly ``count`` instances."""
    ann_file, folder = B.make_large_split(root, work, num_images)
    data = json.loads(ann_file.read_text())
    pool = _polygon_pool(root)
    rng = np.random.default_rng(0)
    anns = []
    for im in data["images"]:
        w, h = im["width"], im["height"]
        for j in range(count):
            rings = pool[int(rng.integers(len(pool)))]
            allv = np.concatenate(rings)
            span = float(np.max(allv.max(0) - allv.min(0))) or 1.0
            side = np.sqrt(rng.uniform(0.01, 0.06) * w * h)  # 1-6 % of the image's area
            scale = side / span
            centre = rng.uniform([side / 2, side / 2], [w - side / 2, h - side / 2])
            seg = [(r * scale + centre).clip([0, 0], [w, h]).round(2).ravel().tolist() for r in rings]
            allv = np.concatenate([np.asarray(s).reshape(-1, 2) for s in seg])
            x0, y0 = allv.min(0)
            x1, y1 = allv.max(0)
            anns.append({"id": len(anns) + 1, "image_id": im["id"], "category_id": data["categories"][j % 80]["id"],
                         "segmentation": seg, "iscrowd": 0, "bbox": [x0, y0, x1 - x0, y1 - y0],
                         "area": float((x1 - x0) * (y1 - y0)) / 2})
    ann_file.write_text(json.dumps(dict(data, annotations=anns)))
    return ann_file, folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coco-mini", type=Path, default=Path(os.environ.get("COCO_MINI", B.DEFAULT_ROOT)))
    parser.add_argument("--counts", type=int, nargs="+", default=[12, 48, 192, 384])
    parser.add_argument("--images", type=int, default=512, help="entries of each generated split")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--no-ultralytics", action="store_true")
    args = parser.parse_args()
    keep_freed_memory()  # as bench_loader's default: both sides alike
    cv2.setNumThreads(0)
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench_crowded_"))
    rows: dict[str, dict[int, float]] = {"ours": {}}
    per_output: dict[int, float] = {}  # instances on an output canvas (a mosaic shows parts of 4 images)
    try:
        for count in args.counts:
            ann, images = make_crowded_split(args.coco_mini, work / f"n{count}", args.images, count)
            ds = B.build_ours(ann, images, 640, "batch", False, work / f"n{count}" / "index")
            ds.on_worker_start()
            kept = DetectionCollate(mask_stride=4)(ds.__getitems__(list(range(args.batch_size)))).boxes_per_image
            per_output[count] = float(kept.double().mean())
            rows["ours"][count] = B.cpu_ms_per_image(ds.__getitems__, DetectionCollate(mask_stride=4), len(ds),
                                                     args.batch_size, args.repeat)
            if not args.no_ultralytics:
                try:
                    os.environ.setdefault("YOLO_CONFIG_DIR", str(work / "ultralytics_config"))
                    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                        peer = B.prepare_ultralytics(ann, images, work / f"n{count}" / "yolo")
                        udata = B.ultralytics_dataset(peer, args.batch_size, 640)
                        ms = B.cpu_ms_per_image(lambda idx: [udata[i] for i in idx], udata.collate_fn, len(udata),
                                                args.batch_size, args.repeat)
                    rows.setdefault(B.PEER, {})[count] = ms
                except ImportError:
                    args.no_ultralytics = True
                    print("ultralytics not importable: measuring ours only")
        print(f"crowded scenes: {args.images} entries of coco-mini train per count, 640 mosaic, batch "
              f"{args.batch_size}, HSV jitter in the workers, single-thread CPU ms per image, best of {args.repeat} "
              f"batches; {os.cpu_count()} CPUs, torch {torch.__version__}, opencv {cv2.__version__}")
        low = args.counts[0]
        print(f"  {'instances per image':22s}" + "".join(f"{c:>16d}" for c in args.counts))
        print(f"  {'  per output canvas':22s}" + "".join(f"{per_output[c]:>16.0f}" for c in args.counts))
        for name, row in rows.items():
            cells = "".join(f"{row[c]:8.2f} ({row[c] / row[low]:.2f}x)" for c in args.counts)
            print(f"  {name:22s}{cells}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
