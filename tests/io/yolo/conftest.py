"""Ultralytics, which some of these tests take as the reference, kept offline and out of the user's config folder."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_AUTOINSTALL", "0")
if "YOLO_CONFIG_DIR" not in os.environ:
    _config_dir = tempfile.mkdtemp(prefix="seg-datamodule-ultralytics-")
    os.environ["YOLO_CONFIG_DIR"] = _config_dir
    atexit.register(shutil.rmtree, _config_dir, True)
