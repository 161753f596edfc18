"""Benchmark the COCO index at train2017 scale, beside pycocotools, and the image decoders.

A train2017-sized annotation file (about 118k images, 1.09M annotations, ~630 MB) is made by
replicating coco-mini's train annotations with new image and annotation ids (file names are
kept, so every entry points at a real image). It is written once into ``--workdir`` (default
``<cache>/seg_datamodule/bench``, never into the repository) and reused.

Each measurement runs in a fresh Python process so that times and peak RSS are its own:

1. pycocotools ``COCO(ann_file)``: time, peak RSS;
2. our cold build (empty cache dir): time and ratio to (1), peak RSS;

(1) and (2) both read the whole JSON, and whichever reads it first after it was written or
evicted may find it colder in the page cache. They run in ``--rounds`` rounds (default 2) that
alternate which goes first (round 1: pycocotools first, round 2: ours first, ...); each row gives
the fastest round and every round's time, first readers marked ``*``, so an order effect shows.

Then, once:

3. our warm start (cached index, after the last round's cold build): time, the index's array
   bytes, RSS;
4. 4 DataLoader workers iterating a full epoch over the index (reading polygons, no image
   decoding): the workers' total PSS after the first batch and after the epoch, growth %.
   ``--baseline-workers`` runs the same epoch over a pycocotools ``COCO`` object (what a
   list-of-dicts dataset does) for contrast; it needs a lot of memory, use it with a small scale.

``--decoders`` times JPEG decoding of coco-mini's images (OpenCV, torchvision, PIL; full and
reduced) on one thread.

Usage::

    python benchmarks/bench_coco_index.py                 # full scale
    python benchmarks/bench_coco_index.py --scale 0.05    # quick run
    python benchmarks/bench_coco_index.py --decoders
    python benchmarks/bench_coco_index.py --cold-only     # the peak-RSS comparison alone
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

COCO_MINI = Path(
    os.environ.get("COCO_MINI", Path(__file__).resolve().parents[1].parent / "shared/data/coco-mini")
)
TRAIN2017_IMAGES = 118_287


def _peak_rss_mib() -> float:
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork + exec.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB elsewhere


def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


# --------------------------------------------------------------------------------------------
# The big annotation file


def make_big_json(workdir: Path, scale: float) -> tuple[Path, int]:
    """Replicate coco-mini train annotations to ``scale`` x train2017's image count."""
    src = COCO_MINI / "annotations" / "instances_train2017.json"
    data = json.loads(src.read_text())
    replicas = max(1, math.ceil(TRAIN2017_IMAGES * scale / len(data["images"])))
    out = workdir / f"instances_x{replicas}.json"
    if out.is_file():
        return out, replicas
    workdir.mkdir(parents=True, exist_ok=True)
    # Templates: every field but the ids serialised once; ids formatted in per replica.
    image_templates = []
    new_index = {}
    for k, img in enumerate(data["images"]):
        rest = {key: v for key, v in img.items() if key != "id"}
        image_templates.append('{"id": %d, ' + json.dumps(rest)[1:])
        new_index[img["id"]] = k
    ann_templates = []
    for ann in data["annotations"]:
        rest = {key: v for key, v in ann.items() if key not in ("id", "image_id")}
        template = '{"id": %d, "image_id": %d, ' + json.dumps(rest)[1:]
        ann_templates.append((new_index[ann["image_id"]], template))
    n_img, n_ann = len(image_templates), len(ann_templates)
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w", buffering=1 << 22) as f:
        f.write('{"info": {"description": "coco-mini replicated for benchmarking"}, "licenses": [], ')
        f.write('"categories": ' + json.dumps(data["categories"]) + ', "images": [')
        for r in range(replicas):
            base = r * n_img + 1
            f.write(("," if r else "") + ",".join(t % (base + k) for k, t in enumerate(image_templates)))
        f.write('], "annotations": [')
        for r in range(replicas):
            base_img, base_ann = r * n_img + 1, r * n_ann + 1
            f.write(
                ("," if r else "")
                + ",".join(t % (base_ann + k, base_img + i) for k, (i, t) in enumerate(ann_templates))
            )
        f.write("]}")
    os.replace(tmp, out)
    return out, replicas


# --------------------------------------------------------------------------------------------
# Phases, each run in its own process (``--phase NAME``), reporting one JSON line


