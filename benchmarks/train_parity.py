"""Training parity: YOLO11n-seg through Ultralytics' trainer and through ``seg-datamodule fit``, one evaluator.

Does a model trained through this project come out as good as one trained by Ultralytics on the
same data and schedule? Both sides train YOLO11n-seg (``yolo11n-seg.yaml``) on one generated
dataset (the demo generator at a seed of its own: four shape classes, occlusion, multi-ring
instances, crowd regions), written once in Ultralytics' layout (``images/``, ``labels/``,
``data.yaml``; a multi-ring instance merged into one polygon with Ultralytics' own
``merge_multi_segment``, as its ``convert_coco`` does, crowds left out), which both read:

* **Ultralytics**: ``YOLO("yolo11n-seg.yaml").train(...)`` (8.4), ``save_period=1``;
* **this project**: ``python -m seg_datamodule fit --config configs/yolo11n_seg_data_yaml.yaml``
  with an overlay config of the same epochs, batch, canvas, workers, ``close_mosaic``, seed and
  optimiser, and a checkpoint per epoch.

The optimiser on both sides is the one Ultralytics' ``optimizer=auto`` picks for a run this short
(AdamW, ``lr0 = round(0.002 * 5 / (4 + nc), 6)``, momentum 0.9, bias warmup from 0), written out
on both sides. ``--schedule nbs64`` is Ultralytics' default nominal batch of 64 (an optimiser step
every ``64 / batch`` batches after a ramped warmup); ``--schedule step`` a step per batch
(``nbs = batch``). ``--start finetuned`` first trains a checkpoint with Ultralytics on other
generated data (another seed) and starts both sides from it.

**One evaluator** scores every epoch of every run: each checkpoint's EMA weights, stored as
Ultralytics stores them (half precision), go through Ultralytics' own predictor (``conf 0.001``,
``iou 0.7``, ``max_det 300``, ``retina_masks``: masks at the image's size) and pycocotools'
``COCOeval`` against the generator's COCO val JSON (its own polygons and crowds, not the
converted labels). It prints segm AP / AP50 per epoch, each side's mean and spread over the seeds,
and the ratio of the means (this project over Ultralytics), and writes every number to
``<out>/<start>_<schedule>/results.json``. Runs already there are reused (delete a run's folder to redo
it); a run or data folder made with other settings (epochs, data, canvas, batch, ...) is refused,
not reused. ``--variant NAME --ours KEY=VALUE`` changes this project's side only (one change at a time,
against the same Ultralytics runs): ``--variant old-cadence --ours model.init_args.schedule=lightning
--ours model.init_args.warmup_steps=10``. ``--cell NAME`` puts an off-diagonal cell of the
data-vs-loop 2x2 in place of this project's side (``benchmarks/_parity_cells.py``):
``ultralytics-loop-our-data`` (Ultralytics' trainer fed this DataModule's batches) or
``our-loop-ultralytics-data`` (the Lightning loop and ``YOLOSegModule`` fed Ultralytics' loader).
Every epoch's ratio is printed with its 95 % bootstrap interval over the seeds and, with 4 seeds
or more, Ultralytics against itself: the ratio of the means of its later half of seeds over its
earlier half, what a ratio of means reads where nothing differs but the seeds. ``--stop-after N``
trains each new run on the ``--epochs`` schedule (its warmup, decay and ``close_mosaic``) but stops
it after epoch N: the same numbers, epoch for epoch, as the full run's first N, so more seeds for
the early epochs cost a fraction of a full run (a run already trained further is reused; the
summary goes to ``results-epochs1-N.json``). ``--prescale`` stores the train images already
resized to the canvas's long side, as Ultralytics' ``load_image`` resizes each image before its
mosaic and warp: its loader then resamples them once, as this DataModule does (one warp from the
stored image), where on the generated images it resamples twice; data and runs go to their own
folders (``data_prescaled``, ``<start>_<schedule>_prescaled``).

20 epochs by default: from scratch at nominal batch 64 every run of either side scores 0.000
until epoch 7 and takes off between epochs 8 and 12, so at 10 epochs the last epoch measures when
a run took off (12 seeds a side gave an interval of 0.75-1.12), and at 20 it measures where the
runs level off (about 0.6 segm AP; 3 seeds a side about 35 minutes on 2 CPU cores).

Usage (needs ``pip install "seg-datamodule[ultralytics]"``)::

    python benchmarks/train_parity.py                        # scratch, nominal batch 64, seeds 0 1 2
    python benchmarks/train_parity.py --schedule step --start finetuned --epochs 10
    python benchmarks/train_parity.py --cell ultralytics-loop-our-data --seeds 0 1 2 3 4 5
    python benchmarks/train_parity.py --schedule step --start finetuned --seeds 0 1 2 3 4 5 6 7 8 9 10 11 --stop-after 8
    python benchmarks/train_parity.py --schedule step --start finetuned --seeds 0 1 2 3 4 5 --stop-after 5 --prescale
    python benchmarks/train_parity.py --train 400 --val 100 --imgsz 320 --epochs 30 --device 0   # longer, GPU
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "yolo11n_seg_data_yaml.yaml"
SIDES = ("ultralytics", "seg_datamodule")
SETTINGS = "settings.json"  # each run's and the data's settings: a folder made with others is not reused


# ------------------------------------------------------------------------------ data


def make_dataset(root: Path, *, num_train: int, num_val: int, size: tuple[int, int], seed: int,
                 prescale: int | None = None) -> Path:
    """The generated COCO dataset at ``root`` and its Ultralytics copy; returns ``root/data.yaml``.

    ``prescale``: the Ultralytics copy's train images are stored as PNGs already resized to that
    long side, as Ultralytics' ``load_image`` resizes each image it augments (``prescale_image``),
    so its loader resamples them once (the warp) as this DataModule does, not twice.
    """
    from seg_datamodule.demo.data import generate_demo_dataset
    from ultralytics.data.converter import merge_multi_segment

    settings = {"num_train": num_train, "num_val": num_val, "size": list(size), "seed": seed}
    if prescale is not None:
        settings["prescale"] = prescale
    if (root / "data.yaml").is_file():
        check_settings(root, settings)
        return root / "data.yaml"
    paths = generate_demo_dataset(root, num_train=num_train, num_val=num_val, image_size=size, seed=seed)
    names: list[str] = []
    for split, ann, images in (("train", paths.train_ann, paths.train_images), ("val", paths.val_ann, paths.val_images)):
        data = json.loads(Path(ann).read_text())
        category_ids = sorted(c["id"] for c in data["categories"])
        label_of = {c: k for k, c in enumerate(category_ids)}
        names = [next(c["name"] for c in data["categories"] if c["id"] == i) for i in category_ids]
        lines: dict[int, list[str]] = {im["id"]: [] for im in data["images"]}
        size_of = {im["id"]: (im["width"], im["height"]) for im in data["images"]}
        for a in data["annotations"]:
            if a.get("iscrowd") or not isinstance(a["segmentation"], list):
                continue  # Ultralytics' convert_coco leaves crowds out
            rings = [r for r in a["segmentation"] if len(r) >= 6]
            ring = (np.concatenate(merge_multi_segment(rings), axis=0) if len(rings) > 1
                    else np.asarray(rings[0], np.float64).reshape(-1, 2))
            w, h = size_of[a["image_id"]]
            xy = (ring / [w, h]).reshape(-1).tolist()
            lines[a["image_id"]].append(" ".join([str(label_of[a["category_id"]]), *(f"{v:.6f}" for v in xy)]))
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for im in data["images"]:
            link = root / "images" / split / im["file_name"]
            if split == "train" and prescale is not None:
                cv2.imwrite(str(link.with_suffix(".png")), prescale_image(Path(images) / im["file_name"], prescale))
            elif not link.exists():
                link.symlink_to((Path(images) / im["file_name"]).resolve())
            (root / "labels" / split / f"{Path(im['file_name']).stem}.txt").write_text(
                "".join(f"{line}\n" for line in lines[im["id"]]))
    text = [f"path: {root.resolve()}", "train: images/train", "val: images/val", "names:"]
    text += [f"  {k}: {json.dumps(n)}" for k, n in enumerate(names)]
    (root / "data.yaml").write_text("\n".join(text) + "\n")
    (root / SETTINGS).write_text(json.dumps(settings, indent=1))
    return root / "data.yaml"


def prescale_image(path: Path, long_side: int) -> np.ndarray:
    """The image at ``path`` (BGR) as Ultralytics' ``BaseDataset.load_image`` gives it while augmenting:
    resized to ``long_side`` on its long side (each side ``ceil``-ed, at most ``long_side``), ``INTER_LINEAR``."""
    image = cv2.imread(str(path))
    if image is None:
        raise FileNotFoundError(f"{path}: not a readable image")
    h, w = image.shape[:2]
    r = long_side / max(h, w)
    if r == 1:
        return image
    return cv2.resize(image, (min(math.ceil(w * r), long_side), min(math.ceil(h * r), long_side)),
                      interpolation=cv2.INTER_LINEAR)


def run_settings(side: str, a: argparse.Namespace) -> dict[str, Any]:
    """What one run's numbers depend on besides its seed (its folder already names the start, schedule and variant)."""
    keys = ("train", "val", "size", "data_seed", "imgsz", "epochs", "batch", "workers", "close_mosaic", "device")
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(a).items() if k in keys}
    if getattr(a, "prescale", False):  # recorded only where set: runs made before the flag stay reusable
        settings["prescale"] = True
    if a.start == "finetuned":
        settings["pretrain_epochs"] = a.pretrain_epochs
    if side != "ultralytics":
        # the shipped config's content too: a run made before it changed is not this config's
        settings.update(ours=list(a.ours), cell=a.cell, config=hashlib.sha256(CONFIG.read_bytes()).hexdigest()[:16])
    return settings


