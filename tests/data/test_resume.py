"""Mid-epoch resume: exactly the batches an uninterrupted run sees, counts included."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _child import run_child
from _datasets import make_dataset
from seg_datamodule import DetectionCollate, EpochShardSampler, SegDataset
from seg_datamodule.data.loaders.arguments import worker_init_fn
from seg_datamodule.data.loaders.resume import ResumableDataLoader
from _recorder import read_counts, read_steps
from test_dataset import FakeIndex

HERE = Path(__file__).resolve().parent


def _print(batch) -> tuple:
    digest = lambda t: hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()  # noqa: E731
    return tuple(batch.image_ids.tolist()), digest(batch.images), digest(batch.masks), digest(batch.boxes)


def _loader(ds: SegDataset, workers: int, batch_size: int = 4, **kwargs) -> ResumableDataLoader:
    return ResumableDataLoader(ds, batch_size=batch_size, sampler=EpochShardSampler(ds, seed=3),
                               num_workers=workers, collate_fn=DetectionCollate(mask_stride=4),
                               worker_init_fn=worker_init_fn if workers else None, **kwargs)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_state_resumes_mid_epoch_with_the_same_batches_and_counts(workers: int) -> None:
    ds = make_dataset(FakeIndex(n=24, bad=frozenset({7}), on_bad_sample="skip"), image_size=64, seed=3)
    straight = _loader(ds, workers)
    want = []
    for epoch in (0, 1):
        straight.sampler.set_epoch(epoch)
        want += [_print(b) for b in straight]
    first = _loader(ds, workers)
    it = iter(first)
    got = [_print(next(it)) for _ in range(4)]  # 4 of the epoch's 6 batches, then "killed"
    state = first.state_dict()
    assert state["epoch"] == 0 and state["batches"] == 4
    del it
    resumed = _loader(ds, workers)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # the state survives a plain serialisation
    got += [_print(b) for b in resumed]
    resumed.sampler.set_epoch(1)
    got += [_print(b) for b in resumed]
    assert got == want
    assert resumed.delivered_counts == straight.delivered_counts
    assert straight.delivered_counts["image_corrupt"] >= 1 and straight.delivered_counts["samples"] == 48


def test_a_checkpoint_at_the_end_of_an_epoch_resumes_at_the_next() -> None:
    ds = make_dataset(FakeIndex(n=12), image_size=64, seed=3)
    first = _loader(ds, 0)
    list(first)
    resumed = _loader(ds, 0)
    resumed.load_state_dict(first.state_dict())
    straight = _loader(ds, 0)
    straight.sampler.set_epoch(1)
    assert [_print(b) for b in resumed] == [_print(b) for b in straight]


def test_counts_leave_out_batches_handed_out_but_not_trained_on() -> None:
    ds = make_dataset(FakeIndex(n=12), image_size=64, seed=3)
    trained = {"n": 0}
    loader = _loader(ds, 0, progress=lambda: trained["n"])
    it = iter(loader)
    first = next(it)
    next(it)  # fetched ahead, as Lightning's fetcher does
    trained["n"] = 1
    assert loader.delivered_counts == first.counts
    assert loader.state_dict()["batches"] == 1


def test_a_cut_epoch_resumes_at_the_next_with_the_uninterrupted_counts() -> None:
    """limit_train_batches cuts each epoch at 3 of 6 batches, and Lightning fetches one batch past
    the cut: a checkpoint at the cut resumes at the next epoch, and its counts, like the
    uninterrupted run's, hold exactly the batches trained on (issue 35)."""
    ds = make_dataset(FakeIndex(n=24), image_size=64, seed=3)
    limit, trained = 3, {"n": 0}

    def run(loader: ResumableDataLoader, epochs: list[int]) -> list[tuple]:
        seen = []
        for epoch in epochs:
            it = iter(loader)  # Lightning creates the iterator, then sets the epoch
            loader.sampler.set_epoch(epoch)
            trained["n"] = 0
            for k in range(limit):
                seen.append(_print(next(it)))
                trained["n"] = k + 1
            next(it)  # fetched past the cut, never trained on
        return seen

    def make() -> ResumableDataLoader:
        return _loader(ds, 0, progress=lambda: trained["n"], epoch_length=lambda: limit)

    straight = make()
    want = run(straight, [0, 1])
    first = make()
    got = run(first, [0])
    state = json.loads(json.dumps(first.state_dict()))
    assert (state["epoch"], state["batches"], state["epoch_batches"]) == (0, 3, 3)
    resumed = make()
    resumed.load_state_dict(state)
    got += run(resumed, [1])
    assert got == want
    assert resumed.delivered_counts == straight.delivered_counts and straight.delivered_counts["samples"] == 24