def phase_pycocotools(ann_file: Path, _: Path) -> dict[str, Any]:
    import contextlib
    import io

    from pycocotools.coco import COCO

    rss_imported = _rss_mib()
    start, cpu = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(ann_file))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "cpu_seconds": time.process_time() - cpu, "peak_rss_mib": _peak_rss_mib(),
            "annotations": len(coco.anns), "rss_imported_mib": rss_imported}


def phase_cold(ann_file: Path, cache_dir: Path) -> dict[str, Any]:
    from seg_datamodule.io.coco.index import CocoIndex

    rss_imported = _rss_mib()  # Python + torch (imported by the package), before the build
    shutil.rmtree(cache_dir, ignore_errors=True)
    start, cpu = time.perf_counter(), time.process_time()
    index = CocoIndex.build(ann_file, COCO_MINI / "train2017", cache_dir=cache_dir)
    seconds = time.perf_counter() - start
    assert not index.from_cache
    return {
        "seconds": seconds,
        "cpu_seconds": time.process_time() - cpu,
        "peak_rss_mib": _peak_rss_mib(),
        "rss_after_mib": _rss_mib(),
        "rss_imported_mib": rss_imported,
        "images": index.num_images,
        "instances": index.num_instances,
        "crowd": index.num_crowd,
        "vertices": int(index._t["vertices"].shape[0]),
        "cache_mib": index.cache_path.stat().st_size / 2**20 if index.cache_path else None,
    }


def phase_warm(ann_file: Path, cache_dir: Path) -> dict[str, Any]:
    rss_before = _rss_mib()
    from seg_datamodule.io.coco.index import CocoIndex

    rss_imported = _rss_mib()
    start = time.perf_counter()
    index = CocoIndex.build(ann_file, COCO_MINI / "train2017", cache_dir=cache_dir)
    seconds = time.perf_counter() - start
    assert index.from_cache
    return {
        "seconds": seconds,
        "index_mib": index.nbytes / 2**20,
        "rss_growth_mib": _rss_mib() - rss_imported,
        "rss_python_mib": rss_before,
        "rss_after_mib": _rss_mib(),
    }


class _PolygonEpoch:
    """A Dataset reading each image's polygons from the index (no image decoding)."""

    def __init__(self, index: Any) -> None:
        self.index = index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple[int, int, int]:
        polygons, labels, ann_ids = self.index.polygons(i), self.index.labels(i), self.index.annotation_ids(i)
        vertices, rings, instances = polygons.arrays
        crowd = self.index.crowd_counts[i]
        return len(vertices), len(labels), int(crowd)


class _CocoEpoch:
    """The same epoch over a pycocotools COCO object: lists of dicts, touched per item."""

    def __init__(self, coco: Any) -> None:
        self.coco = coco
        self.ids = list(coco.imgs)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[int, int, int]:
        anns = self.coco.imgToAnns[self.ids[i]]
        verts = sum(len(r) // 2 for a in anns if not a["iscrowd"] for r in a["segmentation"])
        return verts, sum(1 for a in anns if not a["iscrowd"]), sum(1 for a in anns if a["iscrowd"])


def _sum_collate(items: list[tuple[int, int, int]]) -> tuple[int, int, int]:
    return tuple(sum(x) for x in zip(*items))  # type: ignore[return-value]


def _workers_pss(dataset: Any, num_workers: int = 4) -> dict[str, Any]:
    import psutil
    import torch

    loader = torch.utils.data.DataLoader(
        dataset, batch_size=64, num_workers=num_workers, persistent_workers=True,
        collate_fn=_sum_collate, multiprocessing_context="fork",
    )
    me = psutil.Process()

    def pss() -> float:
        return sum(p.memory_full_info().pss for p in me.children()) / 2**20

    start = time.perf_counter()
    it = iter(loader)
    totals = list(next(it))
    pss_start = pss()
    for v, n, c in it:
        totals[0] += v
        totals[1] += n
        totals[2] += c
    pss_end = pss()
    seconds = time.perf_counter() - start
    del it, loader
    return {
        "workers": num_workers,
        "pss_start_mib": pss_start,
        "pss_end_mib": pss_end,
        "growth_pct": 100 * (pss_end - pss_start) / pss_start,
        "epoch_seconds": seconds,
        "vertices": totals[0],
        "instances": totals[1],
        "crowd": totals[2],
        "main_pss_mib": me.memory_full_info().pss / 2**20,
    }


def phase_workers(ann_file: Path, cache_dir: Path) -> dict[str, Any]:
    from seg_datamodule.io.coco.index import CocoIndex

    index = CocoIndex.build(ann_file, COCO_MINI / "train2017", cache_dir=cache_dir)
    return _workers_pss(_PolygonEpoch(index))


def phase_baseline_workers(ann_file: Path, _: Path) -> dict[str, Any]:
    import contextlib
    import io

    from pycocotools.coco import COCO

    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(ann_file))
    return _workers_pss(_CocoEpoch(coco))