def check_settings(folder: Path, settings: dict[str, Any]) -> None:
    """Refuse to reuse ``folder`` when it was made with other settings (or by a version that did not record them).

    Raises:
        SystemExit: naming the folder and the settings that differ.
    """
    saved_file = folder / SETTINGS
    saved = json.loads(saved_file.read_text()) if saved_file.is_file() else None
    if saved != settings:
        differ = ("no record of its settings" if saved is None else ", ".join(
            f"{k} {saved.get(k)!r} there, {v!r} now" for k, v in settings.items() if saved.get(k) != v))
        raise SystemExit(f"{folder} holds a run made with other settings ({differ}): delete it, or pass another --out")


# ------------------------------------------------------------------------------ training


def auto_optimizer(nc: int) -> dict[str, Any]:
    """What Ultralytics' ``optimizer=auto`` picks for a run under 10,000 iterations."""
    return {"optimizer": "AdamW", "lr": round(0.002 * 5 / (4 + nc), 6), "momentum": 0.9, "warmup_bias_lr": 0.0}


def _env() -> dict[str, str]:
    return dict(os.environ, YOLO_OFFLINE="1", YOLO_AUTOINSTALL="0", MPLBACKEND="Agg")


def _run(argv: list[str], log: Path) -> float:
    """Run ``argv`` with its output in ``log``; returns its wall time. Raises on a non-zero exit."""
    start = time.perf_counter()
    with log.open("w") as out:
        rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT).returncode
    if rc:
        tail = "".join(log.read_text().splitlines(True)[-30:])
        raise RuntimeError(f"{argv[:4]} failed ({rc}); the end of {log}:\n{tail}")
    return time.perf_counter() - start


