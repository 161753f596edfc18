"""``seg-datamodule inspect``: a static HTML report of one split, to open in a browser from the disk.

The report (:func:`inspect_split`) shows, for the split a config names:

1. what it holds: the scan line of setup (:mod:`~seg_datamodule.data.splits.scan`), what the index left
   out by reason, and the setup error when setup stops the split (a box-only export, nothing to
   learn): the report is written all the same, to show why;
2. the label picture (:func:`~seg_datamodule.pictures.labels.label_figure`);
3. the first images as read (annotations drawn on the original, crowd regions hatched) beside the
   same images through the split's recipe (the training recipe for ``train``: the mosaic built
   around the image, partners drawn as in training; the letterbox for the others);
4. a gallery of the annotations dropped or changed, each drawn on its image in red with its
   reason, annotation id and image id: what the index skips (an index built in skip mode, box-only
   kept, so nothing stops it: bad polygons, zero areas, corrupt or missing images, ...), the
   box-only annotations, the crowd regions, and what the training recipe drops on ``probe``
   samples (``outside`` the canvas, ``clipped`` below ``min_area_ratio``, ``small_box``,
   ``degenerate``; found with the pipeline's ``drop_log``).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from seg_datamodule.errors import UserInputError
from seg_datamodule.io.coco.errors import SKIP_REASONS
from seg_datamodule.pictures.html import Card, Report, write_report
from seg_datamodule.pictures.labels import figure_rgb, label_figure, label_stats
from seg_datamodule.transforms.kernels.polygons import DROP_REASONS
from seg_datamodule.visualize import batch_grid

__all__ = ["inspect_main", "inspect_split"]

#: What each gallery reason beyond the index's skips means.
REASONS = {
    **SKIP_REASONS,
    "crowd": "crowd region (iscrowd=1): not a target; trained as ignored pixels (crowd_as_instances: true trains "
             "them as instances)",
    "box_only": "a box without a mask: box_only decides (raise, drop_images, drop, keep)",
    "outside": "left the canvas entirely in the training recipe (mosaic / affine crop)",
    "clipped": "cut by the canvas to less than min_area_ratio of its area in the training recipe",
    "small_box": "box narrower or lower than min_box_size pixels on the training canvas",
    "degenerate": "no area before clipping",
}
#: Splits of at most this many images are decoded whole for the gallery (a minute or so on 2 cores).
VERIFY_UP_TO = 2000
_SHOWN = 480  # the longer side of a picture in the report
_IDS = re.compile(r"annotation id (-?\d+)|image id (-?\d+)|\bid (-?\d+)\)")


def _fit(image: np.ndarray) -> tuple[np.ndarray, float]:
    scale = min(_SHOWN / max(image.shape[:2]), 1.0)
    if scale == 1.0:
        return image.copy(), 1.0
    size = (max(round(image.shape[1] * scale), 1), max(round(image.shape[0] * scale), 1))
    return cv2.resize(image, size, interpolation=cv2.INTER_AREA), scale


def _draw_annotations(index: Any, i: int, red: set[int] | None = None, boxes: bool = True) -> np.ndarray:
    """Image ``i`` as read, its polygons outlined (those of ``red`` in red, the rest in green), crowd hatched."""
    image, scale = _fit(index.load_image(i))
    crowd = index.crowd_mask(i)
    if crowd is not None:  # hatched in magenta, outlined
        small = cv2.resize(crowd.astype(np.uint8), image.shape[1::-1], interpolation=cv2.INTER_NEAREST)
        yy, xx = np.indices(small.shape)
        hatch = small.astype(bool) & (((yy + xx) // 6) % 2 == 0)
        image[hatch] = (image[hatch] // 2 + np.array([120, 0, 120], np.uint8)).astype(np.uint8)
        contours, _ = cv2.findContours(small, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        cv2.drawContours(image, contours, -1, (230, 0, 230), 2, cv2.LINE_AA)
    polygons, ids, names = index.polygons(i), index.annotation_ids(i), index.class_names
    labels, xywh = index.labels(i), index.bboxes(i)
    for k in range(len(ids)):
        colour = (230, 30, 30) if red and int(ids[k]) in red else (40, 200, 40)
        width = 3 if red and int(ids[k]) in red else 1
        rings = polygons.instance(k)
        for ring in rings:
            cv2.polylines(image, [np.round(ring * scale).astype(np.int32)], True, colour, width, cv2.LINE_AA)
        if boxes or not len(rings):
            x, y, w, h = (v * scale for v in xywh[k])
            cv2.rectangle(image, (round(x), round(y)), (round(x + w), round(y + h)), colour, width)
        cv2.putText(image, names[int(labels[k])], (round(xywh[k][0] * scale) + 2, round(xywh[k][1] * scale) + 11),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.4, colour, 1, cv2.LINE_AA)
    return image


def _owner(index: Any) -> dict[int, int]:
    """Annotation id -> image index, for every target instance of ``index``."""
    columns = index.instance_columns()
    per_image = np.diff(columns["instance_offsets"])
    images = np.repeat(np.arange(len(per_image)), per_image)
    return dict(zip(columns["annotation_ids"].tolist(), images.tolist()))


def _raw_geometry(index: Any, message: str, annotation_id: str | None, i: int) -> list[np.ndarray]:
    """The rings (and box) a skipped annotation has in its file, in image pixels: from the COCO JSON
    (by annotation id) or from the YOLO label line the message names; [] when there is none to draw."""
    rings: list[np.ndarray] = []
    if annotation_id is not None and str(index.ann_file).endswith(".json"):
        entry = _coco_annotations(str(index.ann_file)).get(int(annotation_id), {})
        segmentation = entry.get("segmentation")
        for ring in segmentation if isinstance(segmentation, list) else []:
            values = [float(v) for v in ring if isinstance(v, (int, float))]
            if len(values) >= 2:
                rings.append(np.asarray(values[: len(values) // 2 * 2]).reshape(-1, 2))
        box = entry.get("bbox")
        if isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box):
            x, y, w, h = box
            rings.append(np.array([[x, y], [x + w, y], [x + w, y + h], [x, y + h]], np.float64))
        return rings
    found = re.match(r"(.+\.txt):(\d+):", message)
    if found and Path(found.group(1)).is_file():  # a YOLO line: class, then x y pairs normalised to the image
        lines = Path(found.group(1)).read_text(errors="replace").splitlines()
        line = int(found.group(2))
        if 0 < line <= len(lines):
            try:
                values = [float(v) for v in lines[line - 1].split()[1:]]
            except ValueError:
                return []
            h, w = index.image_size(i)
            if len(values) >= 2:
                rings.append(np.asarray(values[: len(values) // 2 * 2]).reshape(-1, 2) * [w, h])
    return rings


_RAW: dict[str, dict[int, dict]] = {}


def _coco_annotations(ann_file: str) -> dict[int, dict]:
    """A COCO file's annotations by id, read once per report (only when a skipped one is drawn)."""
    if ann_file not in _RAW:
        import json

        data = json.loads(Path(ann_file).read_text())
        _RAW.clear()
        _RAW[ann_file] = {a["id"]: a for a in data.get("annotations", []) if isinstance(a, dict)
                          and isinstance(a.get("id"), int)}
    return _RAW[ann_file]


