"""Where the package keeps what it generates (index caches, the demo dataset), and its lock."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

import filelock

__all__ = ["cache_root", "file_lock"]


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


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive inter-process lock on ``path`` (created if needed), with ``filelock``.

    Serialises processes that would build the same cached artefact (DDP ranks starting at once).
    The folder is created if needed.

    Args:
        path: the lock file.

    Raises:
        OSError: the folder cannot be created or the lock file cannot be opened.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(path):
        yield
