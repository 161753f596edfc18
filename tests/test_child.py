"""``tests/_child.py``: the resume tests' runner returns what the child did, and a hang fails with its stacks."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _child import group_members, run_child

# A child as the resume scripts are: faulthandler on SIGUSR1, then what argv[1] says.
_CHILD = """
import faulthandler, multiprocessing, os, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)

def waits_in_the_worker():
    time.sleep(600)

def waits_in_the_trainer():
    time.sleep(600)

if __name__ == "__main__":
    what = sys.argv[1]
    print("out", flush=True)
    print("err", file=sys.stderr, flush=True)
    if what == "hang":
        waits_in_the_trainer()
    elif what == "orphan":  # a forked worker outlives its killed parent, as a DataLoader worker can
        multiprocessing.get_context("fork").Process(target=waits_in_the_worker, daemon=False).start()
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    elif what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(3)
"""


def _argv(what: str, folder: Path) -> list[str]:
    (folder / "child.py").write_text(_CHILD)
    return [sys.executable, str(folder / "child.py"), what]


def test_a_run_gives_its_code_and_output_and_leaves_nothing(tmp_path: Path) -> None:
    done = run_child(_argv("exit", tmp_path), dict(os.environ), tmp_path / "logs")
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    killed = run_child(_argv("kill", tmp_path), dict(os.environ), tmp_path / "killed")
    assert (killed.returncode, killed.stdout) == (-9, "out\n")


def test_a_run_past_its_time_fails_with_its_stack_and_is_killed(tmp_path: Path) -> None:
    began = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as failed:
        run_child(_argv("hang", tmp_path), dict(os.environ), tmp_path / "logs", timeout_s=3.0)
    message = str(failed.value)
    assert message.startswith(f"{sys.executable} {tmp_path / 'child.py'} hang ran past 3 s; its processes:\n")
    assert 'in waits_in_the_trainer' in message and "Current thread" in message
    assert time.monotonic() - began < 30


def test_a_worker_that_outlives_its_killed_trainer_fails_with_its_stack(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        run_child(_argv("orphan", tmp_path), dict(os.environ), tmp_path / "logs", linger_s=2.0)
    message = str(failed.value)
    assert f"{tmp_path / 'child.py'} orphan ended (-9) but 1 of its processes were still there 2 s later:\n" in message
    assert "in waits_in_the_worker" in message and "in waits_in_the_trainer" not in message
    pid = int(message.split("later:\n")[1].split()[0])
    assert any(_alive(pid) is False for _ in _tries(50))  # the group was killed, the worker with it


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _tries(n: int) -> Iterator[None]:
    for _ in range(n):
        yield
        time.sleep(0.1)