def _with_rings(picture: np.ndarray, index: Any, i: int, rings: list[np.ndarray]) -> np.ndarray:
    """``picture`` (image ``i`` fitted to the report) with ``rings`` (image pixels) in thick red."""
    scale = picture.shape[0] / index.image_size(i)[0]
    for ring in rings:
        points = np.round(ring * scale).astype(np.int32)
        cv2.polylines(picture, [points], True, (230, 30, 30), 3, cv2.LINE_AA)
        for x, y in points:
            cv2.circle(picture, (int(x), int(y)), 4, (230, 30, 30), -1)
    return picture


def _skip_cards(index: Any, per_reason: int) -> dict[str, list[Card]]:
    """The index's skips by reason, from its examples (messages naming the ids): the skipped annotation
    drawn in red from its file, on its image when the image itself is kept."""
    out: dict[str, list[Card]] = {}
    image_of = {int(v): k for k, v in enumerate(index.image_ids)}
    for reason, messages in index.skip_examples.items():
        cards = []
        for message in messages[:per_reason]:
            found = {"annotation": None, "image": None}
            for ann, img, other in _IDS.findall(message):
                found["annotation"] = found["annotation"] or (ann or None)
                found["image"] = found["image"] or (img or other or None)
            i = image_of.get(int(found["image"])) if found["image"] is not None else None
            picture = None
            if i is not None:
                try:
                    picture = _with_rings(_draw_annotations(index, i), index, i,
                                          _raw_geometry(index, message, found["annotation"], i))
                except Exception:  # the image itself is the problem: a text card
                    picture = None
            title = f"{reason}: annotation id {found['annotation']}" if found["annotation"] else reason
            cards.append(Card(title, message, picture))
        out[reason] = cards
    return out


