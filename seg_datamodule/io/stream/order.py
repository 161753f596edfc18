"""The epoch's global sample order of a streamed dataset, and how it is dealt to ranks and workers.

Issue 63, after MosaicML Streaming's elastic determinism (``streaming/base/shuffle/py1b.py``,
``py1br.py``): the order of an epoch is a function of ``(seed, epoch)`` and the chunks' item
counts alone, never of the world size or the worker count.

1. :func:`epoch_order`: chunk-aware. The chunks are permuted, cut into blocks of ``window``
   consecutive chunks, and the items of each block are permuted among themselves; the epoch is the
   blocks one after the other. A reader therefore needs the chunks of one or two blocks at a time.
2. :func:`worker_batches`: global batch ``k`` is the order's items ``[k G, (k + 1) G)`` for a
   global batch of ``G`` images; rank ``r`` of ``W`` takes its slice ``[k G + r b, k G + (r + 1) b)``
   with ``b = G / W``, so the ranks' batches of one step, concatenated in rank order, are global
   batch ``k`` for every ``W`` that divides ``G``. A torch ``DataLoader`` takes its workers' batches
   round-robin, so worker ``w`` of ``n`` builds the rank's batches ``w, w + n, w + 2n, ...``.
3. The elastic state is :class:`OrderState` ``(seed, epoch, consumed)``: a resume on another world
   size (the same ``G``) and another worker count starts at global batch ``consumed / G``.

Only full global batches are dealt under DDP (every rank takes the same number of steps); a single
process also takes the last, partial, one. Nothing here imports LitData or torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = [
    "DEFAULT_WINDOW", "EpochOrder", "OrderState", "batch_count", "chunk_offsets", "chunks_digest", "epoch_order", "first_batch", "per_rank_batch",
    "tail_count", "worker_batches", "worker_positions",
]

DEFAULT_WINDOW = 4  # chunks whose items are shuffled together (py1b's block, in chunks)
_SALT = 0x5E6D_63  # keeps this stream of random numbers apart from the per-sample seeds' (seed, epoch, index)


def chunk_offsets(chunk_sizes: Sequence[int]) -> np.ndarray:
    """Where each chunk's items start in the dataset's global item numbering.

    Args:
        chunk_sizes (Sequence[int], length C): items per chunk, in ``index.json`` order.

    Returns:
        ndarray[C + 1] int64: chunk ``c`` holds the items ``offsets[c]`` to ``offsets[c + 1] - 1``.

    Raises:
        ValueError: a negative size.
    """
    sizes = np.asarray(list(chunk_sizes), np.int64).reshape(-1)
    if np.any(sizes < 0):
        raise ValueError(f"chunk_sizes must be >= 0, got {sizes.tolist()}")
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def chunks_digest(chunk_sizes: Sequence[int]) -> str:
    """A short fingerprint of the chunk layout an order was computed over (saved in the state)."""
    return hashlib.sha256(np.asarray(list(chunk_sizes), np.int64).tobytes()).hexdigest()[:16]


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return int(value)


class EpochOrder:
    """The epoch's :func:`epoch_order`, made block by block, in sequence, as far as it is read.

    A block's items are a permutation drawn from the one random stream after the blocks before
    it, so block ``j`` is made after blocks ``0 .. j - 1``; a reader starting an epoch needs only
    the first blocks (a resume, those up to where it resumes). Up front it costs the chunks'
    permutation and the blocks' sizes (arrays of C), not the N items.

    Args: as :func:`epoch_order`.

    Attributes:
        offsets (ndarray[C + 1] int64): :func:`chunk_offsets` of ``chunk_sizes``.
        chunks (ndarray[C] int64): the chunks in the epoch's order; block ``j`` holds
            ``chunks[j * window:(j + 1) * window]``.
        starts (ndarray[K + 1] int64): where each of the K blocks starts in the order (N last).

    Raises:
        TypeError, ValueError: ``epoch`` or ``window`` is not an int >= 0 (>= 1 for ``window``).
    """

    def __init__(self, seed: int, epoch: int, chunk_sizes: Sequence[int], window: int = DEFAULT_WINDOW) -> None:
        epoch = _check_int("epoch", epoch, 0)
        self.window = _check_int("window", window, 1)
        self.offsets = chunk_offsets(chunk_sizes)
        self._rng = np.random.default_rng(np.random.SeedSequence([int(seed) % 2**64, epoch, _SALT]))
        self.chunks = self._rng.permutation(len(self.offsets) - 1)
        sizes = np.diff(self.offsets)[self.chunks]
        heads = np.arange(0, len(sizes), self.window)
        blocks = np.add.reduceat(sizes, heads) if len(sizes) else np.zeros(0, np.int64)
        self.starts = np.concatenate([[0], np.cumsum(blocks)]).astype(np.int64)
        self._blocks: list[np.ndarray] = []

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def num_blocks(self) -> int:
        return len(self.starts) - 1

    def block(self, j: int) -> np.ndarray:
        """Block ``j``'s items in order (ndarray int64), the blocks before it made first."""
        while len(self._blocks) <= j:
            head = len(self._blocks) * self.window
            items = [np.arange(self.offsets[c], self.offsets[c + 1], dtype=np.int64)
                     for c in self.chunks[head:head + self.window]]
            self._blocks.append(self._rng.permutation(np.concatenate(items)))
        return self._blocks[j]

    def block_of(self, positions: np.ndarray) -> np.ndarray:
        """The block each position of the order lies in (ndarray int64, as ``positions``)."""
        return np.searchsorted(self.starts, positions, side="right") - 1

    def take(self, positions: np.ndarray) -> np.ndarray:
        """The items at ``positions`` of the order (ndarray int64), as ``ndarray.take`` would give them."""
        positions = np.asarray(positions, np.int64)
        out = np.empty(positions.shape, np.int64)
        blocks = self.block_of(positions)
        for j in np.unique(blocks).tolist():
            at = blocks == j
            out[at] = self.block(j)[positions[at] - self.starts[j]]
        return out