def ultralytics_kwargs(run: Path, data_yaml: Path, seed: int, a: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of Ultralytics' ``YOLO(...).train`` for one run."""
    opt = auto_optimizer(a.nc)
    return dict(
        data=str(data_yaml), epochs=a.epochs, batch=a.batch, imgsz=a.imgsz, workers=a.workers, seed=seed,
        device=a.device, nbs=a.batch if a.schedule == "step" else 64, close_mosaic=a.close_mosaic,
        optimizer=opt["optimizer"], lr0=opt["lr"], momentum=opt["momentum"], warmup_bias_lr=opt["warmup_bias_lr"],
        val=False, save_period=1, plots=False, amp=a.device != "cpu", project=str(run.resolve()), name="train",
        exist_ok=True, verbose=False,
    )


def ultralytics_script(weights: str | None, kwargs: dict[str, Any], stop_after: int | None) -> str:
    """The Python run in a subprocess to train Ultralytics' side (``stop_after``: its last epoch, None: all)."""
    script = f"from ultralytics import YOLO\nmodel = YOLO({(weights or 'yolo11n-seg.yaml')!r})\n"
    if stop_after is not None:  # the subprocess runs in the repository root
        script += ("from benchmarks._parity_stop import stop_ultralytics_after\n"
                   f"model.add_callback('on_fit_epoch_end', stop_ultralytics_after({stop_after}))\n")
    return script + f"model.train(**{kwargs!r})\n"


def train_ultralytics(run: Path, data_yaml: Path, seed: int, a: argparse.Namespace, weights: str | None) -> list[Path]:
    """Ultralytics' trainer; returns its per-epoch checkpoints in epoch order."""
    script = ultralytics_script(weights, ultralytics_kwargs(run, data_yaml, seed, a), a.stop_after)
    seconds = _run([sys.executable, "-c", script], run / "train.log")
    (run / "seconds").write_text(f"{seconds:.1f}\n")
    return _ultralytics_checkpoints(run)


def _ultralytics_checkpoints(run: Path) -> list[Path]:
    return sorted((run / "train" / "weights").glob("epoch*.pt"), key=lambda p: int(p.stem[5:]))


def our_overlay(run: Path, data_yaml: Path, seed: int, a: argparse.Namespace, weights: str | None) -> Path:
    """Write this project's overlay config for one run (on top of the shipped YOLO config); returns its path."""
    opt = auto_optimizer(a.nc)
    overlay = {
        "seed_everything": seed,
        "trainer": {
            "accelerator": "cpu" if a.device == "cpu" else "gpu", "devices": 1, "max_epochs": a.epochs,
            "limit_val_batches": 0, "num_sanity_val_steps": 0, "enable_progress_bar": False,
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                       "init_args": {"save_dir": str(run.resolve()), "name": "logs"}},
            "callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                           "init_args": {"dirpath": str((run / "ckpt").resolve()), "filename": "epoch{epoch}",
                                         "auto_insert_metric_name": False, "every_n_epochs": 1, "save_top_k": -1}}],
        },
        "model": {"class_path": "seg_datamodule.integrations.YOLOSegModule", "init_args": {
            "weights": weights, "coco_eval": False, "optimizer": opt["optimizer"], "lr": opt["lr"],
            "momentum": opt["momentum"], "warmup_bias_lr": opt["warmup_bias_lr"],
            "nominal_batch_size": None if a.schedule == "step" else 64}},
        "data": {"dataset": str(data_yaml.resolve()), "image_size": a.imgsz, "batch_size": a.batch,
                 "num_workers": a.workers, "close_mosaic": a.close_mosaic, "seed": seed,
                 "pin_memory": a.device != "cpu"},
    }
    if a.stop_after is not None:
        overlay["trainer"]["callbacks"].append({"class_path": "benchmarks._parity_stop.StopAfterEpoch",
                                                "init_args": {"epoch": a.stop_after}})
    for item in a.ours:  # --ours model.init_args.schedule=lightning: one change at a time
        key, _, value = item.partition("=")
        *parents, leaf = key.split(".")
        node = overlay
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = yaml.safe_load(value)
    (run / "overlay.yaml").write_text(json.dumps(overlay, indent=2))  # JSON is YAML
    return run / "overlay.yaml"


