"""The optional parts some tests need, in one place: what each is, how to get it, whether it is here.

The README's install (``pip install -e ".[dev]"``) gives every test but these its parts. A test that
needs one carries ``@pytest.mark.needs("ultralytics")`` (or a module's ``pytestmark``); where the
part is absent, ``tests/conftest.py`` skips it with :func:`skip_reason` (which part, and how to
install it), so a fresh clone's run skips them saying which instead of failing. A test whose
checks mostly run without the part carries ``needs(..., partly=True)`` and calls :func:`require`
where the part comes in (the checks before it have run). Test modules import the parts inside
their tests, so every test is collected, and counted, with or without them.

The docs' blocks and the shipped configs say it where a reader sees it: a block carries
``<!-- readme-test: needs ultralytics -->`` just before its fence, a config names the extra in
its header (``pip install "seg-datamodule[ultralytics]"``); ``tests/_readme.py`` reads both.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from dataclasses import dataclass

import pytest

__all__ = ["NEEDS_COUNTS", "PARTS", "Part", "chromium", "missing", "require", "skip_reason"]

#: Where ``tests/conftest.py`` leaves, at collection, how many default-tier tests need each part
#: (``config.stash[NEEDS_COUNTS]``; ``"<whole>"``: 1 when every test file was collected).
NEEDS_COUNTS = pytest.StashKey[dict]()


def _module(name: str) -> Callable[[], bool]:
    return lambda: importlib.util.find_spec(name) is not None


def chromium() -> str | None:
    """The Chromium here (Debian names it ``chromium``, Ubuntu's snap ``chromium-browser``), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@dataclass(frozen=True)
class Part:
    """One optional part.

    Attributes:
        name: the key the marks use (``needs("ultralytics")``).
        what: what it is, for the skip line and the README.
        install: how to get it.
        present: whether it is here.
    """

    name: str
    what: str
    install: str
    present: Callable[[], bool]


#: Every optional part a test may need. The README's test paragraph states how many tests need each.
PARTS: dict[str, Part] = {part.name: part for part in (
    Part("ultralytics", "the Ultralytics extra (AGPL-3.0)",
         'the three commands of docs/guides/models.md, `.venv/bin/pip install -e ".[ultralytics]"` first',
         _module("ultralytics")),
    Part("lvis", "the official LVIS API", '`.venv/bin/pip install --no-deps "lvis==0.5.3"`', _module("lvis")),
    Part("chromium", "a headless Chromium", "Debian: `apt install chromium`",
         lambda: chromium() is not None),
    Part("cuda", "a CUDA device", "a machine with an NVIDIA GPU and CUDA wheels of torch", _cuda),
)}


def skip_reason(name: str) -> str:
    """The line a test that needs ``name`` is skipped with where it is absent."""
    part = PARTS[name]
    return f"needs {part.what} [{name}]: {part.install}"


def missing(names: tuple[str, ...] | list[str]) -> list[str]:
    """The parts of ``names`` that are absent here, in order.

    Raises:
        KeyError: a name that is not in :data:`PARTS` (a typo in a mark, a block or a config).
    """
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        raise KeyError(f"unknown optional part(s) {unknown}; tests/_optional.py knows {sorted(PARTS)}")
    return [n for n in names if not PARTS[n].present()]


def require(name: str) -> None:
    """Skip the calling module (at import) or test where ``name`` is absent, saying which part."""
    if missing([name]):
        pytest.skip(skip_reason(name), allow_module_level=True)
