"""Mask rasterisation at seed scale: this project against its peers, measured in one run.

A seeded batch of 64 mosaic canvases (640 x 640), each from 4 real coco-mini images scaled into
its quadrants, about 2,000-2,600 real polygon instances, rasterised at stride 4 on one thread by:

* this project, from the same per-instance lists of ``(K, 2)`` rings the peers get: the timer
  covers ``Polygons.from_instances`` (lists to flat arrays) and ``rasterize_flat`` (exact,
  vectorised over every ring of the batch), as the peers convert their rings to what they need
  (int32 points, shifted coordinates) inside their timers. This is the row the ratios use;
* this project from flat arrays already built (what the collate gets: ``Sample.polygons`` is
  flat from the index on), for information;
* a per-instance ``cv2.fillPoly`` loop on the stride-4 grid (subpixel ``shift``; not exact);
* Ultralytics' approach: ``cv2.fillPoly`` on the full canvas, then ``cv2.resize`` by 1/4;
* the plain full-grid crossing test (the seed's "before");
* a per-ring windowed crossing test, vectorised per ring (the seed's "after");
* a reference point, not a floor: allocating the output stack and writing every cell once.
  Writing every cell is not a lower bound for writing only the inside cells, which is what the
  rasteriser does (into lazily zero-filled pages), so a method can come in under it.

First, the headline: this project (from lists and from flat arrays) against the cv2.fillPoly
loop, run in turn round after round (so a busy spell of a shared machine hits each alike), into
a fresh ``np.zeros`` stack (the page faults of the pages the masks land on are in the timer),
into one reused stack zeroed inside the timer (what the collate does with its shared-memory
slots), and into that stack zeroed before the timer (the rasterising alone), with the list
API's cost over flat arrays. Then every method with its ratio to this
project (with the conversion), the per-instance cost at spans of 30, 60 and 120 px on two canvas
sizes, and the collate-to-main-process time with one worker.

Run: ``python benchmarks/bench_raster.py [--coco-mini PATH] [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import cv2
import numpy as np
import torch

from seg_datamodule import DetectionCollate, Polygons, Sample, rasterize_flat

CANVAS = 640
STRIDE = 4


def _load_coco_mini(root: Path) -> list[dict]:
    """Images with their non-crowd polygon instances, from both coco-mini splits."""
    records = []
    for split in ("train2017", "val2017"):
        data = json.loads((root / "annotations" / f"instances_{split}.json").read_text())
        anns: dict[int, list] = {}
        for ann in data["annotations"]:
            if not ann["iscrowd"] and isinstance(ann["segmentation"], list):
                anns.setdefault(ann["image_id"], []).append(ann)
        for img in data["images"]:
            records.append({"path": root / split / img["file_name"], "h": img["height"],
                            "w": img["width"], "anns": anns.get(img["id"], [])})
    return records


def build_mosaic_batch(root: Path, num_canvases: int = 64, seed: int = 0) -> list[Sample]:
    """Seeded 640 x 640 mosaics: 4 real images scaled into the quadrants, polygons moved along."""
    rng = np.random.default_rng(seed)
    records = _load_coco_mini(root)
    half = CANVAS // 2
    samples = []
    for c in range(num_canvases):
        image = np.full((CANVAS, CANVAS, 3), 114, np.uint8)
        instances = []
        for q, idx in enumerate(rng.choice(len(records), 4, replace=False)):
            rec = records[idx]
            ox, oy = (q % 2) * half, (q // 2) * half
            scale = half / max(rec["h"], rec["w"])
            pixels = cv2.cvtColor(cv2.imread(str(rec["path"])), cv2.COLOR_BGR2RGB)
            tile = cv2.resize(pixels, (round(rec["w"] * scale), round(rec["h"] * scale)))
            image[oy : oy + tile.shape[0], ox : ox + tile.shape[1]] = tile
            for ann in rec["anns"]:
                rings = [np.asarray(r, np.float64).reshape(-1, 2) * scale + (ox, oy)
                         for r in ann["segmentation"] if len(r) >= 6]
                if rings:
                    instances.append(rings)
        vertices, ring_offsets, instance_offsets = Polygons.from_instances(instances).arrays
        n = len(instances)
        samples.append(Sample(image=image, image_id=c, polygons=Polygons(vertices, ring_offsets, instance_offsets),
                              labels=np.zeros(n, np.int64),
                              annotation_ids=np.arange(n, dtype=np.int64)))
    return samples


def _flat(samples: list[Sample]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return Polygons.concat(s.polygons for s in samples).arrays


def _instances(samples: list[Sample]) -> list[list[np.ndarray]]:
    """Every instance as a list of ``(K, 2)`` float64 rings (copies, as a list-of-dicts loader has them)."""
    return [[ring.copy() for ring in s.polygons.instance(n)] for s in samples for n in range(s.num_instances)]


# --- peers -------------------------------------------------------------------------------------

def peer_fillpoly_stride(instances: list[list[np.ndarray]], hw: tuple[int, int],
                         out: np.ndarray | None = None) -> np.ndarray:
    """Per-instance cv2.fillPoly on the stride grid, 8-bit subpixel shift (not exact).

    ``out``: a zeroed uint8 ``(N, Hp, Wp)`` stack to draw into; a fresh ``np.zeros`` when None.
    """
    hp, wp = -(-hw[0] // STRIDE), -(-hw[1] // STRIDE)
    if out is None:
        out = np.zeros((len(instances), hp, wp), np.uint8)
    shift = 8
    for n, rings in enumerate(instances):
        # cv2 samples pixel centres at integers: move (j + 0.5) * s centres onto integer j.
        pts = [np.round((r / STRIDE - 0.5) * (1 << shift)).astype(np.int32) for r in rings]
        cv2.fillPoly(out[n], pts, 1, lineType=cv2.LINE_8, shift=shift)
    return out.view(bool)


def peer_ultralytics(instances: list[list[np.ndarray]], hw: tuple[int, int]) -> np.ndarray:
    """Ultralytics' polygon2mask: fillPoly at full resolution, then resize by 1/stride."""
    hp, wp = hw[0] // STRIDE, hw[1] // STRIDE
    out = np.empty((len(instances), hp, wp), np.uint8)
    full = np.zeros(hw, np.uint8)
    for n, rings in enumerate(instances):
        full[:] = 0
        cv2.fillPoly(full, [np.asarray(r, np.int32) for r in rings], 1)
        out[n] = cv2.resize(full, (wp, hp))
    return out


