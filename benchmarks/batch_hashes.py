"""Hashes of the batches the DataModule gives, to prove a refactor changed none of them.

Builds ``COCOSegDataModule`` from its flat (YAML) keys on coco-mini in several configurations
(the mosaic with batch partners, uniform partners (the default), LSJ, copy-paste + MixUp, HSV on the
device, a bad image skipped, a repeat-factor draw, training streamed from LitData chunks, and the
validation, test and predict loaders) and prints, per configuration and number of workers:

* ``batches``: a SHA-256 over every field of every batch of ``--epochs`` epochs (images, boxes,
  labels, masks, ids, crowd masks, letterbox fields, LVIS lists, origins, HSV gains and the
  batch's counts);
* ``counts``: a SHA-256 of the module's ``skip_counts`` after those batches, apart (what is
  counted can change without a batch changing: issue 52 counts a loop of one's own);
* ``device``: the same over the batches after the DataModule's device step
  (:func:`~seg_datamodule.transforms.pixel.hsv.apply_pending_hsv`, what ``on_after_batch_transfer``
  runs; here on the CPU), which applies the HSV gains ``hsv_on_device`` ships;
* ``draws``: a SHA-256 over every draw every seeded generator made, recorded at the generator
  (``numpy.random.default_rng`` is wrapped, in the workers too): per generator its seed and each
  call's method and result shape, as a multiset (a sample built twice, e.g. as a partner, counts
  twice), so a change of draw order or count shows even where the batches happen to agree.

``stream`` follows the global order (issue 63): the same batches for any ``num_workers``; its
``draws`` still differ by worker count, as every worker draws the epoch's order once (one more
generator per worker and epoch). Compare each worker count's line with its own line before.

Run it before and after a change and compare the lines (``--json`` to write them to a file).

    python benchmarks/batch_hashes.py --json before.json
    python benchmarks/batch_hashes.py --json after.json && diff before.json after.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import albumentations as A
import numpy as np
import torch

from seg_datamodule import COCOSegDataModule
from seg_datamodule.transforms.pixel.hsv import apply_pending_hsv

_DECODES = ("samples", "decodes", "reduced_decodes")
#: Batch fields added after the first recorded hashes, left out of the digest while None
#: (``has_mask`` is None unless ``box_only: keep`` delivers a box-only target).
_ADDED_OPTIONAL = ("has_mask", "pending_pixels")
COCO_MINI = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "coco-mini"


def _digest(batch: Any, h: "hashlib._Hash") -> None:
    for name in sorted(n for n in vars(batch) if not n.startswith("_")):  # not the shm lease
        value = getattr(batch, name)
        if value is None and name in _ADDED_OPTIONAL:  # a field added later, unset: earlier hashes still compare
            continue
        h.update(name.encode())
        if isinstance(value, torch.Tensor):
            h.update(str(value.dtype).encode() + str(tuple(value.shape)).encode())
            h.update(value.contiguous().numpy().tobytes())
        elif isinstance(value, dict):  # decodes depend on each worker's image cache: kept apart
            h.update(json.dumps({k: v for k, v in value.items() if k not in _DECODES}, sort_keys=True).encode())
        else:
            h.update(repr(value).encode())


class _DrawLog:
    """Wraps ``numpy.random.default_rng`` so that every generator logs each call (method, shape).

    Each process (a forked worker inherits the wrapper) appends lines ``pid:serial method shape``
    (and ``pid:serial seed SEED`` when the generator is made) to its own file in ``folder``;
    :meth:`digest` groups them per generator and hashes the sorted multiset of
    ``(seed, [(method, shape), ...])``.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.original = np.random.default_rng
        self.serial = 0
        self.pid = -1
        self.file: Any = None

    def _open(self) -> None:
        if self.pid != os.getpid():  # first use, after a reset, or a forked worker: its own file
            self.pid, self.serial = os.getpid(), 0
            self.file = open(self.folder / f"draws.{self.pid}.txt", "a", buffering=1)

    def _write(self, line: str) -> None:
        self._open()
        self.file.write(line + "\n")

    def install(self) -> None:
        log = self
        original = self.original

        class Recording(np.random.Generator):
            pass

        def _wrap(name: str) -> Any:
            method = getattr(np.random.Generator, name)

            def call(self: Any, *args: Any, **kwargs: Any) -> Any:
                out = method(self, *args, **kwargs)
                shape = np.shape(args[0]) if name in ("shuffle",) and args else np.shape(out)
                log._write(f"{self._draw_tag} {name} {shape}")
                return out

            return call

        for name in dir(np.random.Generator):
            if name.startswith("_") or name in ("bit_generator", "spawn"):
                continue
            if callable(getattr(np.random.Generator, name)):
                setattr(Recording, name, _wrap(name))

        def default_rng(seed: Any = None) -> Any:
            if isinstance(seed, np.random.Generator):
                return seed
            rng = Recording(original(seed).bit_generator)
            log._open()
            log.serial += 1
            rng._draw_tag = f"{log.pid}:{log.serial}"  # type: ignore[attr-defined]
            if isinstance(seed, np.random.SeedSequence):  # the streamed order's generator; its repr spans lines
                seed_text = f"SeedSequence({seed.entropy!r}, {seed.spawn_key!r})"
            else:
                seed_text = repr(np.asarray(seed).tolist()) if seed is not None else "None"
            log._write(f"{rng._draw_tag} seed {seed_text}")  # type: ignore[attr-defined]
            return rng

        np.random.default_rng = default_rng  # type: ignore[assignment]

    def reset(self) -> None:
        if self.file is not None and self.pid == os.getpid():
            self.file.close()
        for f in self.folder.glob("draws.*.txt"):
            f.unlink()
        self.pid = -1  # reopen

    def digest(self) -> tuple[str, int]:
        """SHA-256 over the multiset of generators' (seed, draws), and the number of generators."""
        if self.file is not None and self.pid == os.getpid() and not self.file.closed:
            self.file.flush()
        seeds: dict[str, str] = {}
        calls: dict[str, list[str]] = {}
        for f in sorted(self.folder.glob("draws.*.txt")):
            for line in f.read_text().splitlines():
                if not line:
                    continue
                tag, method, rest = line.split(" ", 2)
                if method == "seed":
                    seeds[tag] = rest
                else:
                    calls.setdefault(tag, []).append(f"{method}{rest}")
        entries = sorted(f"{seeds[tag]}|{';'.join(calls.get(tag, []))}" for tag in seeds)
        return hashlib.sha256("\n".join(entries).encode()).hexdigest()[:32], len(entries)


