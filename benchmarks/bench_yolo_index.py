"""Benchmark an Ultralytics dataset's index at COCO scale beside Ultralytics' own label-cache build, and its loader.

Dataset: generated once into ``--workdir`` (default ``<cache>/seg_datamodule/bench-yolo``, never
the repository) and reused: ``--images`` images (default 118,287, train2017's count) in
Ultralytics' layout, ``images/train/<id>.jpg`` small JPEGs (``--size``, distinct files of a few
encoded noise images) and ``labels/train/<id>.txt`` holding the polygons of coco-mini's train
image ``id % 80`` (every non-crowd annotation's first ring, normalised, ``%g`` as Ultralytics'
``convert_coco`` writes them: ~9 lines of ~50 numbers per file), and a ``data.yaml``.

Each measurement runs in a fresh Python process, so times and peak RSS are its own:

1. Ultralytics' label-cache build, cold (its ``labels/train.cache`` removed first): the
   ``YOLODataset`` of the split in validation mode (``verify_image_label`` over every image and
   label file in its thread pool, then the cache written), when ``ultralytics`` is importable;
2. ours, cold (an empty cache folder): :func:`~seg_datamodule.io.yolo.build_yolo_index`, time
   and ratio to (1), peak RSS;

in ``--rounds`` rounds alternating which goes first (the files may be colder for the first
reader); the fastest round is reported with every round's time (``*``: read first). Then once:

3. ours warm (the cache from the last cold build), once per ``index_check`` (``--check``, default
   both: ``files`` stats every label file, ``folders`` only the folders; a first ``folders``
   start records the folders in the cache, untimed), and Ultralytics warm (its cache present);
4. 4 DataLoader workers reading every image's polygons from the index for an epoch: the workers'
   total PSS after the first batch and after the epoch (the COCO index's test, bench_coco_index.py).

``--loader`` instead times the train loader (batch 32, mosaic, ``cache_images=0``, ``--workers``)
on ``--loader-images`` entries linking coco-mini's 80 real train JPEGs, read as this Ultralytics
dataset and as a COCO JSON of exactly the same polygons: img/s of each, interleaved, best of
``--repeat``, and the ratio (the index is the only difference; the goal is equal within noise).

Usage::

    python benchmarks/bench_yolo_index.py                       # full scale (writes ~236k files, ~1.5 GB, once)
    python benchmarks/bench_yolo_index.py --images 2000         # quick run
    python benchmarks/bench_yolo_index.py --check folders       # the warm row of one index_check only
    python benchmarks/bench_yolo_index.py --loader              # the loader comparison
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

COCO_MINI = Path(os.environ.get("COCO_MINI", Path(__file__).resolve().parents[1].parent / "shared/data/coco-mini"))
TRAIN2017_IMAGES = 118_287


def _peak_rss_mib() -> float:
    with open("/proc/self/status") as f:  # VmHWM: ru_maxrss carries over from the parent across exec
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))


def _coco_lines() -> tuple[list[str], list[list[str]], list[tuple[int, int]]]:
    """coco-mini train: category names, each image's label lines (``%g``), each image's (H, W)."""
    data = json.loads((COCO_MINI / "annotations" / "instances_train2017.json").read_text())
    ids = sorted(c["id"] for c in data["categories"])
    label = {c: k for k, c in enumerate(ids)}
    names = {c["id"]: c["name"] for c in data["categories"]}
    images = sorted(data["images"], key=lambda im: im["file_name"])
    lines: dict[int, list[str]] = {im["id"]: [] for im in images}
    size = {im["id"]: (im["width"], im["height"]) for im in images}
    for ann in data["annotations"]:
        if ann.get("iscrowd") or not isinstance(ann["segmentation"], list):
            continue
        w, h = size[ann["image_id"]]
        ring = ann["segmentation"][0]
        coords = [v / (w if k % 2 == 0 else h) for k, v in enumerate(ring)]
        lines[ann["image_id"]].append(" ".join([str(label[ann["category_id"]]), *(f"{v:g}" for v in coords)]))
    return [names[c] for c in ids], [lines[im["id"]] for im in images], [size[im["id"]][::-1] for im in images]


def make_dataset(workdir: Path, images: int, size: int) -> Path:
    """The generated split (see the module docstring); returns its data.yaml."""
    import cv2
    import numpy as np

    root = workdir / f"yolo-{images}-{size}"
    yaml = root / "data.yaml"
    if yaml.is_file():
        return yaml
    names, lines, _ = _coco_lines()
    (root / "images/train").mkdir(parents=True, exist_ok=True)
    (root / "labels/train").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    # Smooth noise: a few KB per JPEG (the images' headers are what an index build reads).
    coarse = [rng.integers(0, 255, (size * 3 // 32 + 1, size // 8 + 1, 3), dtype=np.uint8) for _ in range(8)]
    jpegs = [cv2.imencode(".jpg", cv2.resize(c, (size, size * 3 // 4), interpolation=cv2.INTER_LINEAR))[1].tobytes()
             for c in coarse]
    for k in range(images):
        (root / "images/train" / f"{k:012d}.jpg").write_bytes(jpegs[k % len(jpegs)])
        (root / "labels/train" / f"{k:012d}.txt").write_text("\n".join(lines[k % len(lines)]) + "\n")
    yaml.write_text(f"path: {root}\ntrain: images/train\nval: images/train\nnames: {json.dumps(names)}\n")
    return yaml


# --------------------------------------------------------------------------------------------
# Phases, each in its own process (``--phase NAME``), reporting one JSON line


def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def phase_ultralytics(yaml: Path, _: Path, cold: bool, __: str = "files") -> dict[str, Any]:
    os.environ.setdefault("YOLO_OFFLINE", "1")
    import contextlib
    import io

    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_yolo_dataset

    names = json.loads(yaml.read_text().split("names: ", 1)[1])
    cfg = get_cfg(overrides={"imgsz": 640, "task": "segment", "cache": False, "mask_ratio": 4})
    data = {"names": dict(enumerate(names)), "nc": len(names), "channels": 3}
    if cold:
        (yaml.parent / "labels" / "train.cache").unlink(missing_ok=True)
    rss = _rss_mib()  # imports done: the build alone is timed
    start = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        dataset = build_yolo_dataset(cfg, str(yaml.parent / "images/train"), batch=32, data=data, mode="val",
                                     stride=32)
    return {"seconds": time.perf_counter() - start, "images": len(dataset.labels), "peak_rss_mib": _peak_rss_mib(),
            "rss_growth_mib": _rss_mib() - rss, "instances": sum(len(lb["cls"]) for lb in dataset.labels)}


def phase_ours(yaml: Path, cache_dir: Path, cold: bool, check: str = "files") -> dict[str, Any]:
    from seg_datamodule.io.yolo import build_yolo_index

    if cold:
        shutil.rmtree(cache_dir, ignore_errors=True)
    rss = _rss_mib()
    start = time.perf_counter()
    index = build_yolo_index(yaml, "train", cache_dir=cache_dir, index_check=check)
    seconds = time.perf_counter() - start
    assert index.from_cache != cold
    return {"seconds": seconds, "images": index.num_images, "instances": index.num_instances,
            "peak_rss_mib": _peak_rss_mib(), "rss_growth_mib": _rss_mib() - rss, "index_mib": index.nbytes / 2**20}


def phase_workers(yaml: Path, cache_dir: Path, cold: bool, _: str = "files") -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_coco_index import _PolygonEpoch, _workers_pss

    from seg_datamodule.io.yolo import build_yolo_index

    return _workers_pss(_PolygonEpoch(build_yolo_index(yaml, "train", cache_dir=cache_dir)))


PHASES = {"ultralytics": phase_ultralytics, "ours": phase_ours, "workers": phase_workers}


def _run_phase(name: str, yaml: Path, cache_dir: Path, cold: bool = True, check: str = "files") -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--phase", name, "--yaml", str(yaml), "--cache-dir", str(cache_dir),
           "--check", check]
    out = subprocess.run(cmd + (["--cold"] if cold else []), check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _warm_by_folders(yaml: Path, cache_dir: Path) -> dict[str, Any]:
    """A warm start with ``index_check="folders"``, after one untimed start that records the folders.

    Folders modified within the racy margin of that record would send the timed start the full
    path: a freshly generated split waits that margin out first.
    """
    from seg_datamodule.io.yolo.folder_check import RACY_NS

    root = yaml.parent
    newest = max(os.stat(root / part / "train").st_mtime_ns for part in ("images", "labels"))
    time.sleep(max(0.0, (newest + RACY_NS - time.time_ns()) / 1e9 + 0.1))
    _run_phase("ours", yaml, cache_dir, cold=False, check="folders")
    return _run_phase("ours", yaml, cache_dir, cold=False, check="folders")


def bench_index(yaml: Path, cache_dir: Path, rounds: int, checks: tuple[str, ...] = ("files", "folders")) -> None:
    try:
        import ultralytics  # noqa: F401
        have_ultralytics = True
    except ImportError:
        have_ultralytics = False
        print("ultralytics is not importable: its rows are left out")
    times: dict[str, list[tuple[float, bool]]] = {"ultralytics": [], "ours": []}
    last: dict[str, dict[str, Any]] = {}
    for r in range(rounds):
        order = ["ultralytics", "ours"] if r % 2 == 0 else ["ours", "ultralytics"]
        for k, name in enumerate(order):
            if name == "ultralytics" and not have_ultralytics:
                continue
            last[name] = _run_phase(name, yaml, cache_dir, cold=True)
            times[name].append((last[name]["seconds"], k == 0))
    print(f"{yaml.parent}: {last['ours']['images']} images, {last['ours']['instances']} instances")
    print(f"{'cold build (imports not timed)':32s} {'best s':>8s} {'peak RSS MiB':>13s} {'RSS growth':>11s}   "
          "rounds (* read first)")
    for name in ("ultralytics", "ours"):
        if times[name]:
            rounds_text = ", ".join(f"{s:.2f}{'*' if first else ''}" for s, first in times[name])
            print(f"{name:32s} {min(s for s, _ in times[name]):8.2f} {last[name]['peak_rss_mib']:13.0f} "
                  f"{last[name]['rss_growth_mib']:11.0f}   {rounds_text}")
    if times["ultralytics"]:
        ratio = min(s for s, _ in times["ours"]) / min(s for s, _ in times["ultralytics"])
        print(f"ours / Ultralytics, cold: {ratio:.2f}x (goal: at most 0.5x)")
    for check in checks:
        warm = (_warm_by_folders(yaml, cache_dir) if check == "folders"
                else _run_phase("ours", yaml, cache_dir, cold=False))
        print(f"ours, warm (cached), index_check={check}: {warm['seconds']:.3f} s (goal: under 1 s), "
              f"index {warm['index_mib']:.1f} MiB")
    if have_ultralytics:
        their_warm = _run_phase("ultralytics", yaml, cache_dir, cold=False)["seconds"]
        print(f"Ultralytics, warm (its labels cache): {their_warm:.3f} s")
    workers = _run_phase("workers", yaml, cache_dir, cold=False)
    print(f"4 workers over an epoch of polygons: PSS {workers['pss_start_mib']:.0f} -> {workers['pss_end_mib']:.0f} "
          f"MiB ({workers['growth_pct']:+.1f}%)")


# --------------------------------------------------------------------------------------------
# Loader: the same images and polygons as an Ultralytics dataset and as a COCO JSON


def make_loader_sources(workdir: Path, entries: int) -> tuple[Path, Path, Path]:
    """``entries`` links to coco-mini's train JPEGs with their labels; the data.yaml, a COCO JSON of the
    same polygons (what the YOLO reader computes, float64) and ids, and the image folder."""
    import numpy as np

    root = workdir / f"loader-{entries}"
    yaml, ann, images = root / "data.yaml", root / "same.json", root / "images/train"
    if ann.is_file():
        return yaml, ann, images
    names, lines, sizes = _coco_lines()
    files = sorted((COCO_MINI / "train2017").glob("*.jpg"))
    images.mkdir(parents=True, exist_ok=True)
    (root / "labels/train").mkdir(parents=True, exist_ok=True)
    coco: dict[str, Any] = {"images": [], "annotations": [], "categories": [{"id": k, "name": n}
                                                                            for k, n in enumerate(names)]}
    next_id = 1
    for k in range(entries):
        name = f"{k:012d}.jpg"
        (images / name).symlink_to(files[k % len(files)])
        (root / "labels/train" / f"{k:012d}.txt").write_text("\n".join(lines[k % len(files)]) + "\n")
        h, w = sizes[k % len(files)]
        coco["images"].append({"id": k, "file_name": name, "height": h, "width": w})
        for line in lines[k % len(files)]:
            cls, *tokens = line.split()
            xy = np.array([float(t) for t in tokens]).reshape(-1, 2) * [w, h]
            box = [*xy.min(0).tolist(), *(xy.max(0) - xy.min(0)).tolist()]
            coco["annotations"].append({"id": next_id, "image_id": k, "category_id": int(cls), "iscrowd": 0,
                                        "segmentation": [xy.ravel().tolist()], "bbox": box, "area": 1.0})
            next_id += 1
    yaml.write_text(f"path: {root}\ntrain: images/train\nnames: {json.dumps(names)}\n")
    ann.write_text(json.dumps(coco))
    return yaml, ann, images


def bench_loader(workdir: Path, args: argparse.Namespace) -> None:
    from seg_datamodule import COCOSegDataModule

    yaml, ann, images = make_loader_sources(workdir, args.loader_images)
    common = dict(image_size=640, batch_size=32, num_workers=args.workers, cache_images=0, val_split=None,
                  test_split=None, cache_dir=str(workdir / "loader-cache"), persistent_workers=False)
    sources = {"ultralytics dataset (data.yaml)": dict(dataset=str(yaml)),
               "COCO JSON, same polygons": dict(train_ann=str(ann), train_images=str(images))}
    best: dict[str, float] = {}
    for run in range(args.repeat):
        for name, source in sources.items():
            options = {k: v for k, v in common.items() if "dataset" in source or k not in ("val_split", "test_split")}
            dm = COCOSegDataModule(**options, **source)
            loader = dm.train_dataloader()
            if len(loader) < args.warmup + args.batches:
                raise SystemExit(f"--loader-images {args.loader_images} makes {len(loader)} batches of 32; "
                                 f"--warmup + --batches need {args.warmup + args.batches}")
            loader.sampler.set_epoch(run)
            seen, it = 0, iter(loader)
            for _ in range(args.warmup):
                next(it)
            start = time.perf_counter()
            for _ in range(args.batches):
                seen += len(next(it))
            rate = seen / (time.perf_counter() - start)
            best[name] = max(best.get(name, 0.0), rate)
            del it, loader
    print(f"train loader, {args.loader_images} entries, batch 32, {args.workers} workers, best of {args.repeat}:")
    for name, rate in best.items():
        print(f"  {name:32s} {rate:8.1f} img/s")
    first, second = best.values()
    print(f"ratio data.yaml / COCO JSON: {first / second:.3f} (goal: equal within noise)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=TRAIN2017_IMAGES, help="images of the generated split")
    parser.add_argument("--size", type=int, default=160, help="width of the generated JPEGs (height 3/4 of it)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the datasets and caches go")
    parser.add_argument("--rounds", type=int, default=2, help="cold-build rounds, alternating who reads first")
    parser.add_argument("--loader", action="store_true", help="time the train loader instead")
    parser.add_argument("--loader-images", type=int, default=2048, help="entries of the loader comparison")
    parser.add_argument("--workers", type=int, default=4, help="loader workers")
    parser.add_argument("--batches", type=int, default=20, help="loader batches timed")
    parser.add_argument("--warmup", type=int, default=3, help="loader batches before the timer")
    parser.add_argument("--repeat", type=int, default=3, help="loader runs per source")
    parser.add_argument("--check", choices=["files", "folders"], default=None,
                        help="the warm row of this index_check only (default: both)")
    parser.add_argument("--phase", choices=sorted(PHASES), help=argparse.SUPPRESS)
    parser.add_argument("--yaml", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(PHASES[args.phase](args.yaml, args.cache_dir, args.cold, args.check or "files")))
        return
    from seg_datamodule.io.paths import cache_root

    workdir = args.workdir or cache_root() / "bench-yolo"
    if args.loader:
        bench_loader(workdir, args)
        return
    yaml = make_dataset(workdir, args.images, args.size)
    bench_index(yaml, workdir / f"cache-{args.images}", args.rounds,
                ("files", "folders") if args.check is None else (args.check,))


if __name__ == "__main__":
    main()
