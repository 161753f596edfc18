"""The paths a user names (annotation files, image folders), checked where they are given.

A wrong ``train_ann`` found when the index is built costs a model build and a traceback; checked in
the DataModule's ``__init__`` (which LightningCLI runs before it builds the model) it is one line
naming the key, what it expected and what is there instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from seg_datamodule.errors import UserInputError

__all__ = ["InputPathError", "check_input_path"]


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
