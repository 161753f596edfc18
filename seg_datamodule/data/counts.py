"""Where annotations go: counters by reason, and the report that says it.

* :class:`SkipCounter`: shared between DataLoader workers and the main process; both the
  dataset's augmentation drops (``outside``, ``clipped``, ...) and images found bad by a worker
  (``image_missing``, ...) are counted there, so every annotation is either in a batch or in a
  counter with its reason;
* :class:`ConsumedCounts`: the counts of the evaluation batches a loop really consumed (workers
  build batches ahead that nobody evaluates), per split, for the last run of each;
* :class:`DeliveredCounts`: the counts of the training batches the Trainer consumed (it fetches
  ahead), saved per rank in checkpoints (:func:`gather_per_rank`) and continued on resume;
* :func:`format_report`: one line per source, what augmentation cropped out apart from what was
  lost (bad files, bad annotations, degenerate shapes), worded for the recipe.
"""

from __future__ import annotations

import collections
import ctypes
import multiprocessing
import multiprocessing.context
from typing import Any, Hashable, Sequence

import torch

from seg_datamodule.io.coco.errors import format_skip_summary
from seg_datamodule.io.images.decode import IMAGE_ERROR_REASONS, BadImageError
from seg_datamodule.structures import DetectionBatch

__all__ = ["AUGMENT_REASONS", "ConsumedCounts", "DeliveredCounts", "LOSS_REASONS", "SkipCounter", "batch_counts", "format_report",
           "gather_per_rank"]

#: Annotation counts that are the augmentation at work (the instance left the crop, or kept too
#: little of itself, or was covered by a paste), not data lost.
AUGMENT_REASONS: tuple[str, ...] = ("outside", "clipped", "small_box", "occluded")
#: Annotation counts that are data lost: shapes without area, annotations of images that failed.
LOSS_REASONS: tuple[str, ...] = ("degenerate", "bad_image")
_CROP_WORDS = {"outside": "outside the canvas", "clipped": "clipped below min_area_ratio",
               "small_box": "box under min_box_size", "occluded": "occluded by a paste"}


class SkipCounter:
    """Counts of samples skipped by reason, shared between DataLoader workers and the main process.

    Create it in the main process *before* the DataLoader starts its workers (e.g. in the
    dataset's ``__init__``); workers call :meth:`add` (or :meth:`add_error`) and the main process
    reads :meth:`counts`. The counts live in a ``multiprocessing.Array`` of int64 with a lock:
    forked workers inherit it, and spawn / forkserver workers receive it while the DataLoader
    starts them (the only time ``multiprocessing`` lets a shared array be pickled).

    Pickled at any other time (``copy.deepcopy``, saving to disk) it becomes a detached snapshot:
    a new counter holding the same counts, no longer shared.

    Args:
        reasons: the reasons it can count; defaults to the image reasons a worker can meet
            (``image_missing``, ``image_unreadable``, ``image_truncated``, ``image_corrupt``,
            ``image_size_mismatch``).
        context: the multiprocessing context the workers are started with (``None``: the
            default one; pass the DataLoader's ``multiprocessing_context`` when it differs).

    Raises:
        ValueError: ``reasons`` is empty or has duplicates.
    """

    def __init__(
        self,
        reasons: Sequence[str] = IMAGE_ERROR_REASONS,
        *,
        context: multiprocessing.context.BaseContext | None = None,
    ) -> None:
        reasons = tuple(reasons)
        if not reasons or len(set(reasons)) != len(reasons) or not all(isinstance(r, str) for r in reasons):
            raise ValueError(f"reasons must be distinct strings, at least one, got {reasons!r}")
        self._reasons = reasons
        self._slot = {r: k for k, r in enumerate(reasons)}
        self._array = (context or multiprocessing.get_context()).Array(ctypes.c_int64, len(reasons))

    @property
    def reasons(self) -> tuple[str, ...]:
        """The reasons this counter has a slot for."""
        return self._reasons

    def add(self, reason: str, count: int = 1) -> None:
        """Add ``count`` to ``reason`` (atomic across processes).

        Raises:
            ValueError: ``reason`` is not one of :attr:`reasons`.
        """
        slot = self._slot.get(reason)
        if slot is None:
            raise ValueError(f"unknown skip reason {reason!r}; this counter counts {self._reasons}")
        with self._array.get_lock():
            self._array[slot] += int(count)

    def add_error(self, error: BadImageError) -> None:
        """Count a :class:`BadImageError` under its reason (``image_corrupt`` when it has none)."""
        reason = error.reason if error.reason in self._slot else "image_corrupt"
        self.add(reason)

    def counts(self) -> dict[str, int]:
        """Reason -> count, reasons with a zero count left out."""
        with self._array.get_lock():
            values = list(self._array)
        return {r: int(v) for r, v in zip(self._reasons, values) if v}

    def total(self) -> int:
        """Sum of all counts."""
        return sum(self.counts().values())

    def reset(self) -> None:
        """Set every count to zero."""
        with self._array.get_lock():
            for k in range(len(self._reasons)):
                self._array[k] = 0

    def summary(self) -> str:
        """:func:`format_skip_summary` of :meth:`counts`."""
        return format_skip_summary(self.counts())

    def __getstate__(self) -> dict[str, Any]:
        if multiprocessing.context.get_spawning_popen() is not None:
            return {"reasons": self._reasons, "array": self._array}
        return {"reasons": self._reasons, "snapshot": [int(v) for v in self._array]}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._reasons = tuple(state["reasons"])
        self._slot = {r: k for k, r in enumerate(self._reasons)}
        if "array" in state:
            self._array = state["array"]
        else:
            self._array = multiprocessing.get_context().Array(ctypes.c_int64, len(self._reasons))
            self._array[:] = state["snapshot"]

    def __repr__(self) -> str:
        return f"SkipCounter({self.counts()})"


