"""``COCOResultsWriter``: a Lightning ``BasePredictionWriter`` that writes a COCO results JSON.

Per predict batch it takes what ``predict_step`` returned, either
:class:`~seg_datamodule.evaluation.predictions.CocoDetections` (detections already in original
pixels, what :meth:`~seg_datamodule.demo.model.YolactLite.predict_step` returns) or one dict of
canvas predictions per image (as :meth:`~seg_datamodule.evaluation.coco_metric.COCOMaskMAP.update`
takes them, mapped here with the batch's letterbox by
:func:`~seg_datamodule.evaluation.results.batch_detections`), and keeps their results entries
(:func:`~seg_datamodule.evaluation.results.detections_to_results`).

At the end of the predict epoch it writes two files:

* ``output``: the results list (what ``COCO.loadRes`` and the COCO evaluation server read);
* the image file (``images_file``, default ``<output stem>_images.json``): a COCO image-info
  file of every image predicted (``id``, ``file_name`` relative to the predict folder when the
  DataModule knows it, ``height``, ``width``), the ``categories``, and an ``info`` summary:
  ``images_predicted``, ``detections``, ``images_skipped`` by reason (bad images the loader left
  out, see :mod:`~seg_datamodule.data.samples.predict`), ``files_ignored`` (files of the folder that are
  not images) and ``left_out_when_listing`` (entries of a JSON source its index left out, by
  reason), the thresholds and the source. For a folder it is the id -> file mapping; it also
  indexes as ``test_ann`` / ``predict_ann``. The console line says the same counts.

Under DDP each rank writes its shard (``<output>.rank<r>.json``) beside ``output``, then rank 0
merges them (an image that came through twice is kept once, its first occurrence), writes the
two files and removes the shards; every rank returns once they exist. The folder must be one
that all ranks see (the same machine, or a shared file system across nodes).
"""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import rank_zero_info

from seg_datamodule.evaluation.predictions import CocoDetections
from seg_datamodule.io.images.decode import BadImageError
from seg_datamodule.evaluation.results import batch_detections, detections_to_results
from seg_datamodule.ops.checks import check_int, check_number

__all__ = ["COCOResultsWriter"]


