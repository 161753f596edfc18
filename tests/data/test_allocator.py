"""Freed canvases kept in the loading process (glibc): fewer page faults, set where samples are
built (workers, or the main process with no workers), never over the user's own settings.

Each case runs in a fresh interpreter: the setting is per process and cannot be undone."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from seg_datamodule.data.batching.allocator import _user_tunes_malloc

ROOT = Path(__file__).resolve().parents[2]
glibc_only = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="the thresholds are glibc's")


def run_python(code: str, **env: str) -> dict:
    """Run ``code`` in a fresh interpreter (without the caller's malloc settings); its last
    stdout line is JSON."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    clean |= {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), clean.get("PYTHONPATH", "")]), **env}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=clean, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# The module alone (no package import: it needs none), so each fresh interpreter starts in a blink.
FAULTS = """
import importlib.util, json, resource
import numpy as np
spec = importlib.util.spec_from_file_location("allocator", "MODULE")
allocator = importlib.util.module_from_spec(spec)
spec.loader.exec_module(allocator)
freed_memory_kept, keep_freed_memory = allocator.freed_memory_kept, allocator.keep_freed_memory

def faults_per_canvas():
    # A batch's worth of canvases held, then freed together; the last of four rounds (steady state).
    held = []
    for _ in range(4):
        start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        held = [np.full((640, 640, 3), 114, np.uint8) for _ in range(32)]
        held.clear()
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / 32
    return faults

before, was_kept = faults_per_canvas(), freed_memory_kept()
set_now = keep_freed_memory()
print(json.dumps({"before": before, "was_kept": was_kept, "set": set_now, "again": keep_freed_memory(),
                  "after": faults_per_canvas()}))
""".replace("MODULE", str(ROOT / "seg_datamodule/data/batching/allocator.py"))


@glibc_only
def test_kept_canvases_stop_faulting_in_fresh_pages() -> None:
    out = run_python(FAULTS)
    assert out["was_kept"] is False and out["set"] is True and out["again"] is True
    # glibc's default maps and zero-fills each 1.2 MiB canvas anew (about 290 faults here); kept,
    # the next batch reuses the pages.
    assert out["after"] <= max(2.0, out["before"] / 10), out


@glibc_only
@pytest.mark.parametrize("env", [{"MALLOC_TRIM_THRESHOLD_": "131072"}, {"MALLOC_MMAP_THRESHOLD_": "65536"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"}])
def test_the_users_own_allocator_settings_are_left_alone(env: dict[str, str]) -> None:
    out = run_python(FAULTS, **env)
    assert out["set"] is False and out["again"] is False


def test_which_environments_tune_malloc_already() -> None:
    assert not _user_tunes_malloc({})
    assert not _user_tunes_malloc({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F"})
    assert _user_tunes_malloc({"GLIBC_TUNABLES": "glibc.cpu.x=1:glibc.malloc.mmap_threshold=65536"})
    assert _user_tunes_malloc({"MALLOC_TRIM_THRESHOLD_": "0"})


@glibc_only
def test_set_in_workers_and_in_a_main_process_that_builds_the_samples(coco_mini: Path) -> None:
    out = run_python(f"""
        import json
        from torch.utils.data import DataLoader, Dataset
        from seg_datamodule.data.batching.allocator import freed_memory_kept
        from seg_datamodule.data.loaders.arguments import worker_init_fn
        from seg_datamodule import COCOSegDataModule

        class Probe(Dataset):
            def __len__(self):
                return 2
            def __getitem__(self, i):
                return freed_memory_kept()

        # A forked worker starts with the main process's state (not set yet): worker_init_fn sets it.
        in_worker = [bool(x) for x in DataLoader(Probe(), num_workers=1, worker_init_fn=worker_init_fn,
                                                 multiprocessing_context="fork")]
        main_after_workers = freed_memory_kept()
        root = {str(coco_mini)!r}
        dm = COCOSegDataModule(train_ann=root + "/annotations/instances_train2017.json",
                               train_images=root + "/train2017", image_size=128, batch_size=2, num_workers=0)
        dm.setup("fit")
        dm.train_dataloader()
        print(json.dumps({{"in_worker": in_worker, "main_after_workers": main_after_workers,
                           "main_after_zero_workers": freed_memory_kept()}}))
    """)
    assert out == {"in_worker": [True, True], "main_after_workers": False, "main_after_zero_workers": True}