def _bad_copy(root: Path) -> tuple[str, str]:
    """coco-mini train with one image file truncated (a bad image for ``on_bad_sample="skip"``)."""
    images = root / "train2017"
    shutil.copytree(COCO_MINI / "train2017", images)
    victim = sorted(images.iterdir())[3]
    victim.write_bytes(victim.read_bytes()[:200])
    return str(COCO_MINI / "annotations" / "instances_train2017.json"), str(images)


def _stream_copy(root: Path) -> str:
    """coco-mini train converted to LitData chunks (``seg-datamodule convert``), as a ``local:`` URL."""
    from seg_datamodule.io.stream import ChunkOptions, IndexOptions, convert_coco

    out = root / "stream"
    convert_coco(COCO_MINI / "annotations" / "instances_train2017.json", COCO_MINI / "train2017", str(out),
                 IndexOptions(), ChunkOptions(chunk_bytes="1MB", start_method="fork"))
    return f"local:{out}"


def configurations(tmp: Path) -> dict[str, dict[str, Any]]:
    """Name -> the DataModule's keys; ``stage`` (not a key) says which loader is read."""
    train = dict(train_ann=str(COCO_MINI / "annotations" / "instances_train2017.json"),
                 train_images=str(COCO_MINI / "train2017"))
    val = dict(val_ann=str(COCO_MINI / "annotations" / "instances_val2017.json"),
               val_images=str(COCO_MINI / "val2017"))
    common = dict(image_size=256, batch_size=8, seed=7, use_cache=False, cache_dir=str(tmp / "cache"))
    batch = dict(mosaic_partners="batch")  # the default before 2026-12-07: the baseline's batches
    yolo = A.Compose([A.Blur(p=0.3), A.ToGray(p=0.2)])
    bad_ann, bad_images = _bad_copy(tmp)
    return {
        "mosaic_batch": dict(**train, **common, **batch, transforms=yolo, hsv=(0.015, 0.7, 0.4), degrees=5.0,
                             shear=2.0),
        "mosaic_uniform": dict(**train, **common, mosaic_partners="uniform", mosaic=0.7, cache_images=0),
        "lsj": dict(**train, **common, **batch, recipe="lsj"),
        "copy_paste_mixup": dict(**train, **common, **batch, copy_paste=0.6, mixup=0.4),
        "copy_paste_batch": dict(**train, **common, **batch, copy_paste=0.8, copy_paste_mode="batch"),
        "hsv_on_device": dict(**train, **common, **batch, hsv=(0.015, 0.7, 0.4), hsv_on_device=True),
        "bad_image_skip": dict(train_ann=bad_ann, train_images=bad_images, **common, **batch, on_bad_sample="skip",
                               copy_paste=0.5),
        "close_mosaic": dict(**train, **common, **batch, close_mosaic=1),
        "repeat_factors": dict(**train, **common, **batch, repeat_factor_threshold=0.5),
        "val": dict(**train, **val, **common, stage="validate"),
        "test": dict(test_ann=val["val_ann"], test_images=val["val_images"], **common, stage="test"),
        "predict": dict(predict_images=val["val_images"], **common, stage="predict"),
        "stream": dict(train_stream=_stream_copy(tmp), **common, stream_cache_dir=str(tmp / "stream_cache"),
                       hsv=(0.015, 0.7, 0.4), hsv_on_device=True),
    }


