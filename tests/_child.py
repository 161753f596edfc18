"""``run_child``: a training script in its own process group, bounded, with its stacks when it hangs.

The resume tests SIGKILL a training run mid-fit (``_resume_run.py``, ``io/_stream_run.py``) and
run it again. ``subprocess.run(capture_output=True)`` waits for its pipes to close, and a killed
trainer's DataLoader workers inherit them: a worker that outlived its trainer, or a run that hung
before its kill, held the test until pytest's timeout with nothing but the test's own stack (CI
at ``25f682c``, once in many runs). Here the child writes to files, not pipes; it runs in a new
session, so every process it starts (workers, DDP ranks) is in one group; the scripts register
``faulthandler`` on SIGUSR1 (:data:`STACKS_SIGNAL`), which forked workers inherit. A run past its
time, or processes left in the group ``linger_s`` after the child ended, fail the test with every
thread's stack of every process left, after which the group is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

__all__ = ["STACKS_SIGNAL", "group_members", "run_child"]

#: The signal on which ``_resume_run.py`` and ``io/_stream_run.py`` print every thread's stack.
STACKS_SIGNAL = signal.SIGUSR1


def group_members(pgid: int) -> list[str]:
    """``pid state command`` of each live process in group ``pgid`` (read from /proc; zombies left out)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # ended while read
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(f"{entry.name} {fields[0]} {cmd[:160]}")
    return members


def _stacks_then_kill(pgid: int, err: Path) -> str:
    """Every thread's stack of each process in the group (in ``err``), then the group killed."""
    before = err.stat().st_size if err.exists() else 0
    for line in group_members(pgid):
        try:
            os.kill(int(line.split()[0]), STACKS_SIGNAL)
        except ProcessLookupError:
            pass
    time.sleep(2.0)  # faulthandler writes from the signal handler; give each process a moment
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    with err.open("rb") as f:
        f.seek(before)
        return f.read().decode(errors="replace")[-20000:]


def run_child(argv: list[str], env: dict[str, str], logs: Path, timeout_s: float = 300.0,
              linger_s: float = 60.0) -> subprocess.CompletedProcess:
    """Run ``argv`` to its end; its output, as ``subprocess.run(capture_output=True, text=True)`` gives it.

    Args:
        argv: the command.
        env: its environment.
        logs: a folder for ``<logs>/stdout.txt`` and ``<logs>/stderr.txt`` (created).
        timeout_s: seconds the child may run.
        linger_s: seconds its processes (DataLoader workers, DDP ranks) may outlive it.

    Returns:
        The child's return code (-9 for a SIGKILL) and output.

    Raises:
        pytest.fail.Exception: the child ran past ``timeout_s`` or left processes behind; the
            message holds their command lines and every thread's stack.
    """
    logs.mkdir(parents=True, exist_ok=True)
    out, err = logs / "stdout.txt", logs / "stderr.txt"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        child = subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr, start_new_session=True)
    try:
        child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        members = group_members(child.pid)
        stacks = _stacks_then_kill(child.pid, err)
        child.wait()
        pytest.fail(f"{' '.join(argv)} ran past {timeout_s:.0f} s; its processes:\n" + "\n".join(members)
                    + f"\ntheir stacks:\n{stacks}", pytrace=False)
    deadline = time.monotonic() + linger_s
    while (left := group_members(child.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        stacks = _stacks_then_kill(child.pid, err)
        pytest.fail(f"{' '.join(argv)} ended ({child.returncode}) but {len(left)} of its processes were still there "
                    f"{linger_s:.0f} s later:\n" + "\n".join(left) + f"\ntheir stacks:\n{stacks}", pytrace=False)
    return subprocess.CompletedProcess(argv, child.returncode, out.read_text(errors="replace"),
                                       err.read_text(errors="replace"))
