"""Fixtures of the COCO tests: the small dataset with its images on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from _coco_cases import _base, _write, _write_images


@pytest.fixture
def image_dataset(tmp_path: Path) -> Path:
    data = _base()
    _write_images(tmp_path, data)
    return _write(tmp_path, data)