def _index_cards(index: Any, per_reason: int) -> dict[str, list[Card]]:
    """Crowd regions and box-only annotations of the probe index, drawn on their images."""
    out: dict[str, list[Card]] = {}
    crowded = np.flatnonzero(index.crowd_counts > 0)[:per_reason]
    if len(crowded):
        out["crowd"] = [Card(f"crowd: image id {int(index.image_ids[i])}", f"{index.file_name(int(i))}: crowd "
                             f"annotation ids {index.crowd_annotation_ids(int(i)).tolist()} (hatched)",
                             _draw_annotations(index, int(i))) for i in crowded]
    columns = index.instance_columns()
    box_only = np.flatnonzero(np.diff(columns["instance_ring_offsets"]) == 0)[:per_reason]
    owner = np.repeat(np.arange(len(index)), np.diff(columns["instance_offsets"]))
    if len(box_only):
        out["box_only"] = [
            Card(f"box_only: annotation id {int(columns['annotation_ids'][n])}",
                 f"image id {int(index.image_ids[owner[n]])}, {index.file_name(int(owner[n]))}",
                 _draw_annotations(index, int(owner[n]), {int(columns["annotation_ids"][n])})) for n in box_only]
    return out


def _recipe(datamodule: Any, split: str, index: Any, samples: int, probe: int,
            per_reason: int) -> tuple[list[tuple[Card, Card]], dict[str, list[Card]]]:
    """The first ``samples`` images beside their samples, and the recipe's drops over ``probe`` samples."""
    from seg_datamodule.data.batching.collate import collate_detection
    from seg_datamodule.data.batching.device_pixels import apply_pending_pixels

    dataset = datamodule.train_dataset if split == "train" else getattr(datamodule, f"{split}_dataset", None)
    if dataset is None or not len(dataset):
        return [], {}
    pipeline = dataset.path
    pipeline.drop_log = []
    n, batch = len(dataset), max(min(datamodule.batch_size, 16), 2)
    keys = [(0, k % n) for k in range(max(samples, probe if split == "train" else 0))]
    built = []
    try:
        for start in range(0, len(keys), batch):
            # pixels_on_device: the pixels made here, on the CPU, as the device would make them.
            built.append(apply_pending_pixels(collate_detection(dataset.__getitems__(keys[start : start + batch]))))
    finally:
        drops, pipeline.drop_log = pipeline.drop_log, None
    pairs = []
    names = datamodule.class_names
    for k in range(min(samples, n)):
        one = built[k // batch]
        j = k % batch
        start, count = int(one.boxes_per_image[:j].sum()), int(one.boxes_per_image[j])
        single = _one_of(one, j, start, count)
        grid, _ = _fit(batch_grid(single, 1, 1, names))
        raw = Card(f"image id {int(index.image_ids[k])}", f"{index.file_name(k)} as read", _draw_annotations(index, k))
        pairs.append((raw, Card(f"sample {k} ({'training recipe' if split == 'train' else 'letterbox'})",
                                f"{count} targets", grid)))
    owner = _owner(index)
    gallery: dict[str, list[Card]] = {}
    for ids, codes in drops:
        for ann, code in zip(ids.tolist(), codes.tolist()):
            reason = DROP_REASONS[code]
            cards = gallery.setdefault(reason, [])
            if len(cards) < per_reason and ann in owner and all(str(ann) not in c.title for c in cards):
                i = owner[ann]
                cards.append(Card(f"{reason}: annotation id {ann}", f"image id {int(index.image_ids[i])}, "
                                  f"{index.file_name(i)} (in red)", _draw_annotations(index, i, {ann})))
    return pairs, gallery


def _one_of(batch: Any, j: int, start: int, count: int) -> Any:
    """Image ``j`` of a collated batch as a batch of one."""
    sl = slice(start, start + count)
    return dataclasses.replace(
        batch, images=batch.images[j : j + 1], boxes=batch.boxes[sl], labels=batch.labels[sl], masks=batch.masks[sl],
        boxes_per_image=batch.boxes_per_image[j : j + 1], image_ids=batch.image_ids[j : j + 1],
        annotation_ids=batch.annotation_ids[sl], ignore_masks=batch.ignore_masks[j : j + 1],
        origins=None if batch.origins is None else batch.origins[sl], counts=None)


def inspect_split(datamodule: Any, split: str, folder: str | Path, samples: int = 8, per_reason: int = 6,
                  probe: int = 64, max_epochs: int | None = None, verify_images: bool | None = None) -> Path:
    """Write the report of ``split`` (see the module docstring) into ``folder``.

    Args:
        datamodule (COCOSegDataModule): the configured DataModule (not set up: its errors are shown).
        split: ``"train"``, ``"val"`` or ``"test"``.
        folder: where ``index.html`` and ``images/`` go.
        samples: images shown as read and through the recipe.
        per_reason: gallery pictures per reason.
        probe: training samples built to find what the recipe drops.
        max_epochs: the run's (``close_mosaic`` counts back from it); None: a run long enough that
            the first epoch, the one shown, mosaics.
        verify_images: decode every image of the split in the probe index, so corrupt ones are in
            the gallery; None: when the split has at most :data:`VERIFY_UP_TO` images.

    Returns:
        Path: ``index.html``.
    """
    from seg_datamodule.data.splits.sources import SplitSources

    folder = Path(folder)
    sources = datamodule.sources
    # The probe index: skip mode, box-only kept, nothing refused: every problem is an example.
    options = dataclasses.replace(sources.index_options, on_bad_sample="skip", box_only="keep")
    probe_sources = SplitSources(sources.paths, options, allow_no_targets=True)
    index = probe_sources.split_index(split)
    if index is not None and (verify_images or (verify_images is None and 0 < len(index) <= VERIFY_UP_TO)):
        options = dataclasses.replace(options, verify_images=True)
        index = SplitSources(sources.paths, options, allow_no_targets=True).split_index(split)
    if index is None:
        raise UserInputError(f"seg-datamodule inspect: the config names no {split} split")
    report = Report(title=f"{split}: {probe_sources.named(split) or index.ann_file}", reasons=REASONS)
    stage = {"train": "fit", "val": "validate", "test": "test"}[split]
    try:
        datamodule.setup(stage)
    except UserInputError as error:  # the report shows why setup stops
        report.problem = str(error)
    scan = datamodule.sources.scans.get(split)
    report.facts = ([scan.line()] if scan is not None else []) + [
        index.summary(), f"source counts: {dict(index.source_counts) or 'none'}",
        f"left out by the index (skip mode, in the probe): {index.skip_summary()}"]
    report.label_picture = figure_rgb(label_figure(label_stats(split, index)))
    if report.problem is None:
        if split == "train" and datamodule.train_dataset is not None:
            datamodule.train_dataset.set_max_epochs(max_epochs or 10**6)
        main = datamodule.sources.split_index(split)
        report.samples, recipe_gallery = _recipe(datamodule, split, main, samples, probe, per_reason)
    else:
        recipe_gallery = {}
    report.gallery = {**_skip_cards(index, per_reason), **_index_cards(index, per_reason), **recipe_gallery}
    return write_report(report, folder)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seg-datamodule inspect", allow_abbrev=False,
        description="Write a static HTML report of a split (what it holds, its label picture, images beside their "
                    "samples, and a gallery of the annotations dropped or changed, by reason); open index.html in "
                    "a browser. Other arguments (--config, --data.KEY VALUE) are the fit command's.")
    parser.add_argument("--split", choices=("train", "val", "test"), default="train")
    parser.add_argument("--output", default=None, help="the report's folder (default: runs/inspect/<split>)")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--per-reason", type=int, default=6)
    parser.add_argument("--probe", type=int, default=64, help="training samples built to find the recipe's drops")
    parser.add_argument("--verify-images", action=argparse.BooleanOptionalAction, default=None,
                        help=f"decode every image, to show corrupt ones (default: splits of <= {VERIFY_UP_TO} images)")
    return parser


def inspect_main(argv: Sequence[str], configure: Callable[[Sequence[str]], tuple[Any, Any]]) -> Path:
    """``seg-datamodule inspect [--split S] [--output DIR] --config ...``: write and name the report.

    Args:
        argv: the words after ``inspect``.
        configure: the console script's ``configured`` (the DataModule and config that LightningCLI
            arguments give), passed in so that this module does not import the CLI.
    """
    args, cli_args = _parser().parse_known_args(list(argv))
    datamodule, config = configure(cli_args)
    max_epochs = (config.get("trainer") or {}).get("max_epochs")
    page = inspect_split(datamodule, args.split, args.output or f"runs/inspect/{args.split}", args.samples,
                         args.per_reason, args.probe, max_epochs if isinstance(max_epochs, int) and max_epochs > 0
                         else None, args.verify_images)
    print(f"seg-datamodule inspect: wrote {page} (open it in a browser: file://{page.resolve()})")
    return page
