"""Shared fixtures: the real coco-mini subset (or, where it is absent, its ten images that ship
with the tests), a fixed seed per test, a cache folder of the session's own, and the hypothesis
profile every property test runs under."""

from __future__ import annotations

import collections
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path

# Under pytest-xdist (the default: pyproject's addopts), two test processes share the two cores:
# one compute thread each, or OpenMP's threads of both spin against each other (torch tests ran
# 5-20x slower). Set before torch is imported; the runs the tests start inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings

# albumentations asks PyPI for a newer release at import (and warns, an error here, on any older
# one): tests make no network calls beyond 127.0.0.1. Set before any test module imports it;
# subprocesses the tests start inherit it.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

# Tests live in folders that mirror the package; their shared helpers (_reference, _recorder) here.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _optional import NEEDS_COUNTS, missing, skip_reason  # noqa: E402

# No deadline and no too-slow health check: both measure wall time per example, and on a loaded
# machine (the suite must pass beside two CPU-bound processes) an example that takes 2 ms alone
# takes 200 ms now and then. Each @settings in the tests inherits this profile and adds only its
# own max_examples (and health checks).
settings.register_profile("seg_datamodule", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("seg_datamodule")

# ../shared/data/coco-mini beside the project checkout; COCO_MINI overrides it.
COCO_MINI = Path(
    os.environ.get("COCO_MINI", Path(__file__).resolve().parents[1].parent / "shared/data/coco-mini")
)
#: Ten CC BY 2.0 images of coco-mini with their annotations, in the repository (see its README).
COCO_CC_BY = Path(__file__).resolve().parent / "fixtures" / "coco-cc-by"


#: Copies of each CC BY image in the tiled stand-in: 16 x 5 = 80 images a split, as coco-mini has.
TILED_COPIES = 16


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``coco_mini`` every test that reads real COCO data, and run the heaviest files first.

    The mark lets CI run, with ``../shared`` present, the default tier's tests whose data differ
    from a fresh clone's (``-m "extended or coco_mini"``). The order: pytest-xdist hands whole
    files to its two processes (``--dist loadfile``) in collection order, so the files with the
    most slow tests (``tests/test_readme.py``'s runs, the resume runs) go first, and the light
    ones fill in beside them; alone, a long file collected last would run last, by itself.
    """
    for item in items:
        if "coco_mini" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.coco_mini)
    config.stash[NEEDS_COUNTS] = _count_needs(items)
    slow = collections.Counter(_file(item) for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[_file(item)])  # stable: the order within a file is kept


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def _needs(item: pytest.Item, partly: bool = True) -> list[str]:
    """The parts ``item`` needs (with ``partly``: also those it calls ``require`` for itself)."""
    return [name for mark in item.iter_markers("needs") if partly or not mark.kwargs.get("partly")
            for name in mark.args]


def _count_needs(items: list[pytest.Item]) -> dict[str, int]:
    """How many tests of the default tier need each optional part (before ``-m`` deselects), and
    ``"<whole>"``: 1 when every test file was collected (a run of some files counts only theirs)."""
    tests = Path(__file__).resolve().parent
    on_disk = {str(p.relative_to(tests.parent)) for p in tests.rglob("test_*.py")}
    collected = {_file(item) for item in items}
    counts = collections.Counter(name for item in items if not item.get_closest_marker("extended")
                                 for name in set(_needs(item)))
    return {**counts, "<whole>": int(collected == on_disk)}


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a test whose ``needs`` parts are absent here, saying which (``tests/_optional.py``)."""
    absent = missing(_needs(item, partly=False))
    if absent:
        pytest.skip("; ".join(skip_reason(name) for name in absent))


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``$SEG_DATAMODULE_CACHE`` in the session's own folder, for the tests and what they start.

    The default (``~/.cache/seg_datamodule``) is shared by every checkout and run on the machine:
    an index cached by another checkout's code, or a run in parallel, would reach these tests.
    A test that needs its own cache passes ``cache_dir`` or sets the variable itself.
    """
    cache = tmp_path_factory.mktemp("seg-datamodule-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEG_DATAMODULE_CACHE", str(cache))
        yield cache


@pytest.fixture(autouse=True)
def _seed_everything() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _fresh_unverified_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """compat.warn_unverified warns once per process: each test starts with none warned."""
    from seg_datamodule import compat

    monkeypatch.setattr(compat, "_warned", set())


@pytest.fixture(scope="session")
def coco_mini(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Root of real COCO data (annotations/, train2017/, val2017/): coco-mini, or where it is absent
    (a fresh clone) :data:`COCO_CC_BY`'s ten real images tiled to coco-mini's size
    (:func:`_datasets.tile_coco_root`), so every test has as many images as it has in CI. Tests
    read counts from the files, never coco-mini's own numbers."""
    if (COCO_MINI / "annotations" / "instances_train2017.json").is_file():
        return COCO_MINI
    from _datasets import tile_coco_root

    return tile_coco_root(COCO_CC_BY, tmp_path_factory.mktemp("coco-cc-by-tiled"), copies=TILED_COPIES)



@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded demo dataset, generated once per test session."""
    from seg_datamodule.demo.data import ensure_demo_dataset

    root = tmp_path_factory.mktemp("demo") / "demo-v3"
    ensure_demo_dataset(root)
    return root
