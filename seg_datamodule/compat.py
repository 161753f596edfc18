"""The private names this package reaches into, the releases they were verified on, and one warning.

``pyproject.toml`` states lower bounds only, so the package installs beside the PyTorch and
Lightning a user already has. What a newer release may break is the few places that reach past
a public API. Each is listed in :data:`REACHES` with the range of releases ``.ci/run`` tests
(the lowest from ``.ci/lowest.txt``, the newest installable) and checked at run time where it is
used; when a check fails, :func:`warn_unverified` warns once per process, naming the installed
release and the verified ones, and the caller falls back to something correct (slower, or with
less detail) instead of silently misbehaving:

* ``torch._C._storage_Use_Count`` -- shared-memory slots handed back (``data/batching/shm.py``);
* Lightning's fetch action name and hook order -- the profiler's phases (``profiling/tap.py``,
  ``profiling/recorder.py``); the Trainer's loop and loader internals
  (``profiling/trainer_internals.py``, ``profiling/callback.py``);
* albumentations' ``set_random_state`` reaching every transform -- per-sample seeding, which
  keeps forked workers off one random stream (``transforms/pixel/albu.py``);
* LitData's loader flags and its dataset's visit plan -- the streamed global order and its checkpoints
  (``io/stream/loader.py``, ``io/stream/ordered.py``, ``io/stream/chunk_cache.py``). Those decide
  which samples a resumed run sees, so an unverified LitData is an error, not a warning
  (:func:`require_version`), and the ``stream`` extra pins the one release.

One more check is about licences, not names: AlbumentationsX (AGPL-3.0) installs under the import
name of albumentations (MIT), so :func:`warn_if_albumentationsx` (called where
``transforms/pixel/albu.py`` imports it) warns once when that is what ``import albumentations`` gives.
"""

from __future__ import annotations

import importlib.metadata
import warnings
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "MIT_ALBUMENTATIONS",
    "REACHES",
    "LicenceWarning",
    "PrivateReach",
    "UnverifiedPrivateAPIWarning",
    "installed_version",
    "require_version",
    "verified_note",
    "warn_if_albumentationsx",
    "warn_unverified",
]


class UnverifiedPrivateAPIWarning(UserWarning):
    """A private name this package relies on is missing or behaves otherwise in this release."""


class LicenceWarning(UserWarning):
    """A dependency installed here is under a licence other than the one this package expects."""


#: The MIT releases of albumentations (PyPI's ``albumentations``: 2.0.8 is its last release;
#: AlbumentationsX, PyPI's ``albumentationsx``, continues the numbering from 2.0.9 under AGPL-3.0).
MIT_ALBUMENTATIONS = "albumentations>=2.0.0,<=2.0.8"


@dataclass(frozen=True)
class PrivateReach:
    """One reach past a public API.

    Args:
        package (str): the distribution that owns the name (``importlib.metadata`` spelling).
        names (str): what is reached for.
        user (str): what in this package relies on it.
        verified (tuple[str, str]): the lowest and newest release of ``package`` it was verified
            on (``.ci/run`` runs the suite on both).
    """

    package: str
    names: str
    user: str
    verified: tuple[str, str]


#: Every reach, by key. The lowest releases match ``.ci/lowest.txt`` (a test checks it).
REACHES: dict[str, PrivateReach] = {
    "storage_use_count": PrivateReach(
        "torch", "torch._C._storage_Use_Count and UntypedStorage._new_shared",
        "DetectionCollate's reused shared-memory slots (buffer_slots)", ("2.4.1", "2.14.1")),
    "fetch_action": PrivateReach(
        "lightning", "the profiler action '[_TrainingEpochLoop].train_dataloader_next' and the hook order",
        "StepTimeProfiler's phases", ("2.6.0", "2.6.6")),
    "loop_internals": PrivateReach(
        "lightning", "fit_loop._combined_loader, _shutdown_workers_and_reset_iterator, "
        "epoch_loop._batches_that_stepped", "StepTimeProfiler's isolated optimiser timing and step labels",
        ("2.6.0", "2.6.6")),
    "loader_iterator": PrivateReach(
        "torch", "torch.utils.data.dataloader._MultiProcessingDataLoaderIter._shutdown_workers",
        "StepTimeProfiler's isolated optimiser timing", ("2.4.1", "2.14.1")),
    "worker_release": PrivateReach(
        "torch", "_MultiProcessingDataLoaderIter's _workers, _workers_status, _workers_done_event, "
        "_mark_worker_as_unavailable, _worker_pids_set and its pin-memory thread",
        "StreamTrainLoader's release of an abandoned epoch's workers (data/loaders/release.py)", ("2.4.1", "2.14.1")),
    "albumentations_seeding": PrivateReach(
        "albumentations", "Compose.set_random_state reaching every transform",
        "AlbumentationsTransform's per-sample seeding (forked workers would share one stream)",
        ("2.0.0", "2.0.8")),
    "litdata_state": PrivateReach(
        "litdata", "StreamingDataLoader.restore, _num_samples_yielded_streaming, _latest_worker_idx, "
        "_StreamingMultiProcessingDataLoaderIter; StreamingDataset's visit plan, read by index in __next__ "
        "(worker_chunks, worker_intervals, _elastic_item_lists, num_chunks, stop_length, has_triggered_download; "
        "ChunkedIndex.chunk_indexes and is_last_index); the chunks' reference counts "
        "(BinaryReader.acquire_shared_locks, _shared_chunk_indexes, ChunksConfig._chunk_lock_filepath and its "
        "'.cnt' file under a '.cnt.lock' FileLock); the item loader's readiness provider "
        "(BaseItemLoader.set_chunk_ready_provider) and its force_download; the prefetch thread's disk-slot gate and "
        "deletes (PrepareChunksThread._slot_budget_enabled and _maybe_delete_chunks, switched per ChunksConfig; "
        "_to_delete_queue, _pre_download_counter, _apply_delete)",
        "StreamTrainLoader's global order (OrderedRecords) and its checkpoints", ("0.2.76", "0.2.76")),
}