def train_ours(run: Path, data_yaml: Path, seed: int, a: argparse.Namespace, weights: str | None) -> list[Path]:
    """``seg-datamodule fit`` with the shipped YOLO config and an overlay; returns the per-epoch checkpoints."""
    overlay = our_overlay(run, data_yaml, seed, a, weights)
    argv = [sys.executable, "-m", "seg_datamodule", "fit", "--config", str(CONFIG), "--config", str(overlay)]
    seconds = _run(argv, run / "train.log")
    (run / "seconds").write_text(f"{seconds:.1f}\n")
    return _our_checkpoints(run)


def _our_checkpoints(run: Path) -> list[Path]:
    return sorted((run / "ckpt").glob("epoch*.ckpt"), key=lambda p: int(p.stem[5:]))


def train_cell(run: Path, data_yaml: Path, seed: int, a: argparse.Namespace, weights: str | None) -> list[Path]:
    """An off-diagonal cell of the 2x2 (``benchmarks/_parity_cells.py``): one trainer on the other's batches."""
    spec = {"run": str(run.resolve()), "weights": weights,
            "configs": [str(CONFIG), str(our_overlay(run, data_yaml, seed, a, weights))],
            "ultralytics": ultralytics_kwargs(run, data_yaml, seed, a),
            "stop_after": a.stop_after}
    (run / "spec.json").write_text(json.dumps(spec, indent=1))
    argv = [sys.executable, str(ROOT / "benchmarks" / "_parity_cells.py"), a.cell, str(run / "spec.json")]
    seconds = _run(argv, run / "train.log")
    (run / "seconds").write_text(f"{seconds:.1f}\n")
    return _ultralytics_checkpoints(run) if a.cell == "ultralytics-loop-our-data" else _our_checkpoints(run)


