"""Where an Ultralytics split's labels were looked for, and the nearest folder there is (a misnamed ``labels/``).

Ultralytics finds an image's label file by its path alone (:func:`~seg_datamodule.io.yolo.image_lists.label_path`):
the last ``/images/`` becomes ``/labels/``, the suffix ``.txt``. A folder named ``Labels/`` or
``label/`` is then never read, and every image is a background. :func:`labels_not_found_hint`
says where the label file of one image was expected and which folder at the first missing level
comes closest to the name expected there.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from seg_datamodule.io.yolo.image_lists import label_path

__all__ = ["labels_not_found_hint", "nearest_folder"]


def nearest_folder(expected: Path) -> tuple[Path, str, Path | None]:
    """The first level of ``expected`` that does not exist, and the folder there whose name is nearest.

    Args:
        expected: a path that does not exist (a label file).

    Returns:
        (the deepest existing folder above it, the missing name below that folder, the folder in
        it whose name matches the missing one ignoring case or comes close to it, or None).
    """
    missing = expected
    while not missing.parent.exists() and missing.parent != missing:
        missing = missing.parent
    parent, name = missing.parent, missing.name
    try:
        folders = sorted(entry.name for entry in os.scandir(parent) if entry.is_dir())
    except OSError:
        folders = []
    same = [f for f in folders if f.lower() == name.lower()]
    close = same or difflib.get_close_matches(name, folders, n=1, cutoff=0.6)
    return parent, name, (parent / close[0]) if close else None


def labels_not_found_hint(image_path: str) -> str:
    """Where the label file of ``image_path`` was looked for, and the nearest folder that exists.

    Returns:
        e.g. ``"labels are looked for by Ultralytics' rule (the last /images/ in an image's path
        becomes /labels/, the suffix .txt): /d/labels/train/1.txt for /d/images/train/1.jpg; /d has
        no labels/ but has Labels/: rename it labels"``.
    """
    expected = Path(label_path(image_path))
    rule = (f"labels are looked for by Ultralytics' rule (the last {os.sep}images{os.sep} in an image's path becomes "
            f"{os.sep}labels{os.sep}, the suffix .txt): {expected} for {image_path}")
    if f"{os.sep}images{os.sep}" not in image_path:
        return f"{rule} (no images folder in its path, so beside the image)"
    parent, name, near = nearest_folder(expected)
    if expected.parent.exists():
        return f"{rule}; {expected.parent} exists but holds no label file of this split's images"
    if near is None:
        return f"{rule}; {parent} has no folder {name}/"
    return f"{rule}; {parent} has no {name}/ but has {near.name}/: rename it {name}"
