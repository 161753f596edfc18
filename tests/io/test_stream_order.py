"""The streamed global order (``seg_datamodule.io.stream.order``, issue 63), without LitData.

The reference for "what a DataLoader hands out" is a plain model of torch's round-robin over its
workers (:func:`_rank_stream`), written here independently of the module's own dealing.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seg_datamodule.io.stream.order import (
    EpochOrder,
    OrderState,
    batch_count,
    chunk_offsets,
    epoch_order,
    per_rank_batch,
    tail_count,
    worker_batches,
    worker_positions,
)
from seg_datamodule.io.stream.plan import (
    BlockVisits,
    Deal,
    NodeDownloads,
    WorkerPlan,
    downloads_ahead,
    gc_paused,
    worker_plan,
    worker_visits,
)


def _rank_stream(order: np.ndarray, global_batch: int, world: int, rank: int, workers: int,
                 consumed: int = 0) -> list[list[int]]:
    """What a torch DataLoader over ``workers`` workers hands out: one batch of each live worker in turn."""
    queues = [list(worker_batches(order, global_batch, world, rank, workers, w, consumed))
              for w in range(max(1, workers))]
    out: list[list[int]] = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0).tolist())
    return out


def _global_batches(order: np.ndarray, global_batch: int, world: int, workers: int,
                    consumed: int = 0) -> list[list[int]]:
    """The ranks' batches of each step concatenated in rank order."""
    ranks = [_rank_stream(order, global_batch, world, r, workers, consumed) for r in range(world)]
    assert len({len(r) for r in ranks}) == 1, "ranks must take the same number of steps"
    return [sum((r[k] for r in ranks), []) for k in range(len(ranks[0]))]


# ------------------------------------------------------------------------ hand-computed cases


def test_empty_dataset_has_an_empty_order_and_no_batches() -> None:
    assert epoch_order(0, 0, []).tolist() == []
    assert epoch_order(0, 0, [0, 0]).tolist() == []
    assert worker_batches(np.zeros(0, np.int64), 4, 2, 1, 2, 1) == []
    assert batch_count(0, 4, 1) == 0


