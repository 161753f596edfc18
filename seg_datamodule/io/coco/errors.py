"""What can be wrong in a COCO annotation file: skip reasons, the error, the problem log, the summary.

Bad input and ``skip`` counts
    With ``on_bad_sample="raise"`` (default) :class:`BadAnnotationError` is raised for the first
    problem in the JSON (images before annotations, then in file order), naming the annotation
    file, the image id, the annotation id and the image's file name. With ``"skip"`` the entry is
    left out and counted under one reason of :data:`SKIP_REASONS` (an annotation with several
    problems counts once, under the first found); a summary is logged once per build and the counts
    are :attr:`~seg_datamodule.io.coco.index.CocoIndex.skip_counts`. ``image_*`` reasons count
    images, all others count annotations; an image left out takes its annotations with it, counted
    as ``annotation_of_skipped_image``, so ``num_instances + num_crowd + crowd_dropped + box_only
    + skipped annotations`` is exactly the number of annotations in the JSON (``drop_crowd`` /
    ``drop_empty`` are not skips, nor are annotations with a box and no segmentation, dropped as
    ``box_only`` in either mode: :attr:`~seg_datamodule.io.coco.index.CocoIndex.dropped_counts`). Malformed
    structure that cannot be skipped (not a JSON object, ``images`` / ``categories`` missing,
    ``annotations`` not a list, a bad or duplicate category) always raises. Images found bad when
    read (missing, truncated, corrupt, wrong size) raise
    :class:`~seg_datamodule.io.images.decode.BadImageError`, which carries a reason key so a dataset in
    skip mode can count it in a :class:`~seg_datamodule.data.counts.SkipCounter` shared with
    its DataLoader workers;
    ``verify_images=True`` finds them at build instead.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Mapping

from seg_datamodule.errors import UserInputError

__all__ = ["SKIP_REASONS", "BadAnnotationError", "ProblemLog", "error_from_first", "format_skip_summary"]

#: Messages kept per reason, for the log and for ``"raise"`` on a cached index.
MAX_EXAMPLES = 3

#: Every reason a bad image or annotation is skipped for, with what it counts.
SKIP_REASONS: dict[str, str] = {
    # Images (each counts one image entry).
    "image_bad_entry": (
        "image entry without an integer id, a file_name (or, LVIS v1, a coco_url ending in "
        "<folder>/<file>), or positive integer height and width (at most 2^30 pixels, OpenCV's decode "
        "limit), or with neg_category_ids / not_exhaustive_category_ids that are not category ids"
    ),
    "image_unsafe_file_name": (
        "file_name (or the path in coco_url) absolute, leaving the image root through '..', with a NUL "
        "byte or not valid Unicode"
    ),
    "image_duplicate_id": "image entry whose id an earlier entry has (the first one is kept)",
    "image_all_annotations_skipped": (
        "image with no target left after its annotations were skipped as bad: left out, not trained as a background "
        "(its annotations are counted under their own reasons)"
    ),
    "image_missing": "image file does not exist",
    "image_unreadable": "image file exists but cannot be read",
    "image_truncated": "image file cut short",
    "image_corrupt": "image file that cannot be decoded",
    "image_size_mismatch": "decoded size differs from the JSON's height and width",
    # Annotations (each counts one annotation).
    "annotation_bad_entry": (
        "annotation that is not a JSON object, has no integer id, an iscrowd other than 0 or 1, or a "
        "boolean area"
    ),
    "annotation_duplicate_id": "annotation whose id an earlier annotation has (the first is kept)",
    "annotation_unknown_image_id": "annotation whose image_id is not an image's id",
    "annotation_of_skipped_image": "annotation of an image that was skipped",
    "annotation_unknown_category_id": "annotation whose category_id is not a category's id",
    "bbox_invalid": "bbox missing, not 4 numbers (booleans are not numbers), or not finite",
    "bbox_non_positive": "bbox with width or height <= 0",
    "segmentation_empty": "segmentation made only of empty rings ([[]]; missing, null or [] is box_only, not a skip)",
    "segmentation_invalid": (
        "segmentation neither a list of lists of numbers (booleans are not numbers) nor an RLE object"
    ),
    "polygon_odd_coordinates": "polygon ring with an odd number of coordinates",
    "polygon_too_few_points": "polygon ring with fewer than 3 points",
    "polygon_non_finite": "polygon with a NaN or infinite coordinate",
    "polygon_out_of_bounds": (
        "polygon with a coordinate more than 100 image widths (heights) beyond the image's edges"
    ),
    "polygon_too_long": (
        "crowd polygon whose outline is too long (or too far out) for pycocotools to rasterise safely, or whose "
        "RLE its encoder could overflow (on an image of 2^24 pixels or more)"
    ),
    "rle_invalid": (
        "RLE whose counts are not non-negative integers summing to height * width, or whose size "
        "pycocotools cannot hold (height * width >= 2^32), or with a run of 2^29 pixels or more (its "
        "compressed strings cannot hold one)"
    ),
    "rle_size_mismatch": "RLE size differs from the image's height and width",
    "zero_area": "polygon or RLE mask that covers no area",
}


class BadAnnotationError(UserInputError, ValueError):
    """A problem in a COCO annotation file; the message names the file and the ids involved.

    Attributes:
        ann_file (str | None): the annotation file.
        reason (str | None): a key of :data:`SKIP_REASONS`, or for problems that always raise
            ``"not_json"``, ``"not_coco"``, ``"bad_category"`` or ``"duplicate_category_id"``.
        image_id (int | None): COCO image id involved, when known.
        annotation_id (int | None): COCO annotation id involved, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        ann_file: str | os.PathLike[str] | None = None,
        reason: str | None = None,
        image_id: int | None = None,
        annotation_id: int | None = None,
    ) -> None:
        super().__init__(message)
        self.ann_file = None if ann_file is None else str(ann_file)
        self.reason = reason
        self.image_id = image_id
        self.annotation_id = annotation_id