@pytest.mark.parametrize("change, message", [
    (dict(batch_size=3), "batch_size 4 in the checkpoint, 3 now"),
    (dict(n=13), "dataset"),
    (dict(world_size=2), "world_size 1 in the checkpoint, 2 now"),
    (dict(seed=4), "seed 3 in the checkpoint, 4 now"),
])
def test_a_mismatched_state_is_refused_or_restarts_the_epoch(change: dict, message: str) -> None:
    ds = make_dataset(FakeIndex(n=12), image_size=64, seed=3)
    first = _loader(ds, 0)
    it = iter(first)
    next(it)
    state = first.state_dict()
    other = make_dataset(FakeIndex(n=change.get("n", 12)), image_size=64, seed=3)
    sampler = EpochShardSampler(other, num_replicas=change.get("world_size", 1), seed=change.get("seed", 3))

    def make(on_mismatch: str) -> ResumableDataLoader:
        return ResumableDataLoader(other, batch_size=change.get("batch_size", 4), sampler=sampler,
                                   collate_fn=DetectionCollate(), on_mismatch=on_mismatch)

    with pytest.raises(ValueError, match=message):
        make("raise").load_state_dict(state)
    loader = make("restart")
    with pytest.warns(UserWarning, match="restarting the epoch"):
        loader.load_state_dict(state)
    assert len(list(loader)) == len(loader)  # the whole epoch
    with pytest.raises(ValueError, match="not a ResumableDataLoader state"):
        loader.load_state_dict({"epoch": 0})


def test_the_sampler_skips_without_loading() -> None:
    sampler = EpochShardSampler(range(10), seed=1)
    full = list(sampler)
    sampler.start_at(0, 7)
    assert list(sampler) == full[7:]
    assert list(sampler) == full  # one-shot
    sampler.start_at(3, 7)
    assert list(sampler) == full  # another epoch: ignored


# ----------------------------------------------------------------------------- a real kill


def _run(out: Path, demo_dir: Path, workers: int, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]))
    return run_child([sys.executable, str(HERE / "_resume_run.py"), str(out), str(demo_dir),
                      "--workers", str(workers), *args], env, out.parent / f"logs-{out.name}")



@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.extended)])
def test_sigkill_mid_epoch_then_resume_sees_the_same_batches(demo_dir: Path, tmp_path: Path, workers: int) -> None:
    """A real Trainer run SIGKILLs itself mid-epoch; resumed from its last checkpoint, it trains
    on bit-identical batches through the end of the next epoch, and the counts match."""
    straight = _run(tmp_path / "straight" / "run", demo_dir, workers)
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = _run(tmp_path / "killed" / "run", demo_dir, workers, "--kill-at", "7")
    assert killed.returncode == -9, killed.stderr[-3000:]
    ckpt = tmp_path / "killed" / "ckpt" / "last.ckpt"
    resumed = _run(tmp_path / "killed" / "resumed", demo_dir, workers, "--ckpt", str(ckpt))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want, got = read_steps(tmp_path / "straight" / "run"), read_steps(tmp_path / "killed" / "resumed")
    assert min(got) == 7 and max(got) == max(want) and len(want) > 7 + 5  # through the next epoch
    key = ("epoch", "batch_idx", "image_ids", "images", "masks", "ignore")
    for step in got:
        assert [got[step][k] for k in key] == [want[step][k] for k in key], step
    counts = [read_counts(tmp_path / d) for d in ("straight/run", "killed/resumed")]
    assert counts[0] == counts[1] and counts[0]["kept"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [5, pytest.param(7, marks=pytest.mark.extended)])
