"""Ultralytics label files -> polygon instances in pixels, every line checked, bad lines named by file and line.

A label file holds one instance per line: ``class x1 y1 x2 y2 ... xn yn`` (a polygon, coordinates
normalised by the image's width and height) or ``class cx cy w h`` (a box). Blank lines are
ignored; a byte-order mark and ``\\r\\n`` / ``\\r`` line ends are accepted, as Ultralytics does.

Every file of a split is parsed at once: the texts are joined into one buffer, tokens and line
ends are found with numpy, and the numbers are read by numpy's C parser in one call (a file with
a token that is not a number is then read again line by line, to name that line). Each line is
checked, the first failing check naming it (:data:`~seg_datamodule.io.yolo.errors.YOLO_SKIP_REASONS`):
a class that is not an integer index of ``names``; then for a box line a width or height <= 0,
else an odd number of coordinates, fewer than 3 points; then a non-finite coordinate, one outside
``[0, 1]`` by more than :data:`TOLERANCE` (Ultralytics' 1 %); a line equal to an earlier line of
its file (Ultralytics drops these too); a polygon covering no pixel of its image. A good box line
is a box without a mask: counted as ``box_only`` and returned apart (``box_file``, ``box_labels``,
``box_xywh``), for ``box_only: keep``. Coordinates are parsed as float64 and
scaled by the image's (turned) size.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple, Sequence

import numpy as np

from seg_datamodule.io.coco.instances import ZERO_AREA_RTOL, covers_pixels
from seg_datamodule.ops.geometry import zero_area_instances
from seg_datamodule.ops.ragged import offsets_from_lengths, ragged_index

__all__ = ["TOLERANCE", "LineProblem", "ParsedLabels", "parse_label_files"]

#: How far outside ``[0, 1]`` a normalised coordinate may lie (Ultralytics' check allows 1 %).
TOLERANCE = 0.01
_WHITESPACE = np.zeros(256, bool)
_WHITESPACE[[9, 10, 11, 12, 13, 32]] = True


class LineProblem(NamedTuple):
    """A bad line: which file (position in the input), its line number (1-based), reason, detail."""

    file: int
    line: int
    reason: str
    detail: str


class ParsedLabels(NamedTuple):
    """The good polygon lines of every file, in file then line order.

    Attributes:
        file (ndarray[N] int64): the file each instance is from (position in the input).
        line (ndarray[N] int64): its line number (1-based).
        labels (ndarray[N] int64): its class.
        ring_lens (ndarray[N] int64): its number of points.
        vertices (ndarray[V, 2] float64): the points of every instance, in pixels.
        box_only (ndarray[F] int64): good box lines per file.
        box_file (ndarray[B] int64): the file of each good box line, in file then line order.
        box_labels (ndarray[B] int64): its class.
        box_xywh (ndarray[B, 4] float64): its ``[x, y, w, h]`` box in pixels (COCO's convention).
        lines (ndarray[F] int64): non-blank lines per file.
        problems (list[LineProblem]): the bad lines, in file then line order.
    """

    file: np.ndarray
    line: np.ndarray
    labels: np.ndarray
    ring_lens: np.ndarray
    vertices: np.ndarray
    box_only: np.ndarray
    lines: np.ndarray
    problems: list[LineProblem]
    box_file: np.ndarray = np.zeros(0, np.int64)
    box_labels: np.ndarray = np.zeros(0, np.int64)
    box_xywh: np.ndarray = np.zeros((0, 4))


def _numbers(text: bytes, expected: int) -> np.ndarray | None:
    """The numbers of ``text`` if it holds exactly ``expected`` tokens that are all numbers, else None."""
    if expected == 0:
        return np.zeros(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # numpy < 2.x warns instead of raising
            values = np.fromstring(text, sep=" ")  # noqa: NPY201 - the text mode is not deprecated
    except ValueError:
        return None
    return values if len(values) == expected else None


class _Layout(NamedTuple):
    """Where the lines and tokens of the joined buffer are."""

    line_start: np.ndarray  # byte offset of each line
    line_end: np.ndarray
    line_file: np.ndarray  # file of each line
    line_number: np.ndarray  # 1-based, within its file
    tokens: np.ndarray  # tokens per line
    file_bytes: np.ndarray  # byte span of each file: offsets[F + 1]


def _layout(contents: Sequence[bytes]) -> tuple[bytes, _Layout]:
    """Join the files (normalised line ends, one ``\\n`` after each) and find their lines and tokens."""
    texts = []
    for text in contents:
        if text.startswith(b"\xef\xbb\xbf"):
            text = text[3:]
        texts.append(text.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + b"\n")
    big = b"".join(texts)
    file_bytes = offsets_from_lengths(np.fromiter(map(len, texts), np.int64, len(texts)))
    buf = np.frombuffer(big, np.uint8)
    newline = np.flatnonzero(buf == 10)
    line_start = np.concatenate([[0], newline[:-1] + 1]).astype(np.int64)
    space = _WHITESPACE[buf]
    starts = np.flatnonzero(~space & np.concatenate([[True], space[:-1]]))
    tokens = np.bincount(np.searchsorted(newline, starts), minlength=len(newline))
    lines_per_file = np.diff(np.searchsorted(newline, file_bytes))  # each file ends with its own newline
    line_file = np.repeat(np.arange(len(texts)), lines_per_file)
    first = offsets_from_lengths(lines_per_file)[:-1]
    line_number = np.arange(len(newline)) - np.repeat(first, lines_per_file) + 1
    return big, _Layout(line_start, newline, line_file, line_number, tokens, file_bytes)


def _parse_numbers(big: bytes, layout: _Layout) -> tuple[np.ndarray, np.ndarray]:
    """Every token's number, and per line whether a token is not a number (its values NaN)."""
    total = int(layout.tokens.sum())
    values = _numbers(big, total)
    not_numbers = np.zeros(len(layout.tokens), bool)
    if values is not None:
        return values, not_numbers
    # Some token is not a number: find it file by file, then line by line within a failing file.
    values = np.full(total, np.nan)
    token_of_line = offsets_from_lengths(layout.tokens)
    line_of_file = offsets_from_lengths(np.bincount(layout.line_file, minlength=len(layout.file_bytes) - 1))
    for f in range(len(layout.file_bytes) - 1):
        l0, l1 = line_of_file[f], line_of_file[f + 1]
        t0, t1 = token_of_line[l0], token_of_line[l1]
        found = _numbers(big[layout.file_bytes[f]:layout.file_bytes[f + 1]], int(t1 - t0))
        if found is not None:
            values[t0:t1] = found
            continue
        for line in range(l0, l1):
            found = _numbers(big[layout.line_start[line]:layout.line_end[line]], int(layout.tokens[line]))
            if found is None:
                not_numbers[line] = True
            else:
                values[token_of_line[line]:token_of_line[line + 1]] = found
    return values, not_numbers


def _duplicates(line_file: np.ndarray, starts: np.ndarray, counts: np.ndarray, values: np.ndarray,
                candidates: np.ndarray) -> np.ndarray:
    """Among the ``candidates`` lines, those equal (class and every number) to an earlier line of their file."""
    out = np.zeros(len(counts), bool)
    lines = np.flatnonzero(candidates)
    if len(lines) < 2:
        return out
    # A cheap fingerprint groups lines that may be equal; equality is then checked exactly.
    offsets = offsets_from_lengths(counts[lines])
    token = ragged_index(starts[lines], counts[lines])
    weights = np.cos(np.arange(len(token)) - np.repeat(offsets[:-1], counts[lines]))
    fingerprint = np.add.reduceat(values[token] * weights, offsets[:-1])
    order = np.lexsort((lines, fingerprint, counts[lines], line_file[lines]))
    keys = np.stack([line_file[lines], counts[lines], fingerprint], 1)[order]
    same = np.concatenate([[False], (keys[1:] == keys[:-1]).all(1)])
    run_start = np.maximum.accumulate(np.where(same, 0, np.arange(len(same))))
    ordered = lines[order]
    for k in np.flatnonzero(same):  # a line whose file and fingerprint an earlier line has: rare
        b = ordered[k]
        row = values[starts[b]:starts[b] + counts[b]]
        out[b] = any(np.array_equal(values[starts[a]:starts[a] + counts[a]], row) for a in ordered[run_start[k]:k])
    return out


def parse_label_files(contents: Sequence[bytes], sizes: np.ndarray, num_classes: int) -> ParsedLabels:
    """Parse and check label files (see the module docstring).

    Args:
        contents (Sequence[bytes]): each file's bytes.
        sizes (ndarray[F, 2] int64): the ``(H, W)`` of each file's image, as decoded (turned).
        num_classes (int): C; a class must be an integer in ``0..C-1``.

    Returns:
        ParsedLabels.
    """
    big, layout = _layout(contents)
    values, not_numbers = _parse_numbers(big, layout)
    counts = layout.tokens
    starts = offsets_from_lengths(counts)[:-1]
    used = counts > 0
    reason = np.zeros(len(counts), np.int8)  # 0 ok, else 1 + index into _REASONS

    def mark(where: np.ndarray, key: str) -> None:
        reason[where & used & (reason == 0)] = _REASONS.index(key) + 1

    mark(not_numbers, "label_not_numbers")
    cls = np.full(len(counts), np.nan)
    cls[used] = values[starts[used]]
    with np.errstate(invalid="ignore"):
        mark(~(np.isfinite(cls) & (cls == np.floor(cls)) & (cls >= 0) & (cls < num_classes)), "label_bad_class")
    coords = counts - 1
    box = coords == 4
    mark(~box & (coords % 2 == 1), "polygon_odd_coordinates")
    mark(~box & (coords < 6), "polygon_too_few_points")
    # Coordinates: per line, any non-finite or out-of-range value.
    is_coord = np.ones(len(values), bool)
    is_coord[starts[used]] = False
    line_of_token = np.repeat(np.arange(len(counts)), counts)
    finite = np.isfinite(values)
    mark(np.bincount(line_of_token[is_coord & ~finite], minlength=len(counts)) > 0, "polygon_non_finite")
    with np.errstate(invalid="ignore"):
        outside = is_coord & finite & ((values < -TOLERANCE) | (values > 1 + TOLERANCE))
    mark(np.bincount(line_of_token[outside], minlength=len(counts)) > 0, "label_out_of_range")
    box_sides = np.full((len(counts), 2), np.nan)
    box_sides[box & used] = values[starts[box & used, None] + [3, 4]]
    with np.errstate(invalid="ignore"):
        mark(box & (box_sides <= 0).any(1), "bbox_non_positive")
    mark(_duplicates(layout.line_file, starts, counts, values, used & (reason == 0) & ~box), "label_duplicate_line")

    # Polygons in pixels; then the ones covering no pixel.
    polygon = used & ~box & (reason == 0)
    lines = np.flatnonzero(polygon)
    points = coords[lines] // 2
    token = ragged_index(starts[lines] + 1, coords[lines])
    xy = values[token].reshape(-1, 2)
    size = np.asarray(sizes, np.float64)[np.repeat(layout.line_file[lines], points)]
    vertices = xy * size[:, ::-1]
    ring_offsets = offsets_from_lengths(points)
    with np.errstate(invalid="ignore", over="ignore"):
        zero = zero_area_instances(vertices, ring_offsets, np.arange(len(lines) + 1), ZERO_AREA_RTOL)
    empty = np.zeros(len(lines), bool)
    for k in np.flatnonzero(zero):
        v0, v1 = ring_offsets[k], ring_offsets[k + 1]
        empty[k] = not covers_pixels(vertices[v0:v1], np.array([0, v1 - v0]), np.asarray(sizes)[layout.line_file[lines[k]]])
    if empty.any():
        degenerate = np.zeros(len(counts), bool)
        degenerate[lines[empty]] = True
        mark(degenerate, "zero_area")
        keep_vertex = np.repeat(~empty, points)
        lines, points, vertices = lines[~empty], points[~empty], vertices[keep_vertex]

    problems = [
        LineProblem(int(layout.line_file[k]), int(layout.line_number[k]), _REASONS[reason[k] - 1],
                    _detail(_REASONS[reason[k] - 1], int(counts[k]), cls[k], num_classes))
        for k in np.flatnonzero(reason)
    ]
    files = len(layout.file_bytes) - 1
    # Good box lines: cx cy w h normalised -> [x, y, w, h] in pixels.
    boxes = np.flatnonzero(box & used & (reason == 0))
    cxcywh = values[starts[boxes, None] + np.arange(1, 5)].reshape(-1, 4)
    wh = np.asarray(sizes, np.float64).reshape(-1, 2)[layout.line_file[boxes]][:, ::-1].reshape(-1, 2)
    xywh = np.concatenate([(cxcywh[:, :2] - cxcywh[:, 2:] / 2) * wh, cxcywh[:, 2:] * wh], 1)
    return ParsedLabels(
        file=layout.line_file[lines].astype(np.int64), line=layout.line_number[lines].astype(np.int64),
        labels=cls[lines].astype(np.int64), ring_lens=points.astype(np.int64), vertices=vertices,
        box_only=np.bincount(layout.line_file[box & used & (reason == 0)], minlength=files).astype(np.int64),
        lines=np.bincount(layout.line_file[used], minlength=files).astype(np.int64), problems=problems,
        box_file=layout.line_file[boxes].astype(np.int64), box_labels=cls[boxes].astype(np.int64), box_xywh=xywh,
    )


_REASONS = (
    "label_not_numbers", "label_bad_class", "polygon_odd_coordinates", "polygon_too_few_points",
    "polygon_non_finite", "label_out_of_range", "bbox_non_positive", "label_duplicate_line", "zero_area",
)


def _detail(reason: str, tokens: int, cls: float, num_classes: int) -> str:
    """What is wrong with a line, for its message."""
    return {
        "label_not_numbers": "holds a token that is not a number",
        "label_bad_class": f"class {cls:g} is not an integer in 0..{num_classes - 1} (the names of the data.yaml)",
        "polygon_odd_coordinates": f"has {tokens - 1} coordinates after the class, an odd number",
        "polygon_too_few_points": f"has {(tokens - 1) // 2} points; a polygon needs at least 3 (a box: class cx cy w h)",
        "polygon_non_finite": "has a NaN or infinite coordinate",
        "label_out_of_range": f"has a coordinate outside [0, 1] (tolerance {TOLERANCE}); are they pixels, not "
                              "normalised?",
        "bbox_non_positive": "is a box (class cx cy w h) whose width or height is not positive",
        "label_duplicate_line": "repeats an earlier line of the file",
        "zero_area": "is a polygon that covers no pixel",
    }[reason]
