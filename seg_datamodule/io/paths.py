"""Paths: the ones a user names, checked where given; the ones the package trusts (its cache folder, private
and locked, and image names kept inside their root).

The paths a user names (annotation files, image folders), checked where they are given.

A wrong ``train_ann`` found when the index is built costs a model build and a traceback; checked in
the DataModule's ``__init__`` (which LightningCLI runs before it builds the model) it is one line
naming the key, what it expected and what is there instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import Iterator, Literal

import filelock

from seg_datamodule.errors import UserInputError

__all__ = ["InputPathError", "cache_root", "file_lock", "file_name_problem", "make_private_dirs", "check_input_path"]


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


def make_private_dirs(folder: Path) -> None:
    """Create ``folder`` and its missing parents, readable by their owner only (mode 0o700).

    Folders that exist already keep their mode.

    Raises:
        OSError: a level cannot be created (read-only, or a file stands in the way).
    """
    missing = []
    level = folder
    while not level.exists() and not level.is_symlink() and level != level.parent:
        missing.append(level)
        level = level.parent
    for level in reversed(missing):
        level.mkdir(mode=0o700, exist_ok=True)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive inter-process lock on ``path`` (created if needed, mode 0o600), with ``filelock``.

    Serialises processes that would build the same cached artefact (DDP ranks starting at once).
    Missing folders are created private (:func:`make_private_dirs`). A symlink planted at
    ``path`` is never followed.

    Args:
        path: the lock file.

    Raises:
        OSError: the folder cannot be created, the lock file cannot be opened, or ``path`` is a
            symlink.
    """
    make_private_dirs(path.parent)
    # filelock >= 4 opens with O_NOFOLLOW itself; older versions follow links (and truncate).
    if path.is_symlink():
        raise OSError(errno.ELOOP, "refusing to follow a symlink at the lock path", str(path))
    with filelock.FileLock(path, mode=0o600):
        yield


def file_name_problem(file_name: str) -> str | None:
    """What makes an image's ``file_name`` unsafe to join to its image root, or None.

    Unsafe: an absolute path, one that leaves the root through ``..`` (``sub/../../x``), a NUL
    byte, or a string that is not valid Unicode (a lone surrogate from a ``\\ud800`` escape).
    Checked on the name alone, so symlinks inside the root (a linked image folder) still work.

    Args:
        file_name: the JSON's ``file_name``.

    Returns:
        a phrase such as ``"is an absolute path"``, or None when the name is safe.
    """
    if "\x00" in file_name:
        return "has a NUL byte"
    try:
        file_name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate)"
    separators = "/\\" if os.name == "nt" else "/"
    if os.path.isabs(file_name) or file_name[:1] in separators or os.path.splitdrive(file_name)[0]:
        return "is an absolute path"
    depth = 0
    for part in file_name.replace("\\", "/").split("/") if os.name == "nt" else file_name.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return "leaves the image root through '..'"
        elif part not in ("", "."):
            depth += 1
    return None


class InputPathError(UserInputError, FileNotFoundError):
    """A path argument that does not exist, or is not the kind of path it must be (file or folder)."""


def check_input_path(name: str, value: str | os.PathLike[str] | None, kind: Literal["file", "folder"]) -> None:
    """Check that ``value`` (when given) is an existing file or folder.

    Args:
        name: the argument, as the user writes it (``"train_ann"``).
        value: the path; ``None`` (not given) passes.
        kind: ``"file"`` or ``"folder"``.

    Raises:
        InputPathError: ``value`` does not exist, or is a folder where a file belongs or the
            other way round. The message names the argument, the path (and its absolute form
            when relative) and what is there.
    """
    if value is None:
        return
    path = Path(value).expanduser()
    shown = repr(str(value)) if path.is_absolute() else f"{str(value)!r} ({path.absolute()})"
    expected = "an existing file" if kind == "file" else "an existing folder"
    if not path.exists():
        found = "no such file or folder" + (" (a broken link)" if path.is_symlink() else "")
    elif kind == "file" and path.is_dir():
        found = "a folder"
    elif kind == "folder" and not path.is_dir():
        found = "a file, not a folder"
    else:
        return
    raise InputPathError(f"{name}: expected {expected}, got {shown}: {found}")