def test_sigkill_or_resume_with_cut_epochs_gives_the_uninterrupted_counts(demo_dir: Path, tmp_path: Path,
                                                                          kill_at: int) -> None:
    """Epochs cut at 5 of 12 batches (limit_train_batches, as the README's resume test runs): killed
    at the first step of epoch 1 (the last checkpoint is the cut) or mid-epoch, the resumed run
    trains on the same batches and ends with the uninterrupted run's counts (it kept epoch 0's)."""
    cut = ("--limit-train-batches", "5")
    straight = _run(tmp_path / "straight" / "run", demo_dir, 0, *cut)
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = _run(tmp_path / "killed" / "run", demo_dir, 0, *cut, "--kill-at", str(kill_at))
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = _run(tmp_path / "killed" / "resumed", demo_dir, 0, *cut, "--ckpt",
                   str(tmp_path / "killed" / "ckpt" / "last.ckpt"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want, got = read_steps(tmp_path / "straight" / "run"), read_steps(tmp_path / "killed" / "resumed")
    assert min(got) == kill_at and max(got) == max(want) == 9
    key = ("epoch", "batch_idx", "image_ids", "images", "masks", "ignore")
    for step in got:
        assert [got[step][k] for k in key] == [want[step][k] for k in key], step
    counts = [read_counts(tmp_path / d) for d in ("straight/run", "killed/resumed")]
    assert counts[0] == counts[1] and counts[0]["kept"] > 0


@pytest.mark.slow
@pytest.mark.extended  # resume with the group steps; the default tier resumes the plain recipe
def test_sigkill_then_resume_with_copy_paste_and_mixup_sees_the_same_batches(demo_dir: Path, tmp_path: Path) -> None:
    """The same with copy-paste (from the batch) and MixUp on, 2 workers: mixing draws come from
    each sample's own generator, so the resumed run trains on bit-identical batches and counts."""
    mix = ("--copy-paste", "0.5", "--mixup", "0.5")
    straight = _run(tmp_path / "straight" / "run", demo_dir, 2, *mix)
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = _run(tmp_path / "killed" / "run", demo_dir, 2, *mix, "--kill-at", "7")
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = _run(tmp_path / "killed" / "resumed", demo_dir, 2, *mix, "--ckpt", str(tmp_path / "killed" / "ckpt" / "last.ckpt"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want, got = read_steps(tmp_path / "straight" / "run"), read_steps(tmp_path / "killed" / "resumed")
    assert min(got) == 7 and max(got) == max(want) and len(want) > 7 + 5
    key = ("epoch", "batch_idx", "image_ids", "images", "masks", "ignore")
    for step in got:
        assert [got[step][k] for k in key] == [want[step][k] for k in key], step
    counts = [read_counts(tmp_path / d) for d in ("straight/run", "killed/resumed")]
    assert counts[0] == counts[1] and counts[0]["pasted"] > 0 and counts[0]["mixed_in"] > 0


@pytest.mark.slow
@pytest.mark.extended  # DDP resume; the default tier runs DDP in test_datamodule.py and resume at 0 workers
def test_sigkill_under_ddp_then_resume_gives_each_rank_its_batches(demo_dir: Path, tmp_path: Path) -> None:
    """DDP on two CPU processes, both killed at step 3 of an epoch of 6: each rank resumes its own
    shard at the right batch, and each rank's counts match the uninterrupted run's."""
    ddp = ("--devices", "2")
    assert _run(tmp_path / "straight" / "run", demo_dir, 0, *ddp).returncode == 0
    killed = _run(tmp_path / "killed" / "run", demo_dir, 0, *ddp, "--kill-at", "3")
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = _run(tmp_path / "killed" / "resumed", demo_dir, 0, *ddp, "--ckpt",
                   str(tmp_path / "killed" / "ckpt" / "last.ckpt"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    key = ("epoch", "batch_idx", "image_ids", "images", "masks", "ignore")
    for rank in (0, 1):
        want, got = read_steps(tmp_path / "straight" / "run", rank), read_steps(tmp_path / "killed" / "resumed", rank)
        assert min(got) == 3 and max(got) == max(want) == 11
        for step in got:
            assert [got[step][k] for k in key] == [want[step][k] for k in key], (rank, step)
        assert read_counts(tmp_path / "killed" / "resumed", rank) == read_counts(tmp_path / "straight" / "run", rank)
    shards = [{i for r in read_steps(tmp_path / "straight" / "run", rank).values() if r["epoch"] == 0
               for i in r["image_ids"]} for rank in (0, 1)]
    assert not shards[0] & shards[1]
