"""A split's images, listed as Ultralytics lists them, and the label file of each.

A split's sources (:meth:`~seg_datamodule.io.yolo.data_yaml.DatasetYaml.sources`) are:

* a folder: every file below it whose extension is one of :data:`IMG_FORMATS` (Ultralytics'
  list, any case), as Ultralytics' ``glob("**/*.*")`` finds them: names starting with ``.`` are
  not listed; unlike glob, a symlinked folder inside is not entered (a link loop cannot hang the
  walk; symlinked files are listed);
* a ``.txt`` list: one image path per line (UTF-8, a byte-order mark allowed), relative to the
  list's folder. Ultralytics resolves ``./x.jpg`` so and other relative lines against the working
  directory; a list a tool writes means its own folder, which is what is read here. A line is
  checked as a COCO ``file_name`` is (:func:`~seg_datamodule.io.paths.file_name_problem`): an
  absolute path, or one leaving the list's folder through ``..``, is a bad line, named by file
  and line (``image_unsafe_file_name``).

Images are in Ultralytics' order (sorted by path); a file listed twice is kept once and counted
(``image_listed_twice``), files of other extensions are counted as ``files_ignored``. Paths are
relative to the deepest folder holding every source (the index's image root). Labels follow
Ultralytics' rule (:func:`label_path`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple, Sequence

from seg_datamodule.io.paths import file_name_problem

__all__ = ["IMG_FORMATS", "ListProblem", "SplitImages", "label_path", "label_paths", "list_split_images"]

#: The image extensions Ultralytics lists (``ultralytics.data.utils.IMG_FORMATS``); one OpenCV
#: cannot decode (HEIC) is listed too, and then fails as a bad image.
IMG_FORMATS: frozenset[str] = frozenset({
    "avif", "bmp", "dng", "heic", "heif", "jp2", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp", "pfm",
})


class ListProblem(NamedTuple):
    """A bad line of a ``.txt`` list: the list, the line (1-based), a skip reason, the message."""

    source: str
    line: int
    reason: str
    message: str


class SplitImages(NamedTuple):
    """What a split lists.

    Attributes:
        root (Path): the folder every image is below.
        file_names (list[str]): each image's path relative to ``root`` (POSIX), in Ultralytics'
            order.
        problems (list[ListProblem]): bad lines of the ``.txt`` lists, in list and line order.
        counts (dict[str, int]): ``files_ignored``, ``image_listed_twice``.
        lists (tuple[Path, ...]): the ``.txt`` lists read.
        inodes (list[int]): each image's inode as its folder's listing gave it (no stat), -1
            for an image a ``.txt`` list named.
        folders (tuple[str, ...]): every folder the walk listed (absolute), sorted.
    """

    root: Path
    file_names: list[str]
    problems: list[ListProblem]
    counts: dict[str, int]
    lists: tuple[Path, ...]
    inodes: list[int] = []
    folders: tuple[str, ...] = ()


def label_path(image_path: str) -> str:
    """Ultralytics' label file of an image: the last ``/images/`` becomes ``/labels/``, the extension ``.txt``.

    Args:
        image_path (str): the image's path (``os.sep`` separators), e.g.
            ``/data/coco/images/train2017/000000000009.jpg``.

    Returns:
        e.g. ``/data/coco/labels/train2017/000000000009.txt``; an image outside any ``images``
        folder has its label file beside it.
    """
    images, labels = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    return labels.join(image_path.rsplit(images, 1)).rsplit(".", 1)[0] + ".txt"


def label_paths(image_paths: list[str]) -> list[str]:
    """:func:`label_path` of every image, the folder part worked out once per folder.

    Args:
        image_paths (list[str]): image paths (``os.sep`` separators).

    Returns:
        the label file of each, equal to ``[label_path(p) for p in image_paths]``.
    """
    images, labels = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    folders: dict[str, str] = {}
    out = []
    for path in image_paths:
        folder, _, name = path.rpartition(os.sep)
        prefix = folders.get(folder)
        if prefix is None:
            # The last /images/ of a path lies in its folder part (a name holds no separator).
            prefix = folders[folder] = labels.join((folder + os.sep).rsplit(images, 1))
        out.append(prefix + name.rpartition(".")[0] + ".txt" if "." in name else label_path(path))
    return out


def _is_image(name: str) -> bool:
    return name.rpartition(".")[2].lower() in IMG_FORMATS and "." in name


def _walk(folder: Path, walked: list[str]) -> tuple[dict[str, int], int]:
    """Image files below ``folder`` (absolute paths, with the inode the listing gives) and the number of other files.

    Every folder listed is appended to ``walked``.

    One ``scandir`` per folder (what ``os.walk`` does, without building its lists); a symlinked
    folder is not entered, as with ``os.walk``.
    """
    found: dict[str, int] = {}
    ignored = 0
    pending = [str(folder)]
    while pending:
        parent = pending.pop()
        try:
            entries = list(os.scandir(parent))
        except OSError:
            continue  # as os.walk: an unreadable folder lists nothing
        walked.append(parent)
        prefix = os.path.join(parent, "")
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                if not entry.is_symlink():
                    pending.append(prefix + name)
            elif _is_image(name):
                found[prefix + name] = entry.inode()
            else:
                ignored += 1
    return found, ignored


def _read_list(path: Path, problems: list[ListProblem]) -> tuple[list[str], int]:
    """Image paths a ``.txt`` list names (absolute), bad lines added to ``problems``, other files counted."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        problems.append(ListProblem(str(path), 0, "image_list_unreadable", f"{path}: cannot be read as a UTF-8 "
                                    f"list of image paths ({err})"))
        return [], 0
    found, ignored = [], 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        problem = file_name_problem(line)
        if problem is not None:
            problems.append(ListProblem(str(path), number, "image_unsafe_file_name",
                                        f"{path}:{number}: image path {line!r} {problem} (paths in a list are "
                                        "relative to its folder)"))
        elif _is_image(line):
            found.append(os.path.normpath(os.path.join(path.parent, line)))
        else:
            ignored += 1
    return found, ignored


def list_split_images(sources: Sequence[Path]) -> SplitImages:
    """Every image of a split's sources (see the module docstring).

    Args:
        sources (Sequence[Path]): absolute folders and ``.txt`` lists (existing).

    Returns:
        SplitImages.
    """
    problems: list[ListProblem] = []
    paths: list[str] = []
    inodes: dict[str, int] = {}
    ignored = 0
    roots, lists, folders = [], [], []
    for source in sources:
        if source.is_dir():
            walked, other = _walk(source, folders)
            inodes.update(walked)
            found = list(walked)
            roots.append(str(source))
        else:
            found, other = _read_list(source, problems)
            roots.append(str(source.parent))
            lists.append(source)
        paths += found
        ignored += other
    unique = sorted(set(paths))
    root = Path(os.path.commonpath(roots)) if roots else Path("/")
    # Every path is normalised and below the root: cutting its prefix is its relative path.
    cut = len(os.path.join(str(root), ""))
    names = [p[cut:] for p in unique] if os.sep == "/" else [p[cut:].replace(os.sep, "/") for p in unique]
    return SplitImages(root, names, problems, {"files_ignored": ignored, "image_listed_twice": len(paths) - len(unique)},
                       tuple(lists), [inodes.get(p, -1) for p in unique], tuple(sorted(set(folders))))