def peer_full_grid(instances: list[list[np.ndarray]], hw: tuple[int, int]) -> np.ndarray:
    """Plain crossing test of every edge against every cell (vectorised over the grid)."""
    hp, wp = -(-hw[0] // STRIDE), -(-hw[1] // STRIDE)
    px = ((np.arange(wp) + 0.5) * STRIDE)[None, None, :]
    py = ((np.arange(hp) + 0.5) * STRIDE)[None, :, None]
    out = np.zeros((len(instances), hp, wp), bool)
    for n, rings in enumerate(instances):
        for ring in rings:
            x0, y0 = ring[:, 0, None, None], ring[:, 1, None, None]
            nxt = np.roll(ring, -1, axis=0)
            x1, y1 = nxt[:, 0, None, None], nxt[:, 1, None, None]
            with np.errstate(divide="ignore", invalid="ignore"):
                cross = ((y0 > py) != (y1 > py)) & (px < x0 + (py - y0) * (x1 - x0) / (y1 - y0))
            out[n] |= np.bitwise_xor.reduce(cross, axis=0)
    return out


def peer_windowed_per_ring(instances: list[list[np.ndarray]], hw: tuple[int, int]) -> np.ndarray:
    """Crossing test restricted to each ring's bounding window, vectorised per ring."""
    hp, wp = -(-hw[0] // STRIDE), -(-hw[1] // STRIDE)
    out = np.zeros((len(instances), hp, wp), bool)
    for n, rings in enumerate(instances):
        for ring in rings:
            r0 = max(0, int(np.floor(ring[:, 1].min() / STRIDE - 0.5)))
            r1 = min(hp, int(np.ceil(ring[:, 1].max() / STRIDE - 0.5)) + 1)
            c0 = max(0, int(np.floor(ring[:, 0].min() / STRIDE - 0.5)))
            c1 = min(wp, int(np.ceil(ring[:, 0].max() / STRIDE - 0.5)) + 2)
            if r0 >= r1 or c0 >= c1:
                continue
            px = ((np.arange(c0, c1) + 0.5) * STRIDE)[None, None, :]
            py = ((np.arange(r0, r1) + 0.5) * STRIDE)[None, :, None]
            x0, y0 = ring[:, 0, None, None], ring[:, 1, None, None]
            nxt = np.roll(ring, -1, axis=0)
            x1, y1 = nxt[:, 0, None, None], nxt[:, 1, None, None]
            with np.errstate(divide="ignore", invalid="ignore"):
                cross = ((y0 > py) != (y1 > py)) & (px < x0 + (py - y0) * (x1 - x0) / (y1 - y0))
            out[n, r0:r1, c0:c1] |= np.bitwise_xor.reduce(cross, axis=0)
    return out


def write_every_cell(num: int, hw: tuple[int, int]) -> np.ndarray:
    """Allocate the (N, Hp, Wp) bool stack and write every cell once.

    A reference point, not a lower bound: a rasteriser that writes only the inside cells into
    lazily zero-filled pages does less than this.
    """
    hp, wp = -(-hw[0] // STRIDE), -(-hw[1] // STRIDE)
    out = np.empty((num, hp, wp), bool)
    out.fill(True)
    return out


def _time(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time in ms over ``repeat`` runs after one warm-up.

    The result is freed outside the timed region: unmapping a 60 MB stack is the caller's cost,
    the same for every method, and only adds noise.
    """
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1e3)
        del result
    return statistics.median(times)


Timed = Callable[[], object]


def _time_together(fns: dict[str, Timed | tuple[Timed, Timed]], rounds: int) -> dict[str, float]:
    """Median wall time in ms of each function, running them in turn, round after round.

    Interleaving makes a busy or quiet spell of a shared machine fall on every method alike,
    so the ratios between them hold even when the absolute times drift; the order is shuffled
    each round, because what ran just before (a 57 MB stack freed, caches refilled) changes the
    next method's time. An entry may be ``(setup, run)``: ``setup`` runs untimed just before.
    """
    def parts(entry: Timed | tuple[Timed, Timed]) -> tuple[Timed, Timed]:
        return entry if isinstance(entry, tuple) else (lambda: None, entry)

    times: dict[str, list[float]] = {name: [] for name in fns}
    for entry in fns.values():
        setup, fn = parts(entry)
        setup()
        fn()  # warm-up
    order = list(fns)
    rng = np.random.default_rng(0)
    for _ in range(rounds):
        rng.shuffle(order)  # no method always runs right after the same other one
        for name in order:
            setup, fn = parts(fns[name])
            setup()
            t0 = time.perf_counter()
            result = fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
            del result
    return {name: statistics.median(ms) for name, ms in times.items()}


def headline(inst: list[list[np.ndarray]], flat: tuple[np.ndarray, ...], hw: tuple[int, int],
             rounds: int) -> dict[str, float]:
    """This project against the cv2.fillPoly loop, into three kinds of output, interleaved.

    * fresh: each call allocates its ``np.zeros`` stack and pays the kernel's page faults for
      the pages its masks land on (what a caller of ``rasterize_polygons`` gets);
    * reused: each call zeroes one stack allocated beforehand and writes into it (what
      ``DetectionCollate`` does with its reused shared-memory slots);
    * zeroed: the same stack, zeroed before the timer starts: the rasterising alone.
    Zeroing or faulting is the same work for every method; it is inside the first two timers.
    """
    hp, wp = -(-hw[0] // STRIDE), -(-hw[1] // STRIDE)
    mine = np.ones((len(inst), hp, wp), bool)
    theirs = np.ones((len(inst), hp, wp), np.uint8)

    def into(buffer: np.ndarray, write: Callable[[np.ndarray], object]) -> Callable[[], object]:
        def run() -> object:
            buffer.fill(0)
            return write(buffer)
        return run

    def mine_lists(o: np.ndarray | None = None) -> object:
        return rasterize_flat(*Polygons.from_instances(inst).arrays, hw, STRIDE, out=o)

    def mine_flat(o: np.ndarray | None = None) -> object:
        return rasterize_flat(*flat, hw, STRIDE, out=o)

    def cv2_loop(o: np.ndarray | None = None) -> object:
        return peer_fillpoly_stride(inst, hw, out=o)

    return _time_together({
        "fresh lists": mine_lists,
        "fresh flat": mine_flat,
        "fresh cv2": cv2_loop,
        "reused lists": into(mine, mine_lists),
        "reused flat": into(mine, mine_flat),
        "reused cv2": into(theirs, cv2_loop),
        "zeroed lists": (lambda: mine.fill(0), lambda: mine_lists(mine)),
        "zeroed flat": (lambda: mine.fill(0), lambda: mine_flat(mine)),
        "zeroed cv2": (lambda: theirs.fill(0), lambda: cv2_loop(theirs)),
    }, rounds)


def _regular_polygon(span: float, k: int, centre: tuple[float, float], rng: np.random.Generator) -> np.ndarray:
    angles = np.sort(rng.uniform(0, 2 * np.pi, k))
    radius = span / 2 * rng.uniform(0.8, 1.0, k)
    return np.stack([centre[0] + radius * np.cos(angles), centre[1] + radius * np.sin(angles)], 1)


def per_instance_cost(repeat: int) -> list[tuple[int, int, float, float]]:
    """us per instance for 1,000 24-gons of a given span, on 640 and 1280 canvases.

    Two figures: into an output that is already mapped (the rasteriser's own work), and into a
    fresh ``np.zeros`` stack (adds the kernel zero-filling the pages the masks land on, which
    grows with the canvas because each mask's rows are ``W / stride`` bytes apart).
    """
    rng = np.random.default_rng(1)
    rows = []
    for canvas in (640, 1280):
        for span in (30, 60, 120):
            centres = rng.uniform(span, 640 - span, (1000, 2))
            inst = [[_regular_polygon(span, 24, tuple(c), rng)] for c in centres]
            flat = Polygons.from_instances(inst).arrays
            hot = rasterize_flat(*flat, (canvas, canvas), STRIDE)  # same cells every run
            ms_hot = _time(lambda: rasterize_flat(*flat, (canvas, canvas), STRIDE, out=hot), repeat)
            ms_fresh = _time(lambda: rasterize_flat(*flat, (canvas, canvas), STRIDE), repeat)
            rows.append((canvas, span, ms_hot * 1e3 / len(inst), ms_fresh * 1e3 / len(inst)))
    return rows


def collate_to_main(samples: list[Sample], batches: int) -> tuple[float, float, float]:
    """Collate with 1 worker: (ms in the worker, ms to hand it over, ms to free it in main).

    The hand-over is timed from the later of "the worker returned the batch" and "the main
    process asked for it" to "the main process holds it": queueing, pickling file descriptors
    and rebuilding the shared-memory tensors, never the collate itself. Freeing is the main
    process dropping a batch (unmapping its shared memory), timed apart.
    """
    from torch.utils.data import DataLoader, Dataset

    class _Timed(DetectionCollate):
        def __call__(self, items):  # type: ignore[override]
            t0 = time.perf_counter()
            batch = super().__call__(items)
            return batch, (time.perf_counter() - t0) * 1e3, time.time()

    class _Samples(Dataset):
        def __len__(self) -> int:
            return len(samples) * batches

        def __getitem__(self, i: int) -> Sample:
            return samples[i % len(samples)]

    loader = DataLoader(_Samples(), batch_size=len(samples), num_workers=1, collate_fn=_Timed(STRIDE),
                        prefetch_factor=1)
    collate_ms, handover_ms, free_ms = [], [], []
    iterator = iter(loader)
    for i in range(batches):
        asked = time.time()
        batch, ms, t_done = next(iterator)
        received = time.time()
        assert batch.masks.is_shared()
        time.sleep(ms / 1e3 * 2)  # let the worker finish the next batch before we ask for it
        t0 = time.perf_counter()
        del batch
        freed = (time.perf_counter() - t0) * 1e3
        if i:  # the first batch includes worker start-up
            collate_ms.append(ms)
            handover_ms.append((received - max(asked, t_done)) * 1e3)
            free_ms.append(freed)
    return statistics.median(collate_ms), statistics.median(handover_ms), statistics.median(free_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--coco-mini", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared/data/coco-mini")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip-slow", action="store_true", help="skip the full-grid peer")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cv2.setNumThreads(0)

    samples = build_mosaic_batch(args.coco_mini)
    flat = _flat(samples)
    inst = _instances(samples)
    hw = (CANVAS, CANVAS)
    n = len(inst)
    print(f"batch: {len(samples)} canvases of {CANVAS}x{CANVAS}, {n} instances, "
          f"{len(flat[1]) - 1} rings, {len(flat[0])} vertices, stride {STRIDE}, 1 thread")

    ours = rasterize_flat(*flat, hw, STRIDE)
    head = headline(inst, flat, hw, rounds=max(9, 4 * args.repeat))
    print(f"\nthis project against the cv2.fillPoly loop, interleaved, median of {max(9, 4 * args.repeat)} rounds; "
          "zeroing the output is inside the first two timers")
    print(f"{'':<44}{'fresh np.zeros out':>20}{'reused out (collate)':>22}{'zeroed out, untimed':>22}")
    print(f"{'method':<44}" + f"{'ms':>10}{'x cv2':>10}  " * 3)
    for key, name in (("lists", "this project (exact), from lists"), ("flat", "this project, from flat arrays"),
                      ("cv2", "cv2.fillPoly loop at stride 4 (not exact)")):
        cells = [f"{head[f'{out} {key}']:>10.1f}{head[f'{out} {key}'] / head[f'{out} cv2']:>10.2f}  "
                 for out in ("fresh", "reused", "zeroed")]
        print(f"{name:<44}" + "".join(cells))
    print("list API against flat arrays: " + ", ".join(
        f"{head[f'{out} lists'] / head[f'{out} flat']:.2f}x ({out})" for out in ("fresh", "reused", "zeroed")))

    rows = [("this project (exact), from lists", head["fresh lists"]),
            ("this project, from flat arrays (no convert)", head["fresh flat"]),
            ("cv2.fillPoly loop at stride 4 (not exact)", head["fresh cv2"])]
    rows.append(("Ultralytics: fillPoly full + resize 1/4", _time(lambda: peer_ultralytics(inst, hw), args.repeat)))
    rows.append(("per-ring windowed crossing test", _time(lambda: peer_windowed_per_ring(inst, hw), max(1, args.repeat // 2))))
    if not args.skip_slow:
        rows.append(("full-grid crossing test", _time(lambda: peer_full_grid(inst, hw), 1)))
    rows.append(("write every cell (reference, not a floor)", _time(lambda: write_every_cell(n, hw), args.repeat)))
    base = rows[0][1]
    print("\nevery method starts from the same per-instance lists of rings and converts them inside its timer "
          "(except the flat-array row), into a fresh output; 'x ours' is relative to the first row")
    print(f"\n{'method':<44}{'ms':>10}{'x ours':>10}")
    for name, ms in rows:
        print(f"{name:<44}{ms:>10.1f}{ms / base:>10.2f}")

    exact = np.array_equal(ours, peer_windowed_per_ring(inst, hw))
    approx = peer_fillpoly_stride(inst, hw)
    disagree = np.count_nonzero(approx != ours) / max(1, np.count_nonzero(ours))
    print(f"\nbit-identical to the windowed crossing test: {exact}; "
          f"cv2.fillPoly at stride 4 disagrees on {disagree:.1%} of the mask cells")

    print(f"\nper instance (1,000 24-gons):\n{'canvas':>8}{'span px':>9}{'us, mapped out':>16}{'us, fresh out':>15}")
    for canvas, span, us_hot, us_fresh in per_instance_cost(args.repeat):
        print(f"{canvas:>8}{span:>9}{us_hot:>16.2f}{us_fresh:>15.2f}")

    collate_ms, transfer_ms, free_ms = collate_to_main(samples, batches=6)
    print(f"\ncollate with 1 worker (images + masks + boxes, shared memory): {collate_ms:.1f} ms in the worker, "
          f"{transfer_ms:.1f} ms to hand the finished batch to the main process, "
          f"{free_ms:.1f} ms for the main process to free it")


if __name__ == "__main__":
    main()