class COCOResultsWriter(BasePredictionWriter):
    """Write ``trainer.predict``'s detections as a COCO results JSON (and an image-info file beside it).

    Args:
        output (str): the results file, e.g. ``runs/predict/results.json`` (folders are created).
        score_threshold (float): keep detections scoring at least this.
        max_per_image (int | None): keep the best this many per image (None: all); COCO scores 100.
        mask_threshold (float): probability above which a mask pixel is foreground, for canvas
            predictions (detections already encoded are kept as they are).
        category_ids (Sequence[int] | None): COCO category id of each label, for canvas
            predictions; None takes the DataModule's ``category_ids``.
        images_file (str | None): the image-info file; None: ``<output stem>_images.json``.
        draw_dir (str | None): also write the first :attr:`draw_max_images` images predicted there
            (``<image id>.jpg``), as shown (EXIF applied for a folder), with their detections
            scoring at least :attr:`draw_min_score` drawn: masks, boxes, class names and scores
            (:func:`~seg_datamodule.visualize.draw_results`). None (default): no pictures.

    Raises:
        TypeError, ValueError: a bad argument.
    """

    #: With ``draw_dir``: how many images are drawn, and the score a detection needs to be drawn.
    draw_max_images: int = 50
    draw_min_score: float = 0.3

    def __init__(
        self,
        output: str = "results.json",
        score_threshold: float = 0.0,
        max_per_image: int | None = 100,
        mask_threshold: float = 0.5,
        category_ids: Sequence[int] | None = None,
        images_file: str | None = None,
        draw_dir: str | None = None,
    ) -> None:
        super().__init__(write_interval="batch")
        self.draw_dir = None if draw_dir is None else Path(draw_dir)
        if not isinstance(output, (str, os.PathLike)) or not str(output):
            raise TypeError(f"output must be a file path, got {output!r}")
        self.output = Path(output)
        self.images_file = Path(images_file) if images_file is not None else self.output.with_name(
            f"{self.output.stem}_images.json")
        self.score_threshold = float(check_number("score_threshold", score_threshold))
        self.max_per_image = check_int("max_per_image", max_per_image, 1, allow_none=True)
        check_number("mask_threshold", mask_threshold, 0.0, 1.0)
        self.mask_threshold = float(mask_threshold)
        self.category_ids = None if category_ids is None else [int(c) for c in category_ids]
        self._reset()

    def _reset(self) -> None:
        self._results: list[dict[str, Any]] = []
        self._images: dict[int, tuple[int, int]] = {}  # id -> (H, W), in the order predicted
        self._skipped: collections.Counter[str] = collections.Counter()

    # ------------------------------------------------------------------ hooks

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()

    def write_on_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Keep the batch's results entries (the files are written at the end of the epoch).

        Raises:
            TypeError: ``prediction`` is neither ``CocoDetections`` nor a list of dicts.
        """
        if isinstance(prediction, CocoDetections):
            dets = prediction
        elif isinstance(prediction, Sequence) and all(isinstance(p, Mapping) for p in prediction):
            dets = batch_detections(prediction, batch, self._category_ids(trainer), self.mask_threshold)
        else:
            raise TypeError(
                "predict_step must return CocoDetections or one dict of canvas predictions per image for "
                f"COCOResultsWriter, got {type(prediction).__name__}"
            )
        sizes = {int(i): (int(h), int(w)) for i, (h, w) in zip(batch.image_ids.tolist(), batch.orig_sizes.tolist())}
        fresh = {i: s for i, s in sizes.items() if i not in self._images}
        self._images.update(fresh)
        # An image seen before on this rank (a padded repeat) keeps its first results only.
        results = detections_to_results(dets, sizes, self.score_threshold, self.max_per_image)
        self._results.extend(r for r in results if r["image_id"] in fresh)
        for key, value in (getattr(batch, "counts", None) or {}).items():
            if key.startswith("image_") and value:
                self._skipped[key] += int(value)

    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_predict_epoch_end(trainer, pl_module)
        shard = {"results": self._results, "images": [[i, h, w] for i, (h, w) in self._images.items()],
                 "skipped": dict(self._skipped)}
        world, rank = int(trainer.world_size), int(trainer.global_rank)
        if world == 1:
            self._write(trainer, [shard])
            return
        self.output.parent.mkdir(parents=True, exist_ok=True)
        _write_json(self._shard_path(rank), shard)
        trainer.strategy.barrier("coco_results_shards")
        if rank == 0:
            paths = [self._shard_path(r) for r in range(world)]
            shards = [json.loads(p.read_text()) for p in paths]
            self._write(trainer, shards)
            for path in paths:
                path.unlink()
        trainer.strategy.barrier("coco_results_merged")

    # ------------------------------------------------------------------ files

    def _shard_path(self, rank: int) -> Path:
        return self.output.with_name(f"{self.output.name}.rank{rank}.json")

    def _category_ids(self, trainer: pl.Trainer) -> list[int]:
        if self.category_ids is not None:
            return self.category_ids
        ids = getattr(getattr(trainer, "datamodule", None), "category_ids", None)
        if ids is None:
            raise ValueError("COCOResultsWriter needs category_ids= when the DataModule does not provide category_ids")
        return [int(c) for c in ids]

    def _write(self, trainer: pl.Trainer, shards: list[dict[str, Any]]) -> None:
        """Merge shards (first occurrence of an image wins) and write the results and image files."""
        results: list[dict[str, Any]] = []
        images: dict[int, tuple[int, int]] = {}
        skipped: collections.Counter[str] = collections.Counter()
        for shard in shards:
            fresh = {int(i): (int(h), int(w)) for i, h, w in shard["images"] if int(i) not in images}
            images.update(fresh)
            results.extend(r for r in shard["results"] if r["image_id"] in fresh)
            skipped.update(shard["skipped"])
        datamodule = getattr(trainer, "datamodule", None)
        listing = _listing_counts(datamodule)
        ignored = listing.pop("files_ignored", 0)
        _write_json(self.output, results)
        _write_json(self.images_file, {
            "info": {
                "description": f"images predicted into {self.output.name} by seg_datamodule's COCOResultsWriter",
                "images_predicted": len(images), "detections": len(results),
                "images_skipped": dict(sorted(skipped.items())), "files_ignored": ignored,
                "left_out_when_listing": listing, "score_threshold": self.score_threshold,
                "max_per_image": self.max_per_image, "source": _source(datamodule),
            },
            "images": _image_entries(images, datamodule),
            "categories": _categories(datamodule, self.category_ids),
        })
        drawn = self._draw(results, list(images), datamodule) if self.draw_dir is not None else 0
        left_out = "".join(f", {key} {n}" for key, n in listing.items())
        rank_zero_info(
            f"COCOResultsWriter: {len(results)} detections on {len(images)} images -> {self.output} "
            f"(images: {self.images_file}); skipped {sum(skipped.values())} bad images {dict(skipped) or ''}".rstrip()
            + f"; {ignored} files ignored (not images){left_out}"
            + (f"; {drawn} pictures -> {self.draw_dir}" if self.draw_dir is not None else "")
        )

    def _draw(self, results: list[dict[str, Any]], predicted: list[int], datamodule: Any) -> int:
        """Draw the first images predicted (ids in order) with their results into ``draw_dir``; how many were written."""
        import cv2

        from seg_datamodule.io.images.exif import decode_oriented, exif_orientation
        from seg_datamodule.visualize import draw_results

        listing = getattr(getattr(datamodule, "predict_dataset", None), "images", None)
        if listing is None:
            return 0
        names = {int(c["id"]): str(c["name"]) for c in _categories(datamodule, self.category_ids)}
        by_image: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
        for r in results:
            by_image[int(r["image_id"])].append(r)
        assert self.draw_dir is not None
        self.draw_dir.mkdir(parents=True, exist_ok=True)
        written = 0
        position = {int(image_id): i for i, image_id in enumerate(listing.image_ids.tolist())}
        for image_id in [i for i in predicted if i in position][: self.draw_max_images]:
            path = listing.path(position[image_id])
            try:
                data = Path(path).read_bytes()
                image, _ = decode_oriented(data, exif_orientation(data) if listing.oriented else 1, name=path)
            except (OSError, ValueError, BadImageError):  # skipped and counted when predicting: nothing to draw
                continue
            picture, _ = draw_results(image, by_image.get(int(image_id), []), names, self.draw_min_score)
            cv2.imwrite(str(self.draw_dir / f"{image_id}.jpg"), cv2.cvtColor(picture, cv2.COLOR_RGB2BGR))
            written += 1
        return written


def _write_json(path: Path, value: Any) -> None:
    """Write atomically: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def _listing_counts(datamodule: Any) -> dict[str, int]:
    """What the DataModule's predict source left out while listing (``files_ignored``, index skips)."""
    listing = getattr(getattr(datamodule, "predict_dataset", None), "images", None)
    return {str(k): int(v) for k, v in sorted((getattr(listing, "counts", None) or {}).items())}


