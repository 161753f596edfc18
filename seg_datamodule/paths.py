"""Where the package keeps what it generates (index caches, the demo dataset)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """The package's cache folder.

    ``$SEG_DATAMODULE_CACHE`` if set, else ``$XDG_CACHE_HOME/seg_datamodule``, else
    ``~/.cache/seg_datamodule``. Index caches go to ``coco_index/`` inside it, the demo dataset to
    ``demo-v<N>/``.
    """
    env = os.environ.get("SEG_DATAMODULE_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "seg_datamodule"
