"""An Ultralytics ``data.yaml``, read safely: its classes, and its splits' paths as Ultralytics resolves them.

What is read (as Ultralytics' ``check_det_dataset`` reads it):

* ``path``: the dataset root. Absent: the YAML's folder. Relative: to the working directory
  when it exists there (as Ultralytics), else to the YAML's folder (Ultralytics then tries its
  ``datasets_dir`` setting, a file of the user's that is not read here). When a split's paths do
  not exist under a working-directory root (``path: .`` run from elsewhere, as CVAT exports it),
  they are looked for under the YAML's folder too.
* ``train``, ``val`` (or ``validation``), ``test`` or any other split: a folder of images, a
  ``.txt`` list of image paths, or a list of either, relative to the root (a missing path
  starting with ``../`` is retried without it, as Ultralytics does). Listing them is
  :mod:`seg_datamodule.io.yolo.image_lists`.
* ``names``: a list, or a dict ``{index: name}`` whose indices are ``0..n-1``; ``nc``, if given,
  must agree; without ``names``, ``nc`` classes called ``class_0``, ``class_1``, ...

Nothing in the file is executed: the YAML is parsed with ``yaml.safe_load`` (plain data, never a
Python object), and ``download:``, which Ultralytics runs with ``exec`` or a shell when a split
is missing, is never read: a missing split is an error naming the path (and saying so).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from seg_datamodule.errors import UserInputError

__all__ = ["DatasetNotFoundError", "DatasetYaml", "DatasetYamlError", "read_dataset_yaml"]

#: A data.yaml larger than this is not a data.yaml (ImageNet's, with 1000 names, is 30 KB).
MAX_YAML_BYTES = 1 << 24

#: Keys of a data.yaml that are not splits.
_NOT_SPLITS = frozenset({"path", "names", "nc", "download", "channels", "kpt_shape", "flip_idx", "yaml_file",
                         "masks_dir", "bg_class_idx", "kpt_names"})


class DatasetYamlError(UserInputError, ValueError):
    """A data.yaml that cannot be read as Ultralytics reads it; the message names the file and the key."""


class DatasetNotFoundError(UserInputError, FileNotFoundError):
    """A data.yaml, or a split's folder or list it names, does not exist; the message names the path."""


