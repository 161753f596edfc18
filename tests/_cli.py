"""Several ``seg-datamodule`` commands in one new interpreter, each with its own exit code and output.

A CLI process spends about 6 s importing Lightning, torchmetrics and torchvision before it does
anything; a test that runs fit, then validate, test and predict from its checkpoint, paid that
four times. :func:`run_commands` starts one interpreter that runs each command through
``seg_datamodule.cli.main`` in turn, as the console script does (a user's mistake exits 2 with
one line on stderr; that exit is caught and the next command runs), and splits the output back
per command. What a separate process would isolate (the working folder, the environment, the
warning filters) is the same for every command of one call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Ran", "run_commands"]

ROOT = Path(__file__).resolve().parents[1]
_MARK = "\x1e== seg-datamodule command "
_END = "\x1e== exit "

#: Runs ``json.loads(sys.argv[1])``'s argument lists in order; around each, a mark on both streams.
_DRIVER = f"""
import json, sys, traceback
from seg_datamodule.cli import main
commands = json.loads(sys.argv.pop(1))  # LightningCLI warns when sys.argv holds other arguments
for k, args in enumerate(commands):
    for stream in (sys.stdout, sys.stderr):
        print({_MARK!r} + str(k), file=stream, flush=True)
    code = 0
    try:
        main(args)
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        print({_END!r} + str(code), file=stream, flush=True)
    if code not in (0, 2):  # a crash, not a user's mistake: what follows would only cascade
        break
"""


@dataclass
class Ran:
    """One command's exit code and output."""

    args: list[str]
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def _split(text: str, count: int) -> list[tuple[str, int | None]]:
    parts: list[tuple[str, int | None]] = []
    for chunk in text.split(_MARK)[1:count + 1]:
        body, _, tail = chunk.partition(_END)
        body = body.split("\n", 1)[1] if "\n" in body else ""
        parts.append((body, int(tail.split()[0]) if tail.strip() else None))
    return parts


def run_commands(commands: list[list[str]], cwd: Path, *, flags: list[str] | None = None,
                 env: dict[str, str] | None = None, timeout: float = 900) -> list[Ran]:
    """Run ``commands`` (each the arguments after ``seg-datamodule``) in one interpreter, in order.

    Args:
        commands: the argument lists.
        cwd: the working folder of all of them.
        flags: Python options for the interpreter (``WARNINGS_AS_ERRORS``).
        env: the environment (default: this one); the checkout's root is put first on ``PYTHONPATH``.
        timeout: seconds for all of them.

    Returns:
        one :class:`Ran` per command that started (a crash, exit code other than 0 or 2, ends the
        run: later commands are missing, and a missing exit code is the interpreter's).
    """
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, *(flags or []), "-c", _DRIVER, json.dumps(commands)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    outs, errs = _split(proc.stdout, len(commands)), _split(proc.stderr, len(commands))
    if not outs:  # the interpreter failed before the first command
        return [Ran(commands[0], proc.returncode, proc.stdout, proc.stderr)]
    return [Ran(args, code if code is not None else proc.returncode, out, err)
            for args, (out, code), (err, _) in zip(commands, outs, errs)]