def test_hand_computed_deal_of_ten_items() -> None:
    order = np.arange(10)
    # one process: 4, 4 and the partial last 2
    assert [b.tolist() for b in worker_batches(order, 4, 1, 0)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    # two workers: worker 0 batches 0 and 2, worker 1 batch 1
    assert [b.tolist() for b in worker_batches(order, 4, 1, 0, 2, 0)] == [[0, 1, 2, 3], [8, 9]]
    assert [b.tolist() for b in worker_batches(order, 4, 1, 0, 2, 1)] == [[4, 5, 6, 7]]
    # two ranks of 2: full global batches only; rank 1 takes the second half of each
    assert [b.tolist() for b in worker_batches(order, 4, 2, 1)] == [[2, 3], [6, 7]]
    assert [b.tolist() for b in worker_batches(order, 4, 2, 1, 2, 1)] == [[6, 7]]
    # resumed after one global batch, on four ranks of 1
    assert [b.tolist() for b in worker_batches(order, 4, 4, 3, 0, 0, consumed=4)] == [[7]]
    assert tail_count(10, 4, 2) == 2 and tail_count(10, 4, 1) == 0
    assert batch_count(10, 4, 1) == 3 and batch_count(10, 4, 2) == 2


def test_hand_computed_order_keeps_blocks_of_window_chunks() -> None:
    """Chunks of 1 item and a window of 1: the order is a permutation of the chunks, each alone."""
    order = epoch_order(7, 0, [1, 1, 1, 1])
    assert sorted(order.tolist()) == [0, 1, 2, 3]
    # chunks [0, 1] (items 0-1) and [2, 3, 4] (items 2-4) with window 1: each chunk's items together
    order = epoch_order(3, 1, [2, 3], window=1).tolist()
    first = set(order[:2]) if set(order[:2]) <= {0, 1} else set(order[:3])
    assert first in ({0, 1}, {2, 3, 4})


def test_order_depends_on_seed_and_epoch_only() -> None:
    sizes = [5, 7, 3, 8, 6]
    a = epoch_order(11, 2, sizes)
    assert np.array_equal(a, epoch_order(11, 2, list(sizes)))
    assert not np.array_equal(a, epoch_order(11, 3, sizes))
    assert not np.array_equal(a, epoch_order(12, 2, sizes))


def _visits_by_loop(batches: list[np.ndarray], offsets: np.ndarray) -> list[tuple[int, list[int]]]:
    """The visits item by item, as the rule says: per batch, its items grouped by chunk in the
    order of the chunks' first items; a chunk read on across a batch boundary is one visit."""
    visits: list[tuple[int, list[int]]] = []
    for batch in batches:
        groups: dict[int, list[int]] = {}
        for item in batch.tolist():
            groups.setdefault(int(np.searchsorted(offsets, item, side="right") - 1), []).append(item)
        for chunk, items in groups.items():
            if visits and visits[-1][0] == chunk:
                visits[-1][1].extend(items)
            else:
                visits.append((chunk, items))
    return visits


def test_worker_positions_by_hand() -> None:
    positions, starts = worker_positions(10, 4, 1, 0, 2, 0)  # batches 0 and 2 (partial) of one process
    assert positions.tolist() == [0, 1, 2, 3, 8, 9] and starts.tolist() == [0, 4, 6]
    positions, starts = worker_positions(10, 4, 2, 1, 2, 1)  # rank 1 of 2, worker 1: batch 1's second half
    assert positions.tolist() == [6, 7] and starts.tolist() == [0, 2]
    positions, starts = worker_positions(10, 4, 2, 0, 0, 0, consumed=8)  # nothing full left under DDP
    assert positions.tolist() == [] and starts.tolist() == [0]


def test_visits_read_each_chunk_of_a_batch_once() -> None:
    offsets = chunk_offsets([2, 3])
    visits = worker_visits([np.array([0, 2, 1, 3]), np.array([4])], offsets)
    assert visits == [(0, [0, 1]), (1, [2, 3, 4])]


def test_a_global_batch_that_does_not_split_is_one_line_naming_what_works() -> None:
    with pytest.raises(ValueError, match=r"cannot be kept with it over 3 ranks; batch_size on ranks that keep it: "
                                         r"16 on 1, 8 on 2, 4 on 4, 2 on 8, 1 on 16$"):
        per_rank_batch(16, 3)
    with pytest.raises(ValueError, match=r"with batch_size 8 on 4 ranks; .*: 16 on 1, 8 on 2, 4 on 4") as err:
        per_rank_batch(16, 4, batch_size=8)
    assert "\n" not in str(err.value)
    assert per_rank_batch(16, 4, batch_size=4) == 4
    with pytest.raises(ValueError, match="consumed must be a multiple of the global batch 4"):
        worker_batches(np.arange(10), 4, 1, 0, consumed=3)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\)"):
        worker_batches(np.arange(10), 4, 2, 2)
    with pytest.raises(TypeError, match="epoch must be an int"):
        epoch_order(0, 1.0, [1])


def test_state_round_trips_and_names_what_is_missing() -> None:
    state = OrderState(seed=3, epoch=1, consumed=8, global_batch=4, window=2, chunks="ab")
    assert OrderState.from_dict(state.to_dict()) == state
    with pytest.raises(ValueError, match=r"lacks \['consumed'\]"):
        OrderState.from_dict({"seed": 1, "epoch": 0, "global_batch": 4})


# ------------------------------------------------------------------------ properties

_sizes = st.lists(st.integers(0, 7), min_size=0, max_size=9)


@settings(max_examples=120, deadline=None)
@given(sizes=_sizes, seed=st.integers(0, 2**40), epoch=st.integers(0, 5), window=st.integers(1, 4))
def test_each_epoch_is_a_permutation_with_chunks_inside_one_window(sizes: list[int], seed: int, epoch: int,
                                                                  window: int) -> None:
    order = epoch_order(seed, epoch, sizes, window)
    n = sum(sizes)
    assert sorted(order.tolist()) == list(range(n))
    # Window bound: at any point of the order, the chunks begun and not yet finished number at most
    # `window` (a chunk's items lie inside one block of `window` chunks).
    chunk = np.searchsorted(chunk_offsets(sizes), order, side="right") - 1
    first = {int(c): i for i, c in reversed(list(enumerate(chunk)))}
    last = {int(c): i for i, c in enumerate(chunk)}
    for i in range(n):
        assert sum(first[c] <= i <= last[c] for c in first) <= window