_warned: set[str] = set()  # the reaches warned about in this process


def installed_version(package: str) -> str:
    """The installed release of ``package``, or ``"(not installed)"``."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def verified_note(key: str) -> str:
    """``"verified on lightning 2.6.0 to 2.6.6; this is 2.7.0"``, for a message about reach ``key``."""
    reach = REACHES[key]
    low, high = reach.verified
    span = low if low == high else f"{low} to {high}"
    return f"verified on {reach.package} {span}; this is {installed_version(reach.package)}"


def warn_unverified(
    key: str, problem: str, consequence: str, *, warn: Callable[..., object] | None = None, stacklevel: int = 3
) -> bool:
    """Warn, once per process, that reach ``key`` did not hold; whether this call warned.

    Args:
        key (str): a key of :data:`REACHES`.
        problem (str): what was found (``"torch._C has no _storage_Use_Count"``).
        consequence (str): what the caller does instead.
        warn: the function that warns (``rank_zero_warn`` under DDP); ``warnings.warn`` by default.
        stacklevel (int): for ``warnings.warn``: 3 names the caller's caller.

    Raises:
        KeyError: ``key`` is not in :data:`REACHES` (a programming error).
    """
    reach = REACHES[key]
    if key in _warned:
        return False
    _warned.add(key)
    message = f"{reach.user} relies on {reach.names} ({verified_note(key)}): {problem}. {consequence}"
    if warn is None:
        warnings.warn(message, UnverifiedPrivateAPIWarning, stacklevel=stacklevel)
    else:
        warn(message, category=UnverifiedPrivateAPIWarning)
    return True


def require_version(key: str, extra: str) -> None:
    """Raise unless the installed release of reach ``key``'s package is one it was verified on.

    For a reach whose failure would change results rather than only speed or detail.

    Args:
        key (str): a key of :data:`REACHES`.
        extra (str): the extra that installs the supported release (``"stream"``).

    Raises:
        ImportError: another release (or none) is installed; the message names the supported one
            and the command that installs it.
    """
    reach = REACHES[key]
    version = installed_version(reach.package)
    low, high = reach.verified
    if version in (low, high):
        return
    from packaging.version import InvalidVersion, Version

    try:
        inside = Version(low) <= Version(version) <= Version(high)
    except InvalidVersion:
        inside = False
    if not inside:
        supported = low if low == high else f"{low} to {high}"
        raise ImportError(
            f"{reach.user} relies on {reach.names}, verified on {reach.package} {supported} only, and "
            f"{reach.package} {version} is installed: pip install 'seg-datamodule[{extra}]' installs "
            f"{reach.package}=={high}"
        )


def warn_if_albumentationsx() -> bool:
    """Warn, once per process, when ``albumentations`` is AlbumentationsX; whether this call warned.

    AlbumentationsX (PyPI's ``albumentationsx``, AGPL-3.0 or a commercial licence) installs the
    same ``albumentations`` package folder as the MIT-licensed albumentations this package is
    tested with, so nothing at import tells them apart but the installed distribution. The
    warning names its release and licence (from its metadata) and how to get the MIT release
    back (:data:`MIT_ALBUMENTATIONS`).
    """
    try:
        meta = importlib.metadata.metadata("albumentationsx")
    except importlib.metadata.PackageNotFoundError:
        return False
    if "albumentationsx" in _warned:
        return False
    _warned.add("albumentationsx")
    licence = meta.get("License-Expression") or next(
        (line.strip() for line in (meta.get("License") or "").splitlines() if line.strip()), "AGPL-3.0")
    warnings.warn(
        f"albumentations here is AlbumentationsX {meta.get('Version', '(unknown release)')} (the albumentationsx "
        f"distribution, licence: {licence}), not the MIT-licensed albumentations seg-datamodule (Apache-2.0) is "
        "tested with; its AGPL terms may reach what you distribute or serve with it. For the MIT release: "
        f"pip uninstall -y albumentationsx && pip install --force-reinstall '{MIT_ALBUMENTATIONS}'",
        LicenceWarning, stacklevel=2)
    return True