PHASES = {
    "pycocotools": phase_pycocotools,
    "cold": phase_cold,
    "warm": phase_warm,
    "workers": phase_workers,
    "baseline_workers": phase_baseline_workers,
}


def _run_phase(name: str, ann_file: Path, cache_dir: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--phase", name, "--ann-file", str(ann_file),
           "--cache-dir", str(cache_dir)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------
# Decoders


def bench_decoders(reps: int = 5) -> None:
    import io
    import warnings

    import cv2
    import numpy as np
    import torch
    from PIL import Image
    from torchvision.io import ImageReadMode, decode_jpeg

    from seg_datamodule.io.images.decode import decode_image_bytes

    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    files = sorted((COCO_MINI / "train2017").glob("*.jpg"))
    datas = [f.read_bytes() for f in files]
    tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]

    def pil(d: bytes, r: int) -> np.ndarray:
        im = Image.open(io.BytesIO(d))
        if r > 1:
            im.draft("RGB", (im.width // r, im.height // r))
        return np.asarray(im.convert("RGB"))

    def cv(d: bytes, r: int) -> np.ndarray:
        flag = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
                8: cv2.IMREAD_REDUCED_COLOR_8}[r]
        bgr = cv2.imdecode(np.frombuffer(d, np.uint8), flag | cv2.IMREAD_IGNORE_ORIENTATION)
        return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)

    def tv(k: int) -> np.ndarray:
        return decode_jpeg(tensors[k], mode=ImageReadMode.RGB).permute(1, 2, 0).contiguous().numpy()

    def timeit(fn: Any) -> float:
        best = math.inf
        for _ in range(reps):
            start = time.perf_counter()
            for k, d in enumerate(datas):
                fn(k, d)
            best = min(best, time.perf_counter() - start)
        return 1e3 * best / len(datas)

    print(f"decoding {len(datas)} coco-mini JPEGs, one thread, best of {reps}, ms per image")
    print(f"{'decoder':44s} {'r=1':>6s} {'r=2':>6s} {'r=4':>6s} {'r=8':>6s}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = [
            ("cv2.imdecode (+ BGR->RGB)", lambda r: (lambda k, d: cv(d, r))),
            ("PIL (Image.draft when reduced)", lambda r: (lambda k, d: pil(d, r))),
            ("seg_datamodule.images.decode_image_bytes",
             lambda r: (lambda k, d: decode_image_bytes(d, reduce=r))),
        ]
        for name, make in rows:
            print(f"{name:44s} " + " ".join(f"{timeit(make(r)):6.2f}" for r in (1, 2, 4, 8)))
        chw = timeit(lambda k, d: decode_jpeg(tensors[k], mode=ImageReadMode.RGB))
        print(f"{'torchvision.io.decode_jpeg (CHW tensor)':44s} {chw:6.2f}   (no reduced decode)")
        print(f"{'torchvision.io.decode_jpeg -> HWC numpy':44s} {timeit(lambda k, d: tv(k)):6.2f}")
    # Same pixels?
    a, b = cv(datas[0], 1), pil(datas[0], 1)
    c = tv(0)
    print(f"max |cv2 - PIL| = {abs(a.astype(int) - b).max()}, "
          f"max |cv2 - torchvision| = {abs(a.astype(int) - c).max()}")