# ------------------------------------------------------------------------------ the evaluator


def as_ultralytics_checkpoint(ckpt: Path, names: list[str]) -> Path:
    """This project's Lightning checkpoint (its ``state_dict`` is the EMA) stored as Ultralytics stores one."""
    import torch

    from seg_datamodule.integrations import YOLOSegModule

    from ultralytics.utils import LOGGER

    out = ckpt.with_suffix(".pt")
    if not out.is_file():
        level = LOGGER.level
        LOGGER.setLevel("WARNING")  # its "Overriding model.yaml nc=80 with nc=4", once per checkpoint
        try:
            module = YOLOSegModule.load_from_checkpoint(ckpt, map_location="cpu", weights=None)
        finally:
            LOGGER.setLevel(level)
        model = module.model.eval()
        model.names = dict(enumerate(names))
        torch.save({"model": None, "ema": model.half(), "train_args": {"task": "segment"}}, out)
    return out


def evaluate(weights: Path, val_json: Path, val_images: Path, a: argparse.Namespace) -> dict[str, float]:
    """Segm and bbox AP / AP50 of ``weights`` (an Ultralytics checkpoint): its predictor, pycocotools' COCOeval."""
    import contextlib
    import io

    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval
    from ultralytics import YOLO

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(val_json))
    category_ids = sorted(gt.getCatIds())
    images = sorted(gt.dataset["images"], key=lambda im: im["id"])
    model = YOLO(str(weights), task="segment")
    dets: list[dict[str, Any]] = []
    for im in images:
        r = model.predict(str(val_images / im["file_name"]), imgsz=a.imgsz, conf=0.001, iou=0.7, max_det=300,
                          retina_masks=True, device=a.device, verbose=False)[0]
        if r.masks is None or not len(r.boxes):
            continue
        masks = r.masks.data.cpu().numpy().astype(np.uint8)
        for box, score, cls, m in zip(r.boxes.xyxy.tolist(), r.boxes.conf.tolist(), r.boxes.cls.tolist(), masks):
            rle = mask_utils.encode(np.asfortranarray(m))
            rle["counts"] = rle["counts"].decode()
            dets.append({"image_id": im["id"], "category_id": category_ids[int(cls)], "score": float(score),
                         "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]], "segmentation": rle})
    out = {}
    for iou_type in ("segm", "bbox"):
        if not dets:
            out[f"{iou_type}_AP"] = out[f"{iou_type}_AP50"] = 0.0
            continue
        with contextlib.redirect_stdout(io.StringIO()):
            dt = gt.loadRes([dict(d) for d in dets])
            ev = COCOeval(gt, dt, iou_type)
            ev.evaluate(), ev.accumulate(), ev.summarize()
        out[f"{iou_type}_AP"], out[f"{iou_type}_AP50"] = float(ev.stats[0]), float(ev.stats[1])
    return out


# ------------------------------------------------------------------------------ the benchmark


def pretrain(out: Path, a: argparse.Namespace) -> str:
    """A checkpoint trained by Ultralytics on other generated data (``--pretrain-epochs``, a step per batch)."""
    done = out / "pretrain" / "train" / "weights" / "last.pt"
    if done.is_file():
        return str(done)
    data = make_dataset(out / "pretrain_data", num_train=a.train, num_val=a.val, size=a.size, seed=a.data_seed + 1)
    p = argparse.Namespace(**{**vars(a), "epochs": a.pretrain_epochs, "schedule": "step", "stop_after": None})
    (out / "pretrain").mkdir(parents=True, exist_ok=True)
    print(f"pretraining on other data ({a.pretrain_epochs} epochs, Ultralytics) ...", flush=True)
    train_ultralytics(out / "pretrain", data, 0, p, None)
    return str(done)


def run_side(side: str, seed: int, out: Path, data_yaml: Path, weights: str | None, a: argparse.Namespace,
             val_json: Path, val_images: Path, names: list[str]) -> dict[str, Any]:
    """Train one side at one seed (or reuse it) and score each epoch."""
    label = side if side == "ultralytics" or not a.variant else f"{side}-{a.variant}"
    run = out / f"{label}_seed{seed}"
    result_file = run / "result.json"
    settings = run_settings(side, a)
    if result_file.is_file():
        check_settings(run, settings)
        result = json.loads(result_file.read_text())
        if len(result["epochs"]) < a.kept:
            raise SystemExit(f"{run} holds {len(result['epochs'])} epochs of the schedule (--stop-after), "
                             f"{a.kept} asked for: delete it to train it further")
        return {**result, "epochs": result["epochs"][: a.kept]}
    run.mkdir(parents=True, exist_ok=True)
    (run / SETTINGS).write_text(json.dumps(settings, indent=1))
    print(f"training {side} seed {seed} ...", flush=True)
    trainer = train_ultralytics if side == "ultralytics" else train_cell if a.cell else train_ours
    ckpts = trainer(run, data_yaml, seed, a, weights)
    if len(ckpts) != a.kept:
        raise RuntimeError(f"{run}: {len(ckpts)} epoch checkpoints, expected {a.kept}")
    epochs = []
    for ckpt in ckpts:
        pt = as_ultralytics_checkpoint(ckpt, names) if ckpt.suffix == ".ckpt" else ckpt
        epochs.append(evaluate(pt, val_json, val_images, a))
    result = {"side": side, "label": label, "seed": seed, "train_seconds": float((run / "seconds").read_text()), "epochs": epochs}
    result_file.write_text(json.dumps(result, indent=1))
    return result


def ratio_interval(ours: list[float], theirs: list[float], draws: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """The 95 % bootstrap interval of ``mean(ours) / mean(theirs)``: each side's seeds resampled with
    replacement, on its own, ``draws`` times (percentiles 2.5 and 97.5; NaN where ``theirs`` draws 0).

    With AP this early in training a seed's spread is as large as the gap being measured, so a
    ratio of means of 3 seeds a side is read with its interval.
    """
    rng = np.random.default_rng(seed)
    a, b = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    num = a[rng.integers(0, len(a), (draws, len(a)))].mean(1)
    den = b[rng.integers(0, len(b), (draws, len(b)))].mean(1)
    ratios = num[den > 0] / den[den > 0]
    if not len(ratios):
        return math.nan, math.nan
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def summarise(results: list[dict[str, Any]], epochs: int, label: dict[str, str]) -> list[dict[str, Any]]:
    """Per epoch: each side's mean and standard deviation of segm AP / AP50 over seeds, the ratio of
    means and its 95 % bootstrap interval (:func:`ratio_interval`), and Ultralytics against itself.

    ``peer_halves/segm_AP`` is the ratio of the means of Ultralytics' later half of seeds over its
    earlier half (None under 4 seeds): what the ratio of means reads where the two sides are the
    same trainer, so the spread a ratio of this many seeds shows with no difference at all.
    """
    rows, by_seed = [], sorted(results, key=lambda r: r["seed"])
    for e in range(epochs):
        row: dict[str, Any] = {"epoch": e + 1}
        for key in ("segm_AP", "segm_AP50"):
            values = {side: [r["epochs"][e][key] for r in by_seed
                             if r["side"] == side and r.get("label", side) == label[side]] for side in SIDES}
            for side in SIDES:
                row[f"{side}/{key}"] = (float(np.mean(values[side])), float(np.std(values[side])))
            theirs = row[f"ultralytics/{key}"][0]
            row[f"ratio/{key}"] = row[f"seg_datamodule/{key}"][0] / theirs if theirs > 0 else math.nan
            row[f"ratio_ci95/{key}"] = ratio_interval(values["seg_datamodule"], values["ultralytics"])
        peer = [r["epochs"][e]["segm_AP"] for r in by_seed if r["side"] == "ultralytics"]
        half = len(peer) // 2  # with an odd count the middle seed sits out
        early = np.mean(peer[:half]) if half >= 2 else 0.0
        row["peer_halves/segm_AP"] = float(np.mean(peer[-half:]) / early) if early > 0 else None
        rows.append(row)
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's settings from its command line (``size`` a tuple, ``nc`` the classes, a
    ``--cell`` folded into ``variant``); exits with argparse's message on a bad combination."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "train_parity")
    parser.add_argument("--schedule", choices=("nbs64", "step"), default="nbs64",
                        help="nbs64: Ultralytics' nominal batch 64; step: an optimiser step per batch")
    parser.add_argument("--start", choices=("scratch", "finetuned"), default="scratch")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--train", type=int, default=200, help="generated train images")
    parser.add_argument("--val", type=int, default=50, help="generated val images")
    parser.add_argument("--size", type=int, nargs=2, default=(240, 360), help="min and max generated image side")
    parser.add_argument("--data-seed", type=int, default=61)
    parser.add_argument("--imgsz", type=int, default=256, help="the training canvas (a multiple of 32)")
    parser.add_argument("--epochs", type=int, default=20, help="20: past the runs' take-off (see above)")
    parser.add_argument("--pretrain-epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--stop-after", type=int, metavar="N",
                        help="train on the --epochs schedule but stop each new run after its epoch N (the warmup, "
                             "decay and close_mosaic stay those of --epochs): more seeds for the early epochs at a "
                             "fraction of the cost; a run trained further is reused, its first N epochs")
    parser.add_argument("--close-mosaic", type=int, default=2)
    parser.add_argument("--prescale", action="store_true",
                        help="train images stored resized to --imgsz as Ultralytics' load_image resizes them, so "
                             "both sides resample them once (their own data and run folders, *_prescaled)")
    parser.add_argument("--device", default="cpu", help="cpu, or a CUDA index (0)")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--ours", action="append", default=[], metavar="KEY=VALUE",
                        help="change this project's run: a dotted key of its config (model.init_args.schedule=lightning)")
    parser.add_argument("--variant", default="", help="the name of the --ours changes (its runs' folder)")
    parser.add_argument("--cell", choices=("ultralytics-loop-our-data", "our-loop-ultralytics-data"),
                        help="an off-diagonal cell of the data-vs-loop 2x2 in place of this project's side "
                             "(benchmarks/_parity_cells.py)")
    a = parser.parse_args(argv)
    a.size, a.nc = tuple(a.size), 4
    if bool(a.ours) != bool(a.variant):
        parser.error("--ours changes need a --variant name (their runs' folder), and a --variant some --ours changes")
    if a.stop_after is not None and not 1 <= a.stop_after <= a.epochs:
        parser.error(f"--stop-after must be between 1 and --epochs ({a.epochs}), got {a.stop_after}")
    if a.stop_after == a.epochs:  # the whole schedule: nothing to stop
        a.stop_after = None
    a.kept = a.epochs if a.stop_after is None else a.stop_after
    if a.cell:
        a.variant = a.cell + (f"-{a.variant}" if a.variant else "")
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    suffix = "_prescaled" if a.prescale else ""
    out = a.out / f"{a.start}_{a.schedule}{suffix}"
    out.mkdir(parents=True, exist_ok=True)
    data = a.out / f"data{suffix}"
    data_yaml = make_dataset(data, num_train=a.train, num_val=a.val, size=a.size, seed=a.data_seed,
                             prescale=a.imgsz if a.prescale else None)
    val_json = data / "annotations" / "instances_val2017.json"
    val_images = data / "val2017"
    names = [line.split(": ", 1)[1].strip('"') for line in data_yaml.read_text().splitlines() if line.startswith("  ")]
    weights = pretrain(a.out, a) if a.start == "finetuned" else None
    import ultralytics

    results = [run_side(side, seed, out, data_yaml, weights, a, val_json, val_images, names)
               for seed in a.seeds for side in a.sides]
    label = {"ultralytics": "ultralytics", "seg_datamodule": f"seg_datamodule-{a.variant}" if a.variant else "seg_datamodule"}
    rows = summarise(results, a.kept, label) if set(a.sides) == set(SIDES) else []
    print(f"\nYOLO11n-seg {a.start}, schedule {a.schedule}: {a.train} train / {a.val} val generated images, "
          f"canvas {a.imgsz}, batch {a.batch}, {a.epochs} epochs"
          + (f" (stopped after epoch {a.kept})" if a.kept < a.epochs else "")
          + f", seeds {a.seeds}, device {a.device}; "
          f"ultralytics {ultralytics.__version__}" + (f"; this project's variant {a.variant}: {a.ours}" if a.variant else ""))
    print("epoch  segm AP: ultralytics        seg_datamodule     ratio (95 % interval)  ultralytics' halves | "
          "AP50: ultralytics    seg_datamodule     ratio")
    for r in rows:
        u, s, u50, s50 = (r["ultralytics/segm_AP"], r["seg_datamodule/segm_AP"],
                          r["ultralytics/segm_AP50"], r["seg_datamodule/segm_AP50"])
        lo, hi = r["ratio_ci95/segm_AP"]
        halves = r["peer_halves/segm_AP"]
        print(f"{r['epoch']:5d}  {u[0]:.4f} +- {u[1]:.4f}   {s[0]:.4f} +- {s[1]:.4f}   {r['ratio/segm_AP']:5.2f} "
              f"({lo:5.2f}-{hi:5.2f})  {'' if halves is None else f'{halves:5.2f}':>19s} | "
              f"{u50[0]:.4f} +- {u50[1]:.4f}   {s50[0]:.4f} +- {s50[1]:.4f}   {r['ratio/segm_AP50']:5.2f}")
    if rows:
        lo, hi = rows[-1]["ratio_ci95/segm_AP"]
        which = "last epoch" if a.kept == a.epochs else f"epoch {a.kept}"
        print(f"{which}: segm AP ratio {rows[-1]['ratio/segm_AP']:.2f}, 95 % bootstrap interval over seeds "
              f"{lo:.2f}-{hi:.2f}")
    for side in a.sides if a.kept == a.epochs else ():  # runs stopped early and runs reused differ in length
        secs = [r["train_seconds"] for r in results if r["side"] == side]
        side = label[side]
        print(f"{side}: training wall time {np.mean(secs):.0f} s per run (mean of {len(secs)})")
    name = f"results{'-' + a.variant if a.variant else ''}{f'-epochs1-{a.kept}' if a.kept < a.epochs else ''}.json"
    (out / name).write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()},
                                                  "runs": results, "summary": rows}, indent=1))


if __name__ == "__main__":
    main()
