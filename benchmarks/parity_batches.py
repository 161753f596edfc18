"""What the two sides of the training-parity benchmark train on: Ultralytics' batches against this DataModule's.

``benchmarks/train_parity.py`` found the gap of its fine-tuned, step-per-batch cell in the data
half of its 2x2 (Ultralytics' own trainer fed this DataModule's batches dips as far). This script
reads the batches themselves: it draws ``--epochs`` epochs of mosaic batches from each loader on the
benchmark's generated data (Ultralytics' ``build_yolo_dataset`` and ``build_dataloader`` as its
trainer builds them, per-instance masks; this DataModule built by the project's CLI from the shipped
YOLO config and the benchmark's own overlay, its HSV jitter applied as on the device) and prints,
side by side with their ratio:

* instances per image, box width and height (fractions of the canvas), mask pixels on the
  stride-4 grid, the mask's share of its box, the canvas share the masks cover;
* colour: the mean channel value, HSV saturation and value per image, the grey of the padding
  (the most common exact grey of an image, its share over 5 %) and the canvas share it fills
  (the share of the image's most common exact grey: the mosaic's and the affine's border), and
  the sharpness (the mean step between neighbouring pixels);
* with ``--start finetuned``: the loss terms and the gradient's total norm before clipping of
  each batch at the checkpoint both sides start from, through Ultralytics' own model and loss
  (``overlap_mask=False`` on both), with no optimiser step.

The benchmark's folder (``--out``, as ``train_parity.py``'s) must hold its data, and its
checkpoint for ``--start finetuned``: run ``train_parity.py`` first. ``--ours KEY=VALUE`` changes
this DataModule's side as ``train_parity.py --ours`` does (``data.mask_fill=ultralytics``).

Usage (needs ``pip install "seg-datamodule[ultralytics]"``)::

    python benchmarks/parity_batches.py --out runs/train_parity --start finetuned
    python benchmarks/parity_batches.py --out runs/train_parity --start finetuned --ours data.mask_fill=ultralytics
    python benchmarks/parity_batches.py --out runs/train_parity --start finetuned --prescale
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train_parity as tp  # noqa: E402  (the benchmark's data, settings and overlay)

KEYS = ("instances / image", "box width", "box height", "mask px (stride 4)", "mask / box", "masks cover",
        "channel mean", "saturation", "value", "padding grey", "padding share", "sharpness")


def batch_stats(batches: Iterable[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Per-image and per-instance numbers of Ultralytics-style batch dicts.

    Args:
        batches: dicts with ``img`` (B, 3, H, W) uint8 RGB, ``batch_idx`` (N,), ``bboxes`` (N, 4)
            normalised ``xywh`` and ``masks`` (N, H / 4, W / 4) per instance.

    Returns:
        One array per :data:`KEYS` name: per image, or per instance for the box and mask rows.
    """
    import torch

    out: dict[str, list[float]] = {k: [] for k in KEYS}
    for b in batches:
        img = b["img"].float() / 255
        n = len(img)
        idx = b["batch_idx"].long().view(-1)
        boxes, masks = b["bboxes"].float(), b["masks"].float()
        h, w = masks.shape[-2:]
        out["instances / image"] += torch.bincount(idx, minlength=n).tolist()
        out["box width"] += boxes[:, 2].tolist()
        out["box height"] += boxes[:, 3].tolist()
        pixels = masks.sum((1, 2))
        out["mask px (stride 4)"] += pixels.tolist()
        out["mask / box"] += (pixels / (boxes[:, 2] * w * boxes[:, 3] * h).clamp(min=1e-6)).tolist()
        out["masks cover"] += [float((masks[idx == i].sum(0) > 0).float().mean()) if (idx == i).any() else 0.0
                               for i in range(n)]
        high, low = img.max(1).values, img.min(1).values
        out["channel mean"] += img.mean((1, 2, 3)).tolist()
        out["saturation"] += ((high - low) / high.clamp(min=1e-6)).mean((1, 2)).tolist()
        out["value"] += high.mean((1, 2)).tolist()
        # Mean step between neighbouring pixels: resampling twice (resize, then warp) blurs more than once.
        out["sharpness"] += ((img[..., 1:] - img[..., :-1]).abs().mean((1, 2, 3))
                             + (img[..., 1:, :] - img[..., :-1, :]).abs().mean((1, 2, 3))).div(2).tolist()
        for im in b["img"].numpy().astype(np.int64):
            grey = (im[0] == im[1]) & (im[1] == im[2])
            counts = np.bincount(im[0][grey], minlength=256)
            out["padding share"].append(counts.max() / grey.size)  # the border fill, greyed by HSV per image
            if grey.mean() > 0.05:
                out["padding grey"].append(float(counts.argmax()))
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def ultralytics_batches(a: argparse.Namespace, data_yaml: Path, epochs: int) -> tuple[list[dict[str, Any]], Any]:
    """``epochs`` epochs of Ultralytics' own train loader (seed 0, per-instance masks), built as its
    trainer builds it; returns them and its train settings."""
    from _parity_cells import _ultralytics_loader

    spec = {"ultralytics": tp.ultralytics_kwargs(a.out / "parity_batches", data_yaml, 0, a)}  # nothing is written
    _, loader, args = _ultralytics_loader(spec, overlap_mask=False)
    return [batch for _ in range(epochs) for batch in loader], args


