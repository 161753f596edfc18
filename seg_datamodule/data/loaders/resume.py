"""A DataLoader that Lightning checkpoints and resumes mid-epoch, with exactly the batches left.

Every sample is a pure function of ``(seed, epoch, batch)``, so resuming needs no replay: the
state is the epoch, how many batches of it training consumed, a fingerprint of what the batches
are built from, and the annotation counts of the consumed batches. Lightning saves the state of
a train loader that has ``state_dict`` / ``load_state_dict`` in every checkpoint and restores it
before the loader's first ``iter()`` (``FitLoop.setup_data``); the sampler then starts the epoch
at the first batch not yet trained on, in O(1): no skipped batch is decoded or augmented.

"Consumed" is what the Trainer says it trained on (``batch_progress.current.processed``), not
what this loader handed out: Lightning fetches a batch ahead, so at a checkpoint one more batch
has usually left the loader than was trained on.

With repeat-factor sampling an epoch's length is the epoch's own (``epoch_batches`` in the state
is that of the epoch saved), and the state also names the repeat factors it was drawn with. An
epoch the Trainer cuts short (``limit_train_batches``) ends at its limit: ``epoch_batches`` is
what the Trainer takes (``epoch_length``), so a checkpoint at the cut resumes at the next epoch,
and the counts of a resumed run continue the uninterrupted run's exactly (issue 35).
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any, Callable, Iterator, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader

from seg_datamodule.data.counts import ConsumedCounts, DeliveredCounts, batch_counts
from seg_datamodule.data.loaders.sampler import EpochShardSampler
from seg_datamodule.ops.checks import check_choice

__all__ = ["CountingLoader", "ResumableDataLoader", "current_rank", "dataset_fingerprint"]

_VERSION = 1


def dataset_fingerprint(dataset: Any) -> str:
    """A short hash of what a dataset's batches are built from: its length and image ids."""
    index = getattr(dataset, "index", None)
    ids = np.asarray(getattr(index, "image_ids", np.arange(len(dataset))), np.int64)
    digest = hashlib.sha256(np.int64(len(dataset)).tobytes() + ids.tobytes()).hexdigest()
    return digest[:16]