def format_skip_summary(counts: Mapping[str, int]) -> str:
    """One line saying what was skipped, images and annotations apart.

    Keys starting with ``image_`` count images, all others annotations (the convention of
    :data:`SKIP_REASONS` and :attr:`~seg_datamodule.io.coco.index.CocoIndex.dropped_counts`, so
    their merge reads right).

    Args:
        counts: reason -> count.

    Returns:
        e.g. ``"skipped 3 annotations (polygon_too_few_points 2, bbox_non_positive 1) and
        1 image (image_missing 1)"``, or ``"nothing skipped"``.
    """
    parts = []
    for unit, in_unit in (("image", True), ("annotation", False)):
        items = [(r, int(c)) for r, c in counts.items() if c and r.startswith("image_") == in_unit]
        if items:
            total = sum(c for _, c in items)
            detail = ", ".join(f"{r} {c}" for r, c in sorted(items, key=lambda rc: (-rc[1], rc[0])))
            parts.append(f"{total} {unit}{'s' if total != 1 else ''} ({detail})")
    return "skipped " + " and ".join(parts) if parts else "nothing skipped"


class ProblemLog:
    """Counts problems by reason; remembers a few messages and the first problem in file order."""

    def __init__(self, ann_file: Path, on_bad_sample: str) -> None:
        self.ann_file = ann_file
        self.raise_now = on_bad_sample == "raise"
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}
        self.first: tuple[tuple[int, int], dict[str, Any]] | None = None
        #: Ids of the images an annotation was skipped from (one losing every object is left out).
        self.images: set[int] = set()

    def add(
        self,
        order: tuple[int, int],
        reason: str,
        detail: str,
        *,
        image_id: Any = None,
        annotation_id: Any = None,
        file_name: str | None = None,
        what: str = "annotation",
    ) -> None:
        where = [f"{self.ann_file}:"]
        if what == "annotation":
            where.append(
                f"annotation id {annotation_id!r}" if annotation_id is not None else f"annotation #{order[1]}"
            )
            where.append(f"(image id {image_id!r}, file {file_name or '?'}):")
        else:
            where.append(f"image id {image_id!r}" if image_id is not None else f"image #{order[1]}")
            where.append(f"(file {file_name or '?'}):")
        # A lone surrogate (a \\ud800 escape in the JSON) would make the message unprintable.
        message = (" ".join(where) + " " + detail).encode("utf-8", "backslashreplace").decode("utf-8")
        self.counts[reason] += 1
        if what == "annotation" and type(image_id) is int:
            self.images.add(image_id)
        examples = self.examples.setdefault(reason, [])
        if len(examples) < MAX_EXAMPLES:
            examples.append(message)
        if self.first is None or order < self.first[0]:
            ids = {
                "image_id": image_id if type(image_id) is int else None,
                "annotation_id": annotation_id if type(annotation_id) is int else None,
            }
            self.first = (order, {"message": message, "reason": reason, **ids})

    def checkpoint(self) -> None:
        """In raise mode, raise the first problem seen so far."""
        if self.raise_now and self.first is not None:
            raise error_from_first(self.first[1], self.ann_file)


def error_from_first(first: Mapping[str, Any], ann_file: Path | str) -> BadAnnotationError:
    """The error for a problem recorded by :class:`ProblemLog` (``first``: message, reason, ids)."""
    return BadAnnotationError(
        first["message"],
        ann_file=ann_file,
        reason=first["reason"],
        image_id=first.get("image_id"),
        annotation_id=first.get("annotation_id"),
    )
