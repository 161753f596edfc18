"""Small synthetic Ultralytics datasets for the io/yolo tests: images of chosen sizes, label files of chosen lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

#: A triangle of class 0 and a square of class 1, normalised; on a 40 x 60 (H x W) image.
TRIANGLE = "0 0.1 0.1 0.5 0.1 0.5 0.5"
SQUARE = "1 0.6 0.6 0.9 0.6 0.9 0.9 0.6 0.9"


def write_image(path: Path, size: tuple[int, int], seed: int = 0, orientation: int | None = None) -> None:
    """A random JPEG of ``size`` (H, W) as stored; with ``orientation``, that EXIF tag."""
    pixels = np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {"quality": 95}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        options["exif"] = exif.tobytes()
    Image.fromarray(pixels).save(path, "JPEG", **options)


def make_dataset(root: Path, labels: dict[str, str | None], *, split: str = "train", size: tuple[int, int] = (40, 60),
                 names: list[str] | None = None, extra: str = "") -> Path:
    """``root/data.yaml`` with one split ``images/<split>``: an image per key of ``labels``, its label
    file holding the text (None: no label file). Returns the YAML."""
    for k, (name, text) in enumerate(sorted(labels.items())):
        write_image(root / "images" / split / name, size, seed=k)
        if text is not None:
            label = root / "labels" / split / (Path(name).stem + ".txt")
            label.parent.mkdir(parents=True, exist_ok=True)
            label.write_text(text)
    names = names or ["a", "b"]
    yaml = root / "data.yaml"
    yaml.write_text(f"path: {root}\n{split}: images/{split}\nnames: {names}\n{extra}")
    return yaml