def current_rank() -> int:
    """This process's global rank (0 outside ``torch.distributed``)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_rank())
    return 0


class ResumableDataLoader(DataLoader):
    """``DataLoader`` over an :class:`EpochShardSampler` with ``state_dict`` / ``load_state_dict``.

    Args:
        *args, **kwargs: as for ``DataLoader``; ``sampler`` must be an ``EpochShardSampler``.
        progress: returns how many batches of the current epoch training consumed (the
            DataModule passes the Trainer's count); ``None`` counts the batches this loader
            handed out, right for a loop that fetches nothing ahead.
        on_mismatch: what to do with a state saved for another dataset, batch size or world
            size: ``"raise"`` (default) or ``"restart"`` the epoch with a warning.
        counts: where delivered counts go (a reloaded loader continues its predecessor's);
            None: from zero.
        epoch_length: returns how many batches of an epoch training takes (the DataModule passes
            the Trainer's ``num_training_batches``, ``limit_train_batches`` applied); ``None``:
            the whole epoch.

    Raises:
        TypeError: ``sampler`` is not an ``EpochShardSampler``.
    """

    def __init__(
        self,
        *args: Any,
        progress: Callable[[], int] | None = None,
        on_mismatch: Literal["raise", "restart"] = "raise",
        counts: DeliveredCounts | None = None,
        epoch_length: Callable[[], int] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.sampler, EpochShardSampler):
            raise TypeError(f"sampler must be an EpochShardSampler, got {type(self.sampler).__name__}")
        self.progress, self.epoch_length = progress, epoch_length
        self.on_mismatch = check_choice("on_mismatch", on_mismatch, ("raise", "restart"))
        self._handed_out = 0
        self.counts = DeliveredCounts() if counts is None else counts
        self._resume: tuple[int, int] | None = None
        self._started_at: tuple[int, int] = (0, 0)
        self._started = False

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Any]:
        sampler: EpochShardSampler = self.sampler  # type: ignore[assignment]
        self._started = True
        if self._resume is not None:
            # Lightning creates the iterator before it sets the epoch: take both from the state.
            epoch, start = self._resume
            self._resume = None
            sampler.set_epoch(epoch)
            sampler.start_at(epoch, start * self.batch_size)
            self._started_at = (epoch, start)
        else:
            self._started_at = (int(sampler.epoch), 0)
        self._handed_out = self._started_at[1]
        return self._counting(super().__iter__())

    def _counting(self, batches: Iterator[Any]) -> Iterator[Any]:
        # Read at the first batch: Lightning sets the epoch after creating the iterator. An epoch
        # other than the one resumed starts at its first batch (the sampler ignores the start too).
        epoch = int(self.sampler.epoch)  # type: ignore[attr-defined]
        if epoch != self._started_at[0]:
            self._handed_out = 0
        # Lightning fetches one batch past a cut epoch's last (limit_train_batches): never trained on.
        taken = None if self.epoch_length is None else int(self.epoch_length())
        for batch in batches:
            if taken is None or self._handed_out < taken:
                self.counts.add(epoch, self._handed_out, batch_counts(batch))
            self._handed_out += 1
            yield batch

    @property
    def delivered_counts(self) -> dict[str, int]:
        """Annotation and decode counts of the batches training consumed (see ``DetectionBatch.counts``)."""
        return self.counts.consumed(int(self.sampler.epoch), self._consumed())  # type: ignore[attr-defined]

    def _consumed(self) -> int:
        return int(self.progress()) if self.progress is not None else self._handed_out

    # ------------------------------------------------------------------ state

    def _identity(self) -> dict[str, Any]:
        sampler: EpochShardSampler = self.sampler  # type: ignore[assignment]
        return {
            "dataset": dataset_fingerprint(self.dataset),
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "world_size": sampler.num_replicas,
            "seed": sampler.seed,
            "shuffle": sampler.shuffle,
            # Added with repeat-factor sampling; None (off) matches states saved before it.
            "repeat_factors": None if sampler.repeat_factors is None else hashlib.sha256(
                sampler.repeat_factors.tobytes()).hexdigest()[:16],
        }

    def state_dict(self) -> dict[str, Any]:
        """Epoch, consumed batches, the loader's identity and the consumed batches' counts."""
        sampler: EpochShardSampler = self.sampler  # type: ignore[assignment]
        return {
            "version": _VERSION,
            "epoch": int(sampler.epoch),
            "batches": self._consumed(),
            "epoch_batches": len(self) if self.epoch_length is None else min(len(self), int(self.epoch_length())),
            **self._identity(),
            "counts": self.counts.state(int(sampler.epoch), self._consumed()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume where ``state`` left off; the next ``iter()`` starts at the first batch not trained on.

        Raises:
            ValueError: ``state`` is from another dataset, batch size, world size, seed or shuffle
                setting (with ``on_mismatch="raise"``), or not from this loader at all.
        """
        if not isinstance(state, dict) or state.get("version") != _VERSION:
            raise ValueError(f"not a ResumableDataLoader state (version {_VERSION}): {state!r:.200}")
        mine, theirs = self._identity(), {k: state.get(k) for k in self._identity()}
        if mine != theirs:
            diff = ", ".join(f"{k} {theirs[k]!r} in the checkpoint, {mine[k]!r} now"
                             for k in mine if mine[k] != theirs[k])
            message = f"the checkpoint's train loader state does not match this loader: {diff}"
            if self.on_mismatch == "raise":
                raise ValueError(message + " (on_resume_mismatch='restart' restarts the epoch instead)")
            warnings.warn(message + "; restarting the epoch from its first batch", stacklevel=2)
            return
        epoch, batches = int(state["epoch"]), int(state["batches"])
        if batches >= int(state["epoch_batches"]):  # saved at the end of an epoch
            epoch, batches = epoch + 1, 0
        if self._started and self._resume != (epoch, batches):
            warnings.warn(
                f"the train loader state (epoch {epoch}, batch {batches}) arrived after its iterator "
                "started: the iterator already running is not moved; the next one starts there",
                stacklevel=2,
            )
        self._resume = (epoch, batches)
        # With repeat factors the epoch's length depends on the epoch: len(self) must be the
        # resumed epoch's before Lightning reads it (it does before the first iter()).
        self.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        self.counts.load(state["counts"], self.sampler.rank)  # type: ignore[attr-defined]


class CountingLoader(DataLoader):
    """An evaluation ``DataLoader`` that counts every batch it hands out, one pass at a time.

    Each ``iter()`` is a pass of its own (Lightning's sanity check, each validation, a user's
    ``for`` loop): it starts ``split``'s counts afresh in ``counts`` and adds each batch's
    :func:`batch_counts` as it is handed out, so Lightning's loops and a loop of one's own report
    the same numbers, and batches the workers built ahead but nobody took are not counted.
    Lightning stops at ``limit_val_batches`` without asking the loader for another batch.

    Args:
        *args, **kwargs: as for ``DataLoader``.
        split: ``"val"`` or ``"test"``.
        counts: where the passes are counted (the DataModule's, shared with a loader Lightning
            rebuilds for its ``DistributedSampler``).
    """

    def __init__(self, *args: Any, split: str, counts: ConsumedCounts, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.split, self.counts = split, counts
        self._passes = 0

    def __iter__(self) -> Iterator[Any]:
        self._passes += 1
        run = (id(self), self._passes)
        self.counts.start(self.split, run)
        return self._counting(super().__iter__(), run)

    def _counting(self, batches: Iterator[Any], run: tuple[int, int]) -> Iterator[Any]:
        for batch in batches:
            self.counts.add(self.split, run, batch_counts(batch))
            yield batch