@dataclass(frozen=True)
class DatasetYaml:
    """A parsed data.yaml.

    Attributes:
        file (Path): the YAML (absolute).
        roots (tuple[Path, ...]): where the splits' paths are looked for, in order: the dataset
            root its ``path`` names, then the YAML's folder's reading of it (see the module docstring).
        class_names (tuple[str, ...]): the class of each label ``0..C-1``.
        entries (Mapping[str, str | list[str]]): each split's value as written.
    """

    file: Path
    roots: tuple[Path, ...]
    class_names: tuple[str, ...]
    entries: Mapping[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        """The dataset root, as Ultralytics resolves ``path``."""
        return self.roots[0]

    @property
    def splits(self) -> list[str]:
        """The splits the file names (non-empty), in file order."""
        return list(self.entries)

    def sources(self, split: str) -> tuple[Path, ...]:
        """The folders and ``.txt`` lists of ``split``, absolute and resolved as Ultralytics resolves them.

        Raises:
            DatasetYamlError: the file has no (non-empty) ``split``.
            DatasetNotFoundError: a path it names does not exist.
        """
        if split not in self.entries:
            raise DatasetYamlError(
                f"{self.file}: no split {split!r} (splits: {', '.join(self.splits) or 'none'}); name one of them "
                "(the DataModule's train_split / val_split / test_split), or null for none"
            )
        value = self.entries[split]
        missing = []
        for root in self.roots:
            out = []
            for item in value if isinstance(value, list) else [value]:
                path = (root / item).resolve()
                if not path.exists() and isinstance(value, str) and item.startswith("../"):
                    path = (root / item[3:]).resolve()  # Ultralytics' retry
                out.append(path)
            absent = [p for p in out if not p.exists()]
            if not absent:
                return tuple(out)
            missing.append(str(absent[0]))
        raise DatasetNotFoundError(
            f"{self.file}: {split}: {' (nor ' .join(missing)}{')' * (len(missing) - 1)} does not exist (nothing in a "
            "data.yaml is run, its download: script included: fetch the dataset yourself)"
        )


def _class_names(data: Mapping[str, Any], file: Path) -> tuple[str, ...]:
    names, nc = data.get("names"), data.get("nc")
    if nc is not None and (isinstance(nc, bool) or not isinstance(nc, (int, float, str))):
        raise DatasetYamlError(f"{file}: nc must be an integer, got {nc!r}")
    if nc is not None:
        try:
            count = float(nc)
        except ValueError:
            raise DatasetYamlError(f"{file}: nc must be an integer, got {nc!r}") from None
        if count != int(count) or count < 1:
            raise DatasetYamlError(f"{file}: nc must be a positive integer, got {nc!r}")
        nc = int(count)
    if names is None:
        if nc is None:
            raise DatasetYamlError(f"{file}: needs names (a list, or a dict index: name) or nc")
        return tuple(f"class_{i}" for i in range(nc))
    if isinstance(names, list):
        by_index = dict(enumerate(names))
    elif isinstance(names, dict):
        by_index = {}
        for key, name in names.items():
            try:
                index = int(key) if not isinstance(key, (bool, float)) else None
            except ValueError:
                index = None
            if index is None:
                raise DatasetYamlError(f"{file}: names: key {key!r} is not a class index")
            by_index[index] = name
    else:
        raise DatasetYamlError(f"{file}: names must be a list or a dict index: name, got {type(names).__name__}")
    if not by_index:
        raise DatasetYamlError(f"{file}: names is empty; at least one class is needed")
    if sorted(by_index) != list(range(len(by_index))):
        raise DatasetYamlError(f"{file}: names' indices must be 0..{len(by_index) - 1}, got {sorted(by_index)}")
    if nc is not None and nc != len(by_index):
        raise DatasetYamlError(f"{file}: names has {len(by_index)} classes but nc is {nc}")
    return tuple(str(by_index[i]) for i in range(len(by_index)))


def _roots(data: Mapping[str, Any], file: Path) -> tuple[Path, ...]:
    path = data.get("path")
    if path is None or path == "":
        return (file.parent,)
    if not isinstance(path, str):
        raise DatasetYamlError(f"{file}: path must be a folder, got {path!r}")
    given = Path(path).expanduser()
    if given.is_absolute():
        return (given,)
    beside = file.parent / given
    if given.exists() and given.absolute() != beside:  # relative: to the working directory first, as Ultralytics
        return given.absolute(), beside
    return (beside,)


def _entries(data: Mapping[str, Any], file: Path) -> dict[str, Any]:
    entries: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str) or key in _NOT_SPLITS or value is None or value == "" or value == []:
            continue
        if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) and v for v in value)):
            entries["val" if key == "validation" and "val" not in data else key] = value
        elif key in ("train", "val", "test", "validation", "minival"):
            raise DatasetYamlError(
                f"{file}: {key} must be a folder or .txt list of images, or a list of them, got {value!r}"
            )
    return entries


def read_dataset_yaml(file: str | os.PathLike[str]) -> DatasetYaml:
    """Read an Ultralytics data.yaml (see the module docstring); nothing in it is run.

    Args:
        file: the YAML.

    Returns:
        DatasetYaml: its root, classes and splits.

    Raises:
        DatasetNotFoundError: ``file`` does not exist.
        DatasetYamlError: not a YAML mapping, or ``names`` / ``nc`` / ``path`` / a split is not
            what Ultralytics accepts; the message names the file and the key.
    """
    path = Path(file).expanduser().absolute()
    if not path.is_file():
        raise DatasetNotFoundError(f"data.yaml {str(file)!r} does not exist (or is not a file)")
    if path.stat().st_size > MAX_YAML_BYTES:
        raise DatasetYamlError(f"{path}: {path.stat().st_size} bytes is too large for a data.yaml")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8-sig"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise DatasetYamlError(f"{path}: not a YAML file: {err}") from None
    if not isinstance(data, dict):
        raise DatasetYamlError(f"{path}: a data.yaml is a mapping (path, train, val, names), got a "
                               f"{type(data).__name__}")
    return DatasetYaml(file=path, roots=_roots(data, path), class_names=_class_names(data, path),
                       entries=_entries(data, path))
