"""Paths the package trusts: safe image file names, private cache folders, the file lock."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from seg_datamodule.io.paths import file_lock, file_name_problem, make_private_dirs


@pytest.mark.parametrize(
    "name, problem",
    [
        ("a.jpg", None), ("train2017/000000000139.jpg", None), ("sub/../a.jpg", None), ("./a.jpg", None),
        ("../a.jpg", "leaves the image root"), ("sub/../../a.jpg", "leaves the image root"),
        ("..", "leaves the image root"), ("/etc/passwd", "absolute"), ("a\x00.jpg", "NUL"),
        ("b\ud800.jpg", "not valid Unicode"),
    ],
)
def test_file_name_problem(name: str, problem: str | None) -> None:
    found = file_name_problem(name)
    assert (found is None) if problem is None else (problem in found)


def test_make_private_dirs(tmp_path: Path) -> None:
    make_private_dirs(tmp_path / "a" / "b")
    for folder in (tmp_path / "a", tmp_path / "a" / "b"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        make_private_dirs(tmp_path / "file" / "sub")


def test_file_lock_creates_a_private_lock_and_refuses_a_symlink(tmp_path: Path) -> None:
    lock = tmp_path / "new" / "x.lock"
    with file_lock(lock):
        assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    planted = tmp_path / "planted.lock"
    planted.symlink_to(tmp_path / "victim")
    with pytest.raises(OSError):
        with file_lock(planted):
            pass
    assert not (tmp_path / "victim").exists() and os.path.islink(planted)