# --------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of train2017's 118k images")
    parser.add_argument("--workdir", type=Path, default=None, help="where the big JSON and the cache go")
    parser.add_argument("--baseline-workers", action="store_true",
                        help="also the worker epoch over pycocotools' COCO")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of pycocotools vs cold build, alternating which reads the JSON first")
    parser.add_argument("--decoders", action="store_true", help="time the image decoders instead")
    parser.add_argument("--cold-only", action="store_true",
                        help="only pycocotools and the cold build (the memory comparison)")
    parser.add_argument("--phase", choices=sorted(PHASES), help=argparse.SUPPRESS)
    parser.add_argument("--ann-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.phase:
        print(json.dumps(PHASES[args.phase](args.ann_file, args.cache_dir)))
        return
    if not (COCO_MINI / "annotations" / "instances_train2017.json").is_file():
        sys.exit(f"coco-mini not found at {COCO_MINI} (set COCO_MINI)")
    if args.decoders:
        bench_decoders()
        return

    from seg_datamodule.io.coco.index import default_cache_dir

    workdir = args.workdir or default_cache_dir().parent / "bench"
    start = time.perf_counter()
    ann_file, replicas = make_big_json(workdir, args.scale)
    size_mib = ann_file.stat().st_size / 2**20
    print(f"annotation file {ann_file} ({size_mib:.0f} MiB, coco-mini train x{replicas}; "
          f"ready in {time.perf_counter() - start:.1f} s)")
    cache_dir = Path(tempfile.mkdtemp(prefix="bench_cache_", dir=workdir))
    refs: list[dict[str, Any]] = []
    colds: list[dict[str, Any]] = []
    try:
        for r in range(max(1, args.rounds)):
            # Alternate who reads the JSON first: an order effect then shows in the rounds.
            order = ("pycocotools", "cold") if r % 2 == 0 else ("cold", "pycocotools")
            for name in order:
                result = _run_phase(name, ann_file, cache_dir)
                result["first"] = name == order[0]
                (refs if name == "pycocotools" else colds).append(result)
        ref = min(refs, key=lambda x: x["seconds"])
        cold = min(colds, key=lambda x: x["seconds"])
        warm = None if args.cold_only else _run_phase("warm", ann_file, cache_dir)
        workers = None if args.cold_only else _run_phase("workers", ann_file, cache_dir)
        base = _run_phase("baseline_workers", ann_file, cache_dir) if args.baseline_workers else None
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)

    print(f"{cold['images']} images, {cold['instances']} polygon instances, {cold['crowd']} crowd regions, "
          f"{cold['vertices'] / 1e6:.1f}M vertices ({ref['annotations']} annotations for pycocotools)")
    def rounds(results: list[dict[str, Any]]) -> str:
        return ", ".join(f"{x['seconds']:.1f}{'*' if x['first'] else ''}" for x in results)

    print(f"{len(refs)} round(s) alternating which reads the JSON first (* = read it first); "
          "seconds: fastest round")
    print(f"{'':34s} {'seconds':>8s} {'peak RSS MiB':>13s}   notes")
    print(f"{'pycocotools COCO()':34s} {ref['seconds']:8.1f} {ref['peak_rss_mib']:13.0f}   "
          f"rounds {rounds(refs)} s; {ref['rss_imported_mib']:.0f} MiB of it before loading "
          "(Python + pycocotools)")
    ratio = cold["seconds"] / ref["seconds"]
    # On a shared machine wall time swings with the neighbours; CPU time much less.
    print(f"CPU seconds: COCO() {ref['cpu_seconds']:.1f}, cold build {cold['cpu_seconds']:.1f} "
          f"({cold['cpu_seconds'] / ref['cpu_seconds']:.2f}x)")
    print(f"{'CocoIndex.build, cold':34s} {cold['seconds']:8.1f} {cold['peak_rss_mib']:13.0f}   "
          f"rounds {rounds(colds)} s; {ratio:.2f}x pycocotools (target <= 1.5x); "
          f"{cold['rss_imported_mib']:.0f} MiB of it before the build (Python + torch); "
          f"cache file {cold['cache_mib']:.0f} MiB")
    # Issue 11's goal: the cold build peaks at or below COCO() in the same run, imports included.
    above_ours = cold["peak_rss_mib"] - cold["rss_imported_mib"]
    above_theirs = ref["peak_rss_mib"] - ref["rss_imported_mib"]
    print(f"peak RSS ratio, cold build / COCO(): {cold['peak_rss_mib'] / ref['peak_rss_mib']:.2f} "
          f"(target <= 1.00); above the imports: {above_ours:.0f} / {above_theirs:.0f} MiB = "
          f"{above_ours / above_theirs:.2f}")
    if warm is not None:
        print(f"{'CocoIndex.build, warm (cached)':34s} {warm['seconds']:8.2f} {'':13s}   target < 2 s; "
              f"index arrays {warm['index_mib']:.0f} MiB (target < 400), RSS +{warm['rss_growth_mib']:.0f} MiB")
    for name, w in (("index", workers), ("pycocotools COCO", base)):  # None: not run
        if w is None:
            continue
        print(f"epoch over {name} with {w['workers']} workers ({w['epoch_seconds']:.1f} s): "
              "workers' total PSS "
              f"{w['pss_start_mib']:.0f} -> {w['pss_end_mib']:.0f} MiB, growth {w['growth_pct']:+.1f}% "
              f"(target < 10%); main process PSS {w['main_pss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