class ConsumedCounts:
    """The counts of the evaluation batches a loop consumed, per split (``val``, ``test``).

    Fed one batch at a time as the loader hands it out (:class:`~seg_datamodule.data.loaders.resume.CountingLoader`),
    so batches that workers built ahead but nobody took are not counted, for any ``num_workers``,
    whether Lightning's loop or a user's ``for`` loop takes them. A new ``run`` key (another pass:
    the sanity check, each epoch's validation) starts the split's counts afresh: a report says what
    one pass over the split delivered.
    """

    def __init__(self) -> None:
        self._runs: dict[str, tuple[Hashable, collections.Counter[str]]] = {}

    def start(self, split: str, run: Hashable) -> None:
        """Begin evaluation run ``run`` of ``split`` with nothing counted (a pass that yields no batch too)."""
        self._runs[split] = (run, collections.Counter())

    def add(self, split: str, run: Hashable, counts: dict[str, int]) -> None:
        """Count a consumed batch's ``counts`` for ``split``, in evaluation run ``run``."""
        current = self._runs.get(split)
        if current is None or current[0] != run:
            current = self._runs[split] = (run, collections.Counter())
        current[1].update(counts)

    def counts(self, split: str) -> dict[str, int]:
        """The last run's counts of ``split`` (empty before any)."""
        current = self._runs.get(split)
        return {} if current is None else {k: int(v) for k, v in current[1].items()}

    def reset(self, split: str) -> None:
        """Forget ``split``'s counts (a new ``trainer.validate`` / ``test`` call)."""
        self._runs.pop(split, None)


class DeliveredCounts:
    """The annotation and decode counts of the batches training consumed, for both train loaders.

    A loader :meth:`add` s every batch it hands out with its epoch and 0-based position in it;
    :meth:`consumed` subtracts the ones handed out but not trained on (Lightning fetches ahead).
    :meth:`state` is every rank's consumed counts in rank order (:func:`gather_per_rank`; a
    checkpoint is written by rank 0 alone) and :meth:`load` takes this rank's back: the one
    delivered-counts logic of :class:`~seg_datamodule.data.loaders.resume.ResumableDataLoader` and
    :class:`~seg_datamodule.data.loaders.streaming.StreamTrainLoader`.
    """

    def __init__(self, start: dict[str, int] | None = None) -> None:
        # ``start``: what a previous loader of the same run delivered (a reloaded train loader).
        self.total: collections.Counter[str] = collections.Counter(start or {})
        self._recent: collections.deque[tuple[int, int, dict[str, int]]] = collections.deque(maxlen=64)

    def add(self, epoch: int, position: int, counts: dict[str, int]) -> None:
        """Count one batch handed out: ``position`` is its 0-based place in ``epoch``."""
        self.total.update(counts)
        self._recent.append((epoch, position, dict(counts)))

    def consumed(self, epoch: int, batches: int) -> dict[str, int]:
        """Counts of what was trained on when ``batches`` batches of ``epoch`` were consumed."""
        out = collections.Counter(self.total)
        for batch_epoch, position, counts in self._recent:
            if batch_epoch == epoch and position >= batches:  # handed out, not trained on
                out.subtract(counts)
        return {k: int(v) for k, v in out.items() if v}

    def state(self, epoch: int, batches: int) -> list[dict[str, int]]:
        """Every rank's :meth:`consumed` counts, in rank order (a collective under DDP)."""
        return gather_per_rank(self.consumed(epoch, batches))

    def load(self, per_rank: list[dict[str, int]] | dict[str, int], rank: int,
             world_size: int | None = None) -> None:
        """Continue from a saved :meth:`state` (a single dict: a state of one process).

        Args:
            per_rank: the saved counts of each rank of the saving run.
            rank (int): this process's rank.
            world_size (int | None): this run's ranks; where it differs from the saving run's (an
                elastic resume of a stream), rank ``r`` takes the counts of the saved ranks
                ``i`` with ``i % world_size == r``, so the ranks' counts still sum to the run's.
                None: the saving run's.

        Raises:
            ValueError: ``rank`` is not one of ``world_size`` ranks, or (``world_size`` None) not
                one of the saved ranks.
        """
        if isinstance(per_rank, dict):
            per_rank = [per_rank]
        world = len(per_rank) if world_size is None else world_size
        if not 0 <= rank < world:
            raise ValueError(f"the checkpoint holds counts of {len(per_rank)} ranks, this is rank {rank} of {world}")
        self.total = collections.Counter()
        for counts in per_rank[rank::world]:
            self.total.update(counts)
        self._recent.clear()