def our_batches(a: argparse.Namespace, data_yaml: Path, weights: str | None, epochs: int) -> list[dict[str, Any]]:
    """``epochs`` epochs of this DataModule's batches (seed 0), as Ultralytics' trainer reads them."""
    import torch

    from _parity_cells import OurBatches, _cli

    with tempfile.TemporaryDirectory() as run:  # the overlay, and what the DataModule's setup logs; nothing trains
        cli = _cli([str(tp.CONFIG), str(tp.our_overlay(Path(run), data_yaml, 0, a, weights))])
        cli.datamodule.trainer = cli.trainer
        batches = OurBatches(cli.datamodule)
        return [{k: v.cpu() if torch.is_tensor(v) else v for k, v in b.items()} for _ in range(epochs) for b in batches]


def loss_and_gradient(weights: str, args: Any, batches: list[dict[str, Any]]) -> np.ndarray:
    """Each batch's loss terms (box, seg, cls, dfl) and total gradient norm at ``weights``, no step taken.

    Returns:
        (batches, 5): the four terms as Ultralytics logs them, then the norm before clipping.
    """
    import torch
    from ultralytics import YOLO

    model = YOLO(weights).model.float().train()
    model.args = args
    for name, param in model.named_parameters():
        param.requires_grad = ".dfl" not in name  # as Ultralytics' trainer freezes the DFL's fixed convolution
    rows = []
    for b in batches:
        model.zero_grad()
        loss, items = model.loss({**b, "img": b["img"].float() / 255})
        loss.sum().backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        terms = list(items.values()) if isinstance(items, dict) else list(items.detach().flatten())
        rows.append([float(t) for t in terms[:4]] + [float(norm)])
    return np.asarray(rows, np.float64)


def describe(name: str, theirs: np.ndarray, ours: np.ndarray) -> str:
    """One line: each side's mean, median and 5th percentile, and the ratio of the means."""
    def cell(v: np.ndarray) -> str:
        return f"{v.mean():9.4f} {np.median(v):9.4f} {np.percentile(v, 5):9.4f}" if len(v) else " " * 29
    ratio = ours.mean() / theirs.mean() if len(ours) and len(theirs) and theirs.mean() else float("nan")
    return f"{name:22s} {cell(theirs)}   {cell(ours)}   {ratio:5.2f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=tp.ROOT / "runs" / "train_parity", help="train_parity.py's --out")
    parser.add_argument("--start", choices=("scratch", "finetuned"), default="finetuned")
    parser.add_argument("--schedule", choices=("nbs64", "step"), default="step")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of batches drawn from each loader")
    parser.add_argument("--ours", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--prescale", action="store_true", help="train_parity.py --prescale's data")
    a = parser.parse_args(argv)
    b = tp.parse_args(["--out", str(a.out), "--start", a.start, "--schedule", a.schedule]
                      + (["--prescale"] if a.prescale else [])
                      + [w for item in a.ours for w in ("--ours", item)] + (["--variant", "x"] if a.ours else []))
    b.draw_epochs = a.epochs
    return b


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    data_yaml = a.out / ("data_prescaled" if a.prescale else "data") / "data.yaml"
    weights = a.out / "pretrain" / "train" / "weights" / "last.pt"
    if not data_yaml.is_file() or (a.start == "finetuned" and not weights.is_file()):
        sys.exit(f"{a.out} holds no benchmark data{' or checkpoint' if a.start == 'finetuned' else ''}: "
                 f"run benchmarks/train_parity.py --out {a.out} --start {a.start}"
                 f"{' --prescale' if a.prescale else ''} first")
    start = str(weights) if a.start == "finetuned" else None
    theirs, args = ultralytics_batches(a, data_yaml, a.draw_epochs)
    ours = our_batches(a, data_yaml, start, a.draw_epochs)
    ts, os_ = batch_stats(theirs), batch_stats(ours)
    print(f"\n{a.draw_epochs} epochs of batches each ({len(theirs)} and {len(ours)} batches), canvas {a.imgsz}, "
          f"batch {a.batch}; this project's changes: {a.ours or 'none'}")
    print(f"{'':22s} {'Ultralytics: mean, median, 5th pct':>29s}   {'this DataModule':>29s}   ratio of means")
    for key in KEYS:
        print(describe(key, ts[key], os_[key]))
    if start:
        t, o = loss_and_gradient(start, args, theirs), loss_and_gradient(start, args, ours)
        print(f"at the start checkpoint {start}, per batch:")
        for k, name in enumerate(("box loss", "seg loss", "cls loss", "dfl loss", "gradient norm")):
            print(describe(name, t[:, k], o[:, k]))


if __name__ == "__main__":
    main()
