"""What can be wrong in an Ultralytics dataset: its skip reasons, and the error naming the file and line.

With ``on_bad_sample="raise"`` (default) the first problem (in the split's image order, then
line order; the ``.txt`` lists first) raises: a bad line as :class:`BadLabelError` naming the
label file and line number, a bad image as :class:`~seg_datamodule.io.images.decode.BadImageError`
naming the file. With ``"skip"`` it is left out and counted under one of :data:`YOLO_SKIP_REASONS`
(``image_*`` reasons count images, the others label lines), as COCO's reasons are counted
(:data:`~seg_datamodule.io.coco.SKIP_REASONS`; the reasons they share mean the same).

Not problems, and so never raised: a line ``class cx cy w h`` (a box without a mask) is dropped
and counted as ``box_only`` (``CocoIndex.dropped_counts``), and an image without a label file
is a background image (Ultralytics' convention), kept and counted as ``image_label_missing``
(``CocoIndex.source_counts``, with ``image_label_empty`` for an empty label file).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from seg_datamodule.io.coco import BadAnnotationError
from seg_datamodule.io.images.decode import BadImageError

__all__ = ["BadLabelError", "YOLO_SKIP_REASONS", "error_from_problem"]

#: Every reason a bad image or label line of an Ultralytics dataset is skipped for.
YOLO_SKIP_REASONS: dict[str, str] = {
    # Images (each counts one image, and so all of its label lines).
    "image_missing": "image file listed in a .txt list does not exist",
    "image_unreadable": "image file exists but cannot be read",
    "image_truncated": "image file cut short",
    "image_corrupt": "image file whose header or pixels cannot be decoded",
    "image_unsafe_file_name": "line of a .txt list that is an absolute path or leaves the list's folder through '..'",
    "image_list_unreadable": "a .txt list of images that cannot be read as UTF-8 text",
    "image_label_unreadable": "label file that exists but cannot be read",
    "image_size_mismatch": "image whose size changed since the index was built",
    "image_all_annotations_skipped": "image whose every label line was skipped as bad: left out, not a background",
    # Label lines (each counts one line).
    "label_of_skipped_image": "line of the label file of an image that was skipped",
    "label_not_numbers": "line with a token that is not a number",
    "label_bad_class": "class that is not an integer index of names",
    "label_out_of_range": "coordinate outside [0, 1] beyond Ultralytics' tolerance of 0.01",
    "label_duplicate_line": "line equal to an earlier line of its file (Ultralytics drops these too)",
    "polygon_odd_coordinates": "polygon line with an odd number of coordinates",
    "polygon_too_few_points": "polygon line with fewer than 3 points (a class alone, or 1-2 points)",
    "polygon_non_finite": "line with a NaN or infinite coordinate",
    "bbox_non_positive": "box line (class cx cy w h) whose width or height is <= 0",
    "zero_area": "polygon that covers no pixel of its image",
}


class BadLabelError(BadAnnotationError):
    """A bad line of an Ultralytics label file; the message names the file and the line number.

    Attributes:
        label_file (str | None): the label file (also ``ann_file``).
        line (int | None): the line, 1-based.
        reason (str | None): a key of :data:`YOLO_SKIP_REASONS`.
        image_id (int | None): the image's id, when known.
    """

    def __init__(self, message: str, *, label_file: str | os.PathLike[str] | None = None, line: int | None = None,
                 reason: str | None = None, image_id: int | None = None) -> None:
        super().__init__(message, ann_file=label_file, reason=reason, image_id=image_id)
        self.label_file = self.ann_file
        self.line = line


def error_from_problem(problem: Mapping[str, Any]) -> BadLabelError | BadImageError:
    """The error of a recorded problem (``kind`` ``"image"``: a :class:`~seg_datamodule.io.images.decode.BadImageError`;
    ``"line"`` or ``"label"``, a line or a whole label file: a :class:`BadLabelError`; ``message``, ``reason``,
    ``file``, ``line``, ``image_id``), as the build raises it and a cache built in skip mode records it."""
    if problem.get("kind") == "image":
        return BadImageError(problem["message"], path=problem.get("file"), reason=problem["reason"],
                             image_id=problem.get("image_id"))
    return BadLabelError(problem["message"], label_file=problem.get("file"), line=problem.get("line"),
                         reason=problem["reason"], image_id=problem.get("image_id"))