def batch_counts(batch: Any) -> dict[str, int]:
    """A batch's delivered counts: ``DetectionBatch.counts``; none for any other batch type."""
    return dict(batch.counts or {}) if isinstance(batch, DetectionBatch) else {}


def gather_per_rank(counts: dict[str, int]) -> list[dict[str, int]]:
    """Every rank's counts, in rank order (a checkpoint is written by rank 0 alone).

    Lightning builds the checkpoint dict on every rank, so the collective is matched.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [counts]
    if torch.distributed.get_world_size() == 1:
        return [counts]
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, counts)
    return gathered


def format_report(skip_counts: dict[str, dict[str, int]], decodes: dict[str, Any] | None = None,
                  recipe: str = "mosaic") -> str:
    """Where every annotation went, one line per source, and the training decodes per image.

    A dataset's line (a source with a ``kept`` count) separates what augmentation cropped out
    (:data:`AUGMENT_REASONS`: the augmentation working, not data lost) from what was lost
    (:data:`LOSS_REASONS` and bad images), each worded for what it is.

    Args:
        skip_counts: source (``train_index``, ``train``, ...) -> reason -> count.
        decodes: ``samples``, ``decodes``, ``reduced_decodes`` and a ``setting`` to name, or None.
        recipe (str): the training recipe (``"mosaic"`` or ``"lsj"``), for the crop's name.

    Returns:
        the lines, joined.
    """
    crop = {"lsj": "the LSJ crop", "mosaic": "the mosaic / affine crop"}.get(recipe, "augmentation")
    lines = []
    for name, counts in skip_counts.items():
        counts = dict(counts)
        kept = counts.pop("kept", None)
        if kept is None:  # an index: crowd regions made instances are converted, not lost
            converted = counts.pop("crowd_as_instances", 0)
            turned = f"{converted} crowd regions converted to instances (crowd_as_instances); " if converted else ""
            lines.append(f"{name}: {turned}{format_skip_summary(counts)}")
            continue
        # Targets copy-paste and MixUp added: part of ``kept``, not a reason anything was lost.
        added = ", ".join(f"{n} {key.replace('_', ' ')}" for key in ("pasted", "mixed_in") if (n := counts.pop(key, 0)))
        cropped = {key: counts.pop(key, 0) for key in AUGMENT_REASONS}
        summary = f"{kept} annotations delivered as targets{f' ({added})' if added else ''}"
        if sum(cropped.values()):
            what = ", ".join(f"{_CROP_WORDS[k]} {n}" for k, n in cropped.items() if n)
            where = crop if name == "train" else "letterboxing"
            summary += f"; cropped out by {where}: {sum(cropped.values())} ({what})"
        lines.append(f"{name}: {summary}; {format_skip_summary(counts).replace('skipped', 'lost', 1)}")
    if decodes and decodes.get("samples"):
        lines.append(
            f"train decodes: {decodes['decodes'] / decodes['samples']:.2f} per output image "
            f"({decodes['decodes']} decodes for {decodes['samples']} images, {decodes['reduced_decodes']} "
            f"at reduced JPEG scale; {decodes['setting']})"
        )
    return "\n".join(lines)
