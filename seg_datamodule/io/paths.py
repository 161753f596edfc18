"""Where the package keeps what it generates (index caches, the demo dataset)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

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
    """An exclusive advisory lock on ``path`` (created if needed) where the OS has ``fcntl``.

    Serialises processes that would build the same cached artefact (DDP ranks starting at once);
    without ``fcntl`` (Windows) it does nothing and the callers' atomic renames keep them safe.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
