"""Hashes of the batches the DataModule gives, to prove a refactor changed none of them.

Builds ``COCOSegDataModule`` from its flat (YAML) keys on coco-mini in several configurations
(the default mosaic with batch partners, uniform partners, LSJ, copy-paste + MixUp, HSV on the
device, a bad image skipped, validation, a repeat-factor draw) and prints, per configuration, a
SHA-256 over every field of every batch of ``--epochs`` epochs (images, boxes, labels, masks,
ids, crowd masks, letterbox fields, LVIS lists, origins, HSV gains and the batch's counts) and the
module's ``skip_counts``. Run it before and after a change and compare the lines (``--json`` to
write them to a file).

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
import torch

from seg_datamodule import COCOSegDataModule

_DECODES = ("samples", "decodes", "reduced_decodes")
COCO_MINI = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "coco-mini"


def _digest(batch: Any, h: "hashlib._Hash") -> None:
    for name in sorted(n for n in vars(batch) if not n.startswith("_")):  # not the shm lease
        value = getattr(batch, name)
        h.update(name.encode())
        if isinstance(value, torch.Tensor):
            h.update(str(value.dtype).encode() + str(tuple(value.shape)).encode())
            h.update(value.contiguous().numpy().tobytes())
        elif isinstance(value, dict):  # decodes depend on each worker's image cache: kept apart
            h.update(json.dumps({k: v for k, v in value.items() if k not in _DECODES}, sort_keys=True).encode())
        else:
            h.update(repr(value).encode())


def _bad_copy(root: Path) -> tuple[str, str]:
    """coco-mini train with one image file truncated (a bad image for ``on_bad_sample="skip"``)."""
    images = root / "train2017"
    shutil.copytree(COCO_MINI / "train2017", images)
    victim = sorted(images.iterdir())[3]
    victim.write_bytes(victim.read_bytes()[:200])
    return str(COCO_MINI / "annotations" / "instances_train2017.json"), str(images)


def configurations(tmp: Path) -> dict[str, dict[str, Any]]:
    train = dict(train_ann=str(COCO_MINI / "annotations" / "instances_train2017.json"),
                 train_images=str(COCO_MINI / "train2017"))
    val = dict(val_ann=str(COCO_MINI / "annotations" / "instances_val2017.json"),
               val_images=str(COCO_MINI / "val2017"))
    common = dict(image_size=256, batch_size=8, seed=7, use_cache=False, cache_dir=str(tmp / "cache"))
    yolo = A.Compose([A.Blur(p=0.3), A.ToGray(p=0.2)])
    bad_ann, bad_images = _bad_copy(tmp)
    return {
        "mosaic_batch": dict(**train, **common, transforms=yolo, hsv=(0.015, 0.7, 0.4), degrees=5.0, shear=2.0),
        "mosaic_uniform": dict(**train, **common, mosaic_partners="uniform", mosaic=0.7, cache_images=0),
        "lsj": dict(**train, **common, recipe="lsj"),
        "copy_paste_mixup": dict(**train, **common, copy_paste=0.6, mixup=0.4),
        "copy_paste_batch": dict(**train, **common, copy_paste=0.8, copy_paste_mode="batch"),
        "hsv_on_device": dict(**train, **common, hsv=(0.015, 0.7, 0.4), hsv_on_device=True),
        "bad_image_skip": dict(train_ann=bad_ann, train_images=bad_images, **common, on_bad_sample="skip",
                               copy_paste=0.5),
        "close_mosaic": dict(**train, **common, close_mosaic=1),
        "repeat_factors": dict(**train, **common, repeat_factor_threshold=0.5),
        "val": dict(**train, **val, **common),
    }


def run(name: str, kwargs: dict[str, Any], epochs: int, workers: int) -> dict[str, Any]:
    dm = COCOSegDataModule(num_workers=workers, pin_memory=False, persistent_workers=False, **kwargs)
    dm.setup("fit")
    assert dm.train_dataset is not None
    dm.train_dataset.set_max_epochs(epochs + 1)
    h = hashlib.sha256()
    batches = 0
    if name == "val":
        for batch in dm.val_dataloader():
            _digest(batch, h)
            batches += 1
    for epoch in range(0 if name == "val" else epochs):
        loader = dm.train_dataloader()  # a loader per epoch, as Lightning reloads it
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            _digest(batch, h)
            batches += 1
    counts = dm.skip_counts
    h.update(json.dumps(counts, sort_keys=True).encode())
    decodes = {k: v for k, v in dm._counts_of("train", dm.train_dataset).items() if k in _DECODES}
    return {"batches": batches, "sha256": h.hexdigest()[:32], "counts": counts, "decodes": decodes}


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
        for name, kwargs in configurations(Path(tmp)).items():
            if args.only and name not in args.only:
                continue
            per_workers = {w: run(name, kwargs, args.epochs, w) for w in args.workers}
            first = per_workers[args.workers[0]]
            same = all(r["sha256"] == first["sha256"] for r in per_workers.values())
            results[name] = {"batches": first["batches"], "sha256": first["sha256"], "same_for_workers": same,
                             "counts": first["counts"],
                             "decodes": {str(w): r["decodes"] for w, r in per_workers.items()}}
            print(f"{name:18s} {first['batches']:3d} batches  {first['sha256']}  "
                  f"workers {args.workers}: {'same' if same else 'DIFFERENT'}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