def _loaders(dm: COCOSegDataModule, stage: str, epochs: int) -> Any:
    """Every batch the ``stage`` loader gives (training: ``epochs`` epochs, a loader per epoch)."""
    if stage == "validate":
        yield from dm.val_dataloader()
        return
    if stage == "test":
        yield from dm.test_dataloader()
        return
    if stage == "predict":
        yield from dm.predict_dataloader()
        return
    dm.setup("fit")
    assert dm.train_dataset is not None
    dm.train_dataset.set_max_epochs(epochs + 1)
    if dm.train_stream is not None:  # LitData counts its epochs itself, one per iter()
        loader = dm.train_dataloader()
        for _ in range(epochs):
            yield from loader
        return
    for epoch in range(epochs):
        loader = dm.train_dataloader()  # a loader per epoch, as Lightning reloads it
        loader.sampler.set_epoch(epoch)
        yield from loader


def run(kwargs: dict[str, Any], epochs: int, workers: int, draws: _DrawLog) -> dict[str, Any]:
    kwargs = dict(kwargs)
    stage = kwargs.pop("stage", "fit")
    draws.reset()
    dm = COCOSegDataModule(num_workers=workers, pin_memory=False, persistent_workers=False, **kwargs)
    h, device = hashlib.sha256(), hashlib.sha256()
    batches = 0
    for batch in _loaders(dm, stage, epochs):
        _digest(batch, h)
        _digest(apply_pending_hsv(batch), device)
        batches += 1
    counts = dm.skip_counts  # hashed apart: a change to what is counted is not a change to the batches
    counts_digest = hashlib.sha256(json.dumps(counts, sort_keys=True).encode()).hexdigest()[:12]
    decodes = {}
    if stage == "fit":
        decodes = {k: v for k, v in dm.counts.counts_of("train").items() if k in _DECODES}
    draw_digest, generators = draws.digest()
    return {"batches": batches, "sha256": h.hexdigest()[:32], "device": device.hexdigest()[:32],
            "draws": draw_digest, "generators": generators, "counts": counts, "counts_sha256": counts_digest,
            "decodes": decodes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    if not COCO_MINI.is_dir():
        print(f"coco-mini not found at {COCO_MINI}", file=sys.stderr)
        return 2
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        draws = _DrawLog(Path(tmp))
        draws.install()
        for name, kwargs in configurations(Path(tmp)).items():
            if args.only and name not in args.only:
                continue
            per_workers = {w: run(kwargs, args.epochs, w, draws) for w in args.workers}
            first = per_workers[args.workers[0]]
            same = all(r["sha256"] == first["sha256"] for r in per_workers.values())
            results[name] = {"same_for_workers": same, "counts": first["counts"],
                             **{f"workers_{w}": {k: v for k, v in r.items() if k != "counts"}
                                for w, r in per_workers.items()}}
            for w, r in per_workers.items():
                print(f"{name:17s} w{w} {r['batches']:3d} batches  {r['sha256']}  device {r['device']}  "
                      f"draws {r['draws']} ({r['generators']} generators)  counts {r['counts_sha256']}", flush=True)
            print(f"{name:17s} workers {args.workers}: {'same' if same else 'DIFFERENT'} batches", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
