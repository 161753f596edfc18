"""Label lines: every bad case raised naming the file and line, or skipped and counted with nothing else lost;
the numbers against a plain Python reading of the same text."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _yolo_cases import SQUARE, TRIANGLE, make_dataset
from seg_datamodule.io.coco.building import BoxOnlyError
from seg_datamodule.io.images.decode import BadImageError
from seg_datamodule.io.yolo import YOLO_SKIP_REASONS, BadLabelError, build_yolo_index
from seg_datamodule.io.yolo.labels import parse_label_files

# (case, bad line, reason): each goes in as line 2 of b.txt, between two good lines.
BAD_LINES = [
    ("class not a number", "x 0.1 0.1 0.5 0.1 0.5 0.5", "label_not_numbers"),
    ("coordinate not a number", "0 0.1 0.1 0.5 abc 0.5 0.5", "label_not_numbers"),
    ("comma separated", "0 0.1,0.1 0.5 0.1 0.5 0.5", "label_not_numbers"),
    ("class beyond names", "2 0.1 0.1 0.5 0.1 0.5 0.5", "label_bad_class"),
    ("negative class", "-1 0.1 0.1 0.5 0.1 0.5 0.5", "label_bad_class"),
    ("fractional class", "0.5 0.1 0.1 0.5 0.1 0.5 0.5", "label_bad_class"),
    ("odd coordinates", "0 0.1 0.1 0.5 0.1 0.5 0.5 0.7", "polygon_odd_coordinates"),
    ("three coordinates", "0 0.1 0.1 0.5", "polygon_odd_coordinates"),
    ("one point", "0 0.1 0.1", "polygon_too_few_points"),  # two points are four numbers: a box
    ("a class alone", "1", "polygon_too_few_points"),
    ("NaN", "0 0.1 0.1 nan 0.1 0.5 0.5", "polygon_non_finite"),
    ("inf", "0 0.1 0.1 0.5 inf 0.5 0.5", "polygon_non_finite"),
    ("above 1", "0 0.1 0.1 1.5 0.1 0.5 0.5", "label_out_of_range"),
    ("pixels, not normalised", "0 6 4 30 4 30 20", "label_out_of_range"),
    ("below 0", "0 0.1 -0.02 0.5 0.1 0.5 0.5", "label_out_of_range"),
    ("box of zero width", "1 0.5 0.5 0 0.2", "bbox_non_positive"),
    ("box out of range", "1 0.5 1.5 0.2 0.2", "label_out_of_range"),
    ("duplicate line", TRIANGLE, "label_duplicate_line"),
    ("collinear polygon", "0 0.1 0.1 0.2 0.2 0.3 0.3", "zero_area"),
]


def _dataset(tmp_path: Path, bad: str) -> Path:
    return make_dataset(tmp_path, {"a.jpg": f"{SQUARE}\n", "b.jpg": f"{TRIANGLE}\n{bad}\n{SQUARE}\n"})


@pytest.mark.parametrize("line, reason", [c[1:] for c in BAD_LINES], ids=[c[0] for c in BAD_LINES])
def test_a_bad_line_raises_naming_the_file_and_line(tmp_path: Path, line: str, reason: str) -> None:
    yaml = _dataset(tmp_path, line)
    with pytest.raises(BadLabelError) as info:
        build_yolo_index(yaml, "train", use_cache=False)
    label = tmp_path / "labels" / "train" / "b.txt"
    assert str(info.value).startswith(f"{label}:2: ") and "(image b.jpg, id " in str(info.value)
    assert info.value.reason == reason and info.value.line == 2 and info.value.label_file == str(label)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("line, reason", [c[1:] for c in BAD_LINES], ids=[c[0] for c in BAD_LINES])
def test_a_bad_line_is_skipped_and_counted(tmp_path: Path, line: str, reason: str,
                                          caplog: pytest.LogCaptureFixture) -> None:
    yaml = _dataset(tmp_path, line)
    with caplog.at_level(logging.WARNING, logger="seg_datamodule.io.coco"):
        index = build_yolo_index(yaml, "train", use_cache=False, on_bad_sample="skip")
    assert index.skip_counts == {reason: 1} and set(index.skip_counts) <= set(YOLO_SKIP_REASONS)
    # Nothing else lost: a's square, b's triangle and square, in line order.
    assert [index.labels(i).tolist() for i in range(2)] == [[1], [0, 1]]
    np.testing.assert_allclose(index.polygons(1).instance(0)[0], [[6, 4], [30, 4], [30, 20]])
    assert index.num_instances + sum(index.skip_counts.values()) == 4
    assert any(reason in r.getMessage() and "b.txt:2" in r.getMessage() for r in caplog.records)


def test_box_lines_are_refused_by_default_or_dropped_and_counted_not_errors(tmp_path: Path) -> None:
    yaml = make_dataset(tmp_path, {"a.jpg": f"{TRIANGLE}\n1 0.5 0.5 0.2 0.3\n", "b.jpg": "0 0.3 0.3 0.1 0.1\n"})
    with pytest.raises(BoxOnlyError) as caught:  # box_only: raise, the default
        build_yolo_index(yaml, "train", use_cache=False)
    assert f"{tmp_path / 'labels' / 'train' / 'a.txt'}: 1 box lines of 2" in str(caught.value)
    assert "1 of those images would have no target left" in str(caught.value)
    index = build_yolo_index(yaml, "train", use_cache=False, box_only="drop")  # not a problem: no BadLabelError
    assert index.skip_counts == {} and index.dropped_counts["box_only"] == 2 and index.num_instances == 1
    assert index.source_counts == {"image_box_only": 2}


def test_line_ends_bom_and_blank_lines(tmp_path: Path) -> None:
    text = f"\ufeff{TRIANGLE}\r\n\r\n   \n\t{SQUARE}  \r{TRIANGLE.replace('0.5 0.5', '0.5 0.45')}"
    yaml = make_dataset(tmp_path, {"a.jpg": None})
    (tmp_path / "labels/train/a.txt").parent.mkdir(parents=True)
    (tmp_path / "labels/train/a.txt").write_bytes(text.encode("utf-8"))
    index = build_yolo_index(yaml, "train", use_cache=False)
    assert index.labels(0).tolist() == [0, 1, 0] and index.skip_counts == {}


@pytest.mark.parametrize("mode", ["raise", "skip"])
def test_bad_files(tmp_path: Path, mode: str) -> None:
    """A missing image (named in a list), an image that is not one, an unreadable label file, an unsafe list line."""
    yaml = make_dataset(tmp_path, {"a.jpg": f"{TRIANGLE}\n", "b.jpg": f"{TRIANGLE}\n{SQUARE}\n", "c.jpg": SQUARE,
                                   "d.jpg": TRIANGLE})
    (tmp_path / "images/train/b.jpg").write_bytes(b"not an image")
    (tmp_path / "labels/train/c.txt").unlink()
    (tmp_path / "labels/train/c.txt").mkdir()  # a label "file" that cannot be read
    (tmp_path / "train.txt").write_text("images/train/a.jpg\nimages/train/b.jpg\nimages/train/c.jpg\n"
                                        "images/train/d.jpg\nimages/train/e.jpg\n/etc/passwd.jpg\n")
    yaml.write_text(yaml.read_text().replace("train: images/train", "train: train.txt"))
    if mode == "raise":  # the list's bad line first, then the images in order
        with pytest.raises(BadLabelError, match=r"train.txt:6: image path '/etc/passwd.jpg' is an absolute path"):
            build_yolo_index(yaml, "train", use_cache=False)
        (tmp_path / "train.txt").write_text("\n".join((tmp_path / "train.txt").read_text().split("\n")[:5]))
        with pytest.raises(BadImageError, match=r"images/train/b.jpg is corrupt") as info:
            build_yolo_index(yaml, "train", use_cache=False)
        assert info.value.reason == "image_corrupt"
        return
    index = build_yolo_index(yaml, "train", use_cache=False, on_bad_sample="skip")
    assert index.skip_counts == {"image_unsafe_file_name": 1, "image_corrupt": 1, "label_of_skipped_image": 2,
                                 "image_label_unreadable": 1, "image_missing": 1}
    assert [index.file_name(i) for i in range(len(index))] == ["images/train/a.jpg", "images/train/d.jpg"]


@settings(max_examples=40)
@given(st.lists(st.tuples(st.integers(0, 4), st.lists(st.floats(0, 1, width=32), min_size=6, max_size=14)),
                min_size=0, max_size=6), st.integers(1, 4), st.integers(1, 4))
def test_numbers_match_a_plain_python_reading(lines: list, h: int, w: int) -> None:
    """Every kept line's points are float(token) * size, exactly; kept + counted = the lines."""
    text = "".join(f"{c} {' '.join(repr(v) for v in (vs if len(vs) % 2 == 0 else vs[:-1]))}\n" for c, vs in lines)
    parsed = parse_label_files([text.encode()], np.array([[h * 10, w * 10]]), 5)
    assert len(parsed.labels) + parsed.box_only.sum() + len(parsed.problems) == parsed.lines.sum() == len(lines)
    offsets = np.concatenate([[0], np.cumsum(parsed.ring_lens)])
    for k, number in enumerate(parsed.line):
        cls, *tokens = text.split("\n")[number - 1].split()
        expected = np.array([float(t) for t in tokens]).reshape(-1, 2) * [w * 10, h * 10]
        assert parsed.labels[k] == int(cls)
        np.testing.assert_array_equal(parsed.vertices[offsets[k]:offsets[k + 1]], expected)


def test_a_header_is_read_not_the_image(tmp_path: Path) -> None:
    """A JPEG whose scan data is garbage indexes from its header (decoding is the loader's job, or verify_images)."""
    yaml = make_dataset(tmp_path, {"a.jpg": f"{TRIANGLE}\n"})
    path = tmp_path / "images/train/a.jpg"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] + bytes(len(data) - len(data) // 2 - 2) + b"\xff\xd9")
    assert build_yolo_index(yaml, "train", use_cache=False).image_size(0) == (40, 60)