@settings(max_examples=80, deadline=None)
@given(sizes=_sizes, seed=st.integers(0, 2**40), epoch=st.integers(0, 3), per_rank=st.integers(1, 3),
       window=st.integers(1, 3))
def test_same_global_batches_for_every_world_size_and_worker_count(sizes: list[int], seed: int, epoch: int,
                                                                  per_rank: int, window: int) -> None:
    global_batch = 4 * per_rank
    order = epoch_order(seed, epoch, sizes, window)
    reference = [order[k * global_batch:(k + 1) * global_batch].tolist() for k in range(len(order) // global_batch)]
    for world in (1, 2, 4):
        for workers in (0, 1, 2, 4):
            got = _global_batches(order, global_batch, world, workers)
            full = [b for b in got if len(b) == global_batch]
            assert full == reference, (world, workers)
            if world == 1 and len(order) % global_batch:  # one process also takes the partial last batch
                assert got[-1] == order[len(reference) * global_batch:].tolist()
            else:
                assert len(got) == len(reference)
            # Window bound per worker: in the order a worker yields its items, the chunks begun
            # and not finished number at most `window` at any point.
            offsets = chunk_offsets(sizes)
            for rank in range(world):
                for w in range(max(1, workers)):
                    items = [i for b in worker_batches(order, global_batch, world, rank, workers, w) for i in b]
                    chunk = (np.searchsorted(offsets, items, side="right") - 1).tolist()
                    first = {c: i for i, c in reversed(list(enumerate(chunk)))}
                    last = {c: i for i, c in enumerate(chunk)}
                    for i in range(len(chunk)):
                        assert sum(first[c] <= i <= last[c] for c in first) <= window


@settings(max_examples=60, deadline=None)
@given(sizes=_sizes, seed=st.integers(0, 2**40), per_rank=st.integers(1, 2), data=st.data())
def test_a_resume_on_another_world_size_continues_the_same_sequence(sizes: list[int], seed: int, per_rank: int,
                                                                   data: st.DataObject) -> None:
    global_batch = 4 * per_rank
    order = epoch_order(seed, 1, sizes, 2)
    saved_world = data.draw(st.sampled_from([1, 2, 4]))
    straight = _global_batches(order, global_batch, saved_world, 2)
    k = data.draw(st.integers(0, len(straight)))
    consumed = min(k * global_batch, len(order))
    full = [order[j * global_batch:(j + 1) * global_batch].tolist() for j in range(len(order) // global_batch)]
    partial = order[len(full) * global_batch:].tolist()
    for world in (1, 2, 4):
        for workers in (0, 1, 3):
            resumed = _global_batches(order, global_batch, world, workers, consumed)
            expected = full[k:] + ([partial] if world == 1 and partial and consumed < len(order) else [])
            assert resumed == expected, (saved_world, k, world, workers)


@settings(max_examples=60, deadline=None)
@given(sizes=_sizes, seed=st.integers(0, 2**40), workers=st.integers(0, 4))
def test_visits_are_the_worker_items_grouped_by_chunk_per_batch(sizes: list[int], seed: int, workers: int) -> None:
    order = epoch_order(seed, 0, sizes, 3)
    offsets = chunk_offsets(sizes)
    for w in range(max(1, workers)):
        batches = worker_batches(order, 4, 1, 0, workers, w)
        visits = worker_visits(batches, offsets)
        assert visits == _visits_by_loop(batches, offsets)
        flat = [i for _, items in visits for i in items]
        assert sorted(flat) == sorted(i for b in batches for i in b.tolist())
        for chunk, items in visits:
            assert all(offsets[chunk] <= i < offsets[chunk + 1] for i in items)
        # each batch's items are read in one piece, batch after batch
        pos = 0
        for b in batches:
            assert sorted(flat[pos:pos + len(b)]) == sorted(b.tolist())
            pos += len(b)


@settings(max_examples=40, deadline=None)
@given(sizes=_sizes, seed=st.integers(0, 2**40), world=st.sampled_from([1, 2, 4]), workers=st.integers(0, 3),
       data=st.data())
def test_a_workers_plan_is_its_batches_visits_and_their_places_in_the_order(
        sizes: list[int], seed: int, world: int, workers: int, data: st.DataObject) -> None:
    order = epoch_order(seed, 2, sizes, 2)
    rank, worker = data.draw(st.integers(0, world - 1)), data.draw(st.integers(0, max(1, workers) - 1))
    consumed = data.draw(st.integers(0, len(order) // 8)) * 8
    visits, positions = worker_plan(order, chunk_offsets(sizes), 8, world, rank, workers, worker, consumed)
    batches = worker_batches(order, 8, world, rank, workers, worker, consumed)
    assert visits == _visits_by_loop(batches, chunk_offsets(sizes))
    assert sorted(positions) == sorted(i for b in batches for i in b.tolist())
    assert all(order[p] == item for item, p in positions.items())


@settings(max_examples=80, deadline=None)
@given(sizes=_sizes, seed=st.integers(0, 2**40), world=st.sampled_from([1, 2, 4]), workers=st.integers(0, 5),
       data=st.data())
def test_a_nodes_workers_download_each_chunk_its_ranks_read_once_in_the_order_first_needed(
        sizes: list[int], seed: int, world: int, workers: int, data: st.DataObject) -> None:
    order = epoch_order(seed, 1, sizes, 2)
    offsets = chunk_offsets(sizes)
    on_node = data.draw(st.sampled_from([d for d in (1, 2, 4) if world % d == 0]))
    node = data.draw(st.integers(0, world // on_node - 1))
    ranks = range(node * on_node, (node + 1) * on_node)
    consumed = data.draw(st.integers(0, len(order) // 8)) * 8
    streams = [(rank, w) for rank in ranks for w in range(max(1, workers))]  # rank by rank, worker by worker
    lists = [NodeDownloads(EpochOrder(seed, 1, sizes, 2), Deal(8, world, rank, workers, w, consumed), on_node).all()
             for rank, w in streams]
    # the reference: every item the node's ranks read, step by step, and the chunk each lies in
    first_need: dict[int, int] = {}
    for rank in ranks:
        for k, batch in enumerate(_rank_stream(order, 8, world, rank, workers, consumed)):
            for i in batch:
                chunk = int(np.searchsorted(offsets, i, side="right") - 1)
                first_need[chunk] = min(first_need.get(chunk, k), k)
    assert sorted(c for chunks in lists for c in chunks) == sorted(first_need)  # each once, all of them
    for chunks in lists:  # each list in the order the node first needs its chunks
        assert [first_need[c] for c in chunks] == sorted(first_need[c] for c in chunks)
    # dealt round-robin to the workers with a batch left; the others download nothing
    live = [j for j, (rank, w) in enumerate(streams) if worker_batches(order, 8, world, rank, workers, w, consumed)]
    assert all(not lists[j] for j in range(len(streams)) if j not in live)
    assert [len(lists[j]) for j in live] == [len(range(k, len(first_need), len(live))) for k in range(len(live))]
    if on_node == 1:  # a rank alone: its workers download what it reads
        read = {int(np.searchsorted(offsets, i, side="right") - 1) for w in range(max(1, workers))
                for b in worker_batches(order, 8, world, node, workers, w, consumed) for i in b.tolist()}
        assert set(first_need) == read


@settings(max_examples=60, deadline=None)
@given(sizes=_sizes, seed=st.integers(0, 2**40), world=st.sampled_from([1, 2, 4]), workers=st.integers(0, 3),
       segment=st.integers(1, 40), data=st.data())
def test_a_plan_made_segment_by_segment_as_it_is_read_is_the_whole_plan(
        sizes: list[int], seed: int, world: int, workers: int, segment: int, data: st.DataObject) -> None:
    order, offsets = epoch_order(seed, 0, sizes, 2), chunk_offsets(sizes)
    rank, worker = data.draw(st.integers(0, world - 1)), data.draw(st.integers(0, max(1, workers) - 1))
    consumed = data.draw(st.integers(0, len(order) // 8)) * 8
    args = (order, offsets, 8, world, rank, workers, worker)
    visits, positions = worker_plan(*args, consumed)
    lazy = EpochOrder(seed, 0, sizes, 2)  # the order made as the plan reads it
    plan = WorkerPlan(lazy, *worker_positions(len(order), *args[2:], consumed), offsets, segment_items=segment)
    assert plan.num_items == sum(len(items) for _, items in visits)
    read = []  # each visit as a reader takes it: copied once ensure() has made it
    for i in range(len(visits)):
        plan.ensure(i)
        assert len(plan.item_lists) > i + 1 or plan.done  # the visit read is final: the next one exists
        read.append((plan.chunks[i], list(plan.item_lists[i])))
        assert all(plan.positions[item] == positions[item] for item in read[-1][1])
    assert read == visits  # visits read on across a seam are one, as in the whole plan
    plan.ensure(len(visits))
    assert plan.done and plan.positions == positions and len(plan.chunks) == len(visits)


@settings(max_examples=60, deadline=None)
@given(sizes=_sizes, seed=st.integers(0, 2**40), world=st.sampled_from([1, 2, 4]), workers=st.integers(0, 3),
       segment=st.integers(1, 40), data=st.data())
def test_visits_counted_a_block_at_a_time_are_the_whole_plans_once_each(
        sizes: list[int], seed: int, world: int, workers: int, segment: int, data: st.DataObject) -> None:
    """``BlockVisits.through(b)`` for rising ``b`` (with repeats) hands out each visit of the whole
    plan once, and only visits to chunks of the blocks before ``b``, as a reference recomputed
    from the whole plan and the chunks' blocks (``epoch_order``'s window of the permuted chunks)."""
    window = data.draw(st.integers(1, 4))
    order, offsets = epoch_order(seed, 0, sizes, window), chunk_offsets(sizes)
    rank, worker = data.draw(st.integers(0, world - 1)), data.draw(st.integers(0, max(1, workers) - 1))
    consumed = data.draw(st.integers(0, len(order) // 8)) * 8
    args = (order, offsets, 8, world, rank, workers, worker)
    visits, _ = worker_plan(*args, consumed)
    lazy = EpochOrder(seed, 0, sizes, window)
    block = {int(c): i // window for i, c in enumerate(lazy.chunks)}  # each chunk's block, by hand
    plan = WorkerPlan(lazy, *worker_positions(len(order), *args[2:], consumed), offsets, segment_items=segment)
    counter = BlockVisits(plan, lazy)
    stops = sorted(data.draw(st.lists(st.integers(0, lazy.num_blocks + 1), max_size=6))) + [lazy.num_blocks]
    total: Counter = Counter()
    for b in stops:
        new = counter.through(b)
        assert all(block[c] < b for c in new), (b, new)
        total.update(new)
        want = Counter(c for c, _ in visits if block[c] < b)
        assert total == want, (b, total, want)  # all visits before b, none twice
    assert total == Counter(c for c, _ in visits)


def test_downloads_ahead_by_hand() -> None:
    """640 items in 128 chunks of 5, window 4 (32 blocks of 20); a global batch of 8, 2 workers:
    the readers' spread is (2 x 2 + 1) x 8 = 40 places. A cache that holds the set: 8 blocks and 4
    steps of every worker (160 + 64). A budget of 20 chunks holds 5 blocks, 3 past the readers':
    60 places less the spread, 20, is below the spread: none. 40 chunks: 8 past, 160 - 40 = 120."""
    order = EpochOrder(0, 0, [5] * 128, 4)
    deal = Deal(8, 1, 0, 2, 0)
    assert downloads_ahead(order, deal) == 224
    assert downloads_ahead(order, deal, ahead_items=7) == 7
    assert downloads_ahead(order, deal, budget_chunks=20) is None
    assert downloads_ahead(order, deal, budget_chunks=40) == 120
    assert downloads_ahead(order, deal, ahead_items=50, budget_chunks=40) == 50
    assert downloads_ahead(order, deal, budget_chunks=4000) == 224  # never past the default


def test_a_plan_makes_only_the_segments_read() -> None:
    sizes = [10] * 100  # 1,000 items, one process, batch 8: 125 batches
    order = epoch_order(0, 0, sizes)
    plan = WorkerPlan(order, *worker_positions(len(order), 8, 1, 0), chunk_offsets(sizes), segment_items=16)
    plan.ensure(0)
    assert len(plan.positions) == 16 and not plan.done  # two batches, not the epoch
    assert len(plan.make_all().positions) == 1000


class _HandOrder(EpochOrder):
    """An order written out by hand, as one block."""

    def __init__(self, items: list[int], chunk_sizes: list[int]) -> None:
        self.offsets, self.window = chunk_offsets(chunk_sizes), len(chunk_sizes)
        self.chunks, self.starts = np.arange(len(chunk_sizes)), np.array([0, len(items)])
        self._blocks = [np.array(items, np.int64)]


def test_node_downloads_by_hand() -> None:
    # chunks of 2 items; the order 5 4 0 1 2 3 reads chunk 2, then 0, then 1
    order = _HandOrder([5, 4, 0, 1, 2, 3], [2, 2, 2])

    def downloads(*deal: int, consumed: int = 0, on_node: int = 1) -> list[int]:
        return NodeDownloads(order, Deal(2, *deal, consumed=consumed), on_node).all()

    assert downloads(1, 0, 0, 0) == [2, 0, 1]
    assert downloads(1, 0, 2, 0) == [2, 1]
    assert downloads(1, 0, 2, 1) == [0]
    assert downloads(1, 0, 4, 3) == []  # three batches: a fourth worker has none
    assert downloads(1, 0, 2, 0, consumed=4) == [1]  # a resume needs chunk 1 only
    # at two ranks on two nodes each downloads only what it reads: rank 0 items 0, 1, 2; rank 1 items 5, 4, 3
    order = _HandOrder([0, 5, 1, 4, 2, 3], [2, 2, 2])
    assert downloads(2, 0, 1, 0) == [0, 1]
    assert downloads(2, 1, 1, 0) == [2, 1]
    # two ranks on one node: the node reads chunks 0, 2, 1 (first needed in that order), dealt to
    # rank 0's worker, rank 1's, rank 0's
    assert downloads(2, 0, 1, 0, on_node=2) == [0, 1]
    assert downloads(2, 1, 1, 0, on_node=2) == [2]
    # with two workers a rank (three batches each: both workers have one), chunks 0, 2, 1 go
    # round-robin over rank 0's workers 0 and 1, then rank 1's
    assert [downloads(2, r, 2, w, on_node=2) for r in (0, 1) for w in (0, 1)] == [[0], [2], [1], []]
    with pytest.raises(ValueError, match="worker must be in"):
        downloads(1, 0, 2, 2)
    with pytest.raises(ValueError, match="ranks_on_node must divide the world size 2, got 3"):
        downloads(2, 0, 1, 0, on_node=3)


def test_node_downloads_are_made_a_block_at_a_time() -> None:
    order = EpochOrder(0, 0, [10] * 40, 4)  # ten blocks of four chunks
    downloads = NodeDownloads(order, Deal(8, 1, 0, 2, 1))
    first = downloads.next_block()
    assert len(order._blocks) == 1 and downloads.next == 1  # the first block only was made
    need = dict.fromkeys(int(np.searchsorted(order.offsets, i, side="right") - 1) for i in order.block(0).tolist())
    assert first == list(need)[1::2]  # one process reads the whole block: worker 1 takes every other chunk
    assert not downloads.done and len(downloads.all()) == 18 and downloads.done


def test_an_epoch_order_is_made_only_as_far_as_it_is_read() -> None:
    sizes = [3, 0, 5, 7, 1, 4, 2]
    whole = epoch_order(11, 2, sizes, 2)
    order = EpochOrder(11, 2, sizes, 2)
    assert len(order) == 22 and order.num_blocks == 4
    assert order.take(np.array([1, 0])).tolist() == whole[[1, 0]].tolist() and len(order._blocks) == 1
    positions = np.array([21, 3, 9, 0, 17])
    assert order.take(positions).tolist() == whole[positions].tolist()
    assert np.concatenate([order.block(j) for j in range(4)]).tolist() == whole.tolist()
    assert order.block_of(np.array([0, 21])).tolist() == [0, 3]


def test_gc_paused_restores_the_collector_as_it_found_it() -> None:
    import gc

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # the user's choice kept
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError
    assert gc.isenabled()