def _source(datamodule: Any) -> str | None:
    dataset = getattr(datamodule, "predict_dataset", None)
    images = getattr(dataset, "images", None)
    return getattr(images, "source", None)


def _image_entries(images: Mapping[int, tuple[int, int]], datamodule: Any) -> list[dict[str, Any]]:
    """COCO ``images`` entries, with ``file_name`` when the DataModule's predict source has it."""
    names: dict[int, str] = {}
    dataset = getattr(datamodule, "predict_dataset", None)
    listing = getattr(dataset, "images", None)
    if listing is not None:
        names = dict(zip(listing.image_ids.tolist(), listing.file_names))
    out = []
    for image_id, (height, width) in sorted(images.items()):
        entry: dict[str, Any] = {"id": image_id, "height": height, "width": width}
        if image_id in names:
            entry["file_name"] = names[image_id]
        out.append(entry)
    return out


def _categories(datamodule: Any, category_ids: Sequence[int] | None) -> list[dict[str, Any]]:
    ids = category_ids if category_ids is not None else getattr(datamodule, "category_ids", None)
    if ids is None:
        return []
    names = getattr(datamodule, "class_names", None) if category_ids is None else None
    return [{"id": int(c), "name": names[k] if names else str(c)} for k, c in enumerate(ids)]