def epoch_order(seed: int, epoch: int, chunk_sizes: Sequence[int], window: int = DEFAULT_WINDOW) -> np.ndarray:
    """The epoch's global item order: chunks permuted into blocks of ``window``, items permuted per block.

    Args:
        seed (int): the run's seed (any int; taken modulo 2**64).
        epoch (int): 0-based epoch.
        chunk_sizes (Sequence[int], length C): items per chunk.
        window (int): chunks per block; a reader's items come from the chunks of the blocks its
            batch overlaps.

    Returns:
        ndarray[N] int64: a permutation of ``0 .. N - 1`` (N the total of ``chunk_sizes``); the
        items of block ``j`` fill one contiguous run of it, blocks in order.

    Raises:
        TypeError, ValueError: ``epoch`` or ``window`` is not an int >= 0 (>= 1 for ``window``).
    """
    order = EpochOrder(seed, epoch, chunk_sizes, window)
    parts = [order.block(j) for j in range(order.num_blocks)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def per_rank_batch(global_batch: int, world_size: int, batch_size: int | None = None) -> int:
    """Each rank's batch size for a global batch of ``global_batch`` images on ``world_size`` ranks.

    Args:
        global_batch (int): ``batch_size x world_size`` of the order (a checkpoint's, on resume).
        world_size (int): ranks now.
        batch_size (int | None): the per-rank batch size given now; None: any that fits.

    Raises:
        ValueError: ``world_size`` does not divide ``global_batch``, or ``batch_size x world_size``
            is another global batch (one line naming the batch sizes that keep it).
    """
    global_batch = _check_int("global_batch", global_batch, 1)
    world_size = _check_int("world_size", world_size, 1)
    if global_batch % world_size or (batch_size is not None and batch_size * world_size != global_batch):
        given = f"batch_size {batch_size} on" if batch_size is not None else "it over"
        works = ", ".join(f"{global_batch // w} on {w}" for w in range(1, global_batch + 1) if global_batch % w == 0)
        raise ValueError(f"a global batch of {global_batch} images (batch_size x world size) cannot be kept with "
                         f"{given} {world_size} ranks; batch_size on ranks that keep it: {works}")
    return global_batch // world_size


def batch_count(num_items: int, global_batch: int, world_size: int) -> int:
    """Global batches in an epoch: the full ones, and under a single process the partial last one."""
    full, rest = divmod(_check_int("num_items", num_items, 0), _check_int("global_batch", global_batch, 1))
    return full + int(world_size == 1 and rest > 0)


def tail_count(num_items: int, global_batch: int, world_size: int) -> int:
    """Items of an epoch no rank streams: the partial last global batch, under DDP only."""
    if world_size <= 1:
        return 0
    return int(num_items) % int(global_batch)


def first_batch(num_items: int, global_batch: int, consumed: int) -> int:
    """The first global batch after ``consumed`` items (a multiple of the global batch, or N)."""
    consumed = _check_int("consumed", consumed, 0)
    if consumed != num_items and (consumed > num_items or consumed % global_batch):
        raise ValueError(f"consumed must be a multiple of the global batch {global_batch} up to {num_items} "
                         f"(or {num_items}, the epoch's end), got {consumed}")
    return -(-consumed // global_batch)


def worker_positions(num_items: int, global_batch: int, world_size: int, rank: int, num_workers: int = 0,
                     worker: int = 0, consumed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Where in the epoch's order the items of worker ``worker`` of rank ``rank`` stand, in the order it yields them.

    Args: as for :func:`worker_batches`, with ``num_items`` (N) for the order.

    Returns:
        ``(positions, starts)``: ndarray[M] int64, positions in the order (its items are
        ``order[positions]``); ndarray[B + 1] int64, where each of the worker's B batches starts in
        ``positions`` (its end last).

    Raises:
        ValueError: as :func:`worker_batches`.
    """
    size = per_rank_batch(global_batch, world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    streams = max(1, _check_int("num_workers", num_workers, 0))
    if not 0 <= worker < streams:
        raise ValueError(f"worker must be in [0, {streams}), got {worker}")
    n = _check_int("num_items", num_items, 0)
    first = first_batch(n, global_batch, consumed)
    ks = np.arange(first + worker, batch_count(n, global_batch, world_size), streams, dtype=np.int64)
    positions = (ks * global_batch + rank * size)[:, None] + np.arange(size, dtype=np.int64)
    inside = positions < n  # only the single-process last batch is cut short
    lengths = inside.sum(axis=1)
    return positions[inside], np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def worker_batches(order: np.ndarray, global_batch: int, world_size: int, rank: int, num_workers: int = 0,
                   worker: int = 0, consumed: int = 0) -> list[np.ndarray]:
    """The batches worker ``worker`` of rank ``rank`` builds, in the order it yields them.

    Args:
        order (ndarray[N] int64): the epoch's :func:`epoch_order`.
        global_batch (int): images per step over all ranks (``batch_size x world_size``).
        world_size (int): ranks; must divide ``global_batch``.
        rank (int): ``0 .. world_size - 1``.
        num_workers (int): the DataLoader's workers (0: the main process, one stream).
        worker (int): ``0 .. max(num_workers, 1) - 1``.
        consumed (int): global items of the epoch already trained on (a multiple of
            ``global_batch``, or N): the batches before are skipped.

    Returns:
        list of ndarray[b] int64 (``b = global_batch / world_size``; the single-process last batch
        may be shorter): item ids; the rank's batches ``worker, worker + n, ...`` after ``consumed``.

    Raises:
        ValueError: the batch does not split over the ranks (:func:`per_rank_batch`), or a rank,
            worker or ``consumed`` out of range.
    """
    positions, starts = worker_positions(len(order), global_batch, world_size, rank, num_workers, worker, consumed)
    items = np.asarray(order, np.int64)[positions]
    return [items[a:b] for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]


@dataclass(frozen=True)
class OrderState:
    """Where a streamed run is in its global order: what a checkpoint keeps, for any world size.

    Args:
        seed (int): the order's seed.
        epoch (int): 0-based epoch.
        consumed (int): global items of the epoch trained on (a multiple of ``global_batch``, or
            the epoch's N).
        global_batch (int): ``batch_size x world_size`` of the run that saved it.
        window (int): chunks per shuffle block.
        chunks (str): :func:`chunks_digest` of the chunk layout.
    """

    seed: int
    epoch: int
    consumed: int
    global_batch: int
    window: int = DEFAULT_WINDOW
    chunks: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "OrderState":
        """Rebuild a saved state.

        Raises:
            ValueError: a field is missing.
        """
        missing = [k for k in ("seed", "epoch", "consumed", "global_batch") if k not in data]
        if missing:
            raise ValueError(f"a streamed loader state lacks {missing}")
        return cls(int(data["seed"]), int(data["epoch"]), int(data["consumed"]), int(data["global_batch"]),
                   int(data.get("window", DEFAULT_WINDOW)), str(data.get("chunks", "")))
