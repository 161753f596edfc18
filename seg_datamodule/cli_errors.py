"""How the command line shows a user's mistake: one line, exit code 2, the traceback on request.

A mistake in what the user gave (a path, a key, a file's content, the machine's limits) is a
:class:`~seg_datamodule.errors.UserInputError`; the CLI prints it as one line naming the error
and exits 2, as argparse does for a bad option. A parse error (an unknown key in the YAML or on
the command line, a value of the wrong type) is one line too, with the closest key when there is
one, instead of jsonargparse's full usage. ``SEG_DATAMODULE_TRACEBACK=1`` (each line names it)
brings back the full traceback and usage. Anything else is a bug and keeps its traceback.

An error raised in a DataLoader worker reaches the main process re-raised by torch with the
worker's whole traceback as its message (or, when the type cannot be rebuilt from a message, as
a ``RuntimeError``); :func:`user_error_line` recovers the original type and message.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from typing import Any, NoReturn

from lightning.pytorch.cli import LightningArgumentParser

from seg_datamodule.errors import UserInputError

__all__ = ["TRACEBACK_ENV", "OneLineParser", "close_key", "one_line", "traceback_requested", "user_error_line",
           "user_error_message"]

#: Set to ``1`` for the full traceback (and jsonargparse's usage) instead of the one-line error.
TRACEBACK_ENV = "SEG_DATAMODULE_TRACEBACK"
#: A one-line message is cut after this many characters (jsonargparse lists every subclass it tried).
MAX_CHARS = 500

_WORKER = re.compile(r"\ACaught (?P<type>\w+) in DataLoader worker process \d+\.\s*\n"
                     r"Original Traceback \(most recent call last\):\n")
_QUALIFIED = re.compile(r"\A(?:[A-Za-z_]\w*\.)*(?P<type>[A-Za-z_]\w*): ")
_KEY = re.compile(r"(?:option|key|argument)s?:? '(?:--)?(?P<quoted>[\w.\-]+)'|--(?P<flag>[\w.\-]+)", re.I)


def traceback_requested() -> bool:
    """True when :data:`TRACEBACK_ENV` asks for the full traceback."""
    return os.environ.get(TRACEBACK_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) as one space, cut at :data:`MAX_CHARS`."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= MAX_CHARS else flat[:MAX_CHARS - 4].rstrip() + " ..."


def close_key(message: str, keys: set[str]) -> str | None:
    """The known key closest to one the message names and that is not known (a typo), if any.

    Args:
        message: a parse error, e.g. ``"Subcommand 'fit' does not accept option 'data.trian_ann'"``
            or ``"unrecognized arguments: --data.trian_ann x"``.
        keys: the keys the parser knows, without dashes (``"data.train_ann"``).
    """
    for match in _KEY.finditer(message):
        name = match["quoted"] or match["flag"]
        if not name or name in keys:
            continue
        found = difflib.get_close_matches(name, sorted(keys), n=1, cutoff=0.8)
        if found:
            return found[0]
    return None


def _parser_keys(parser: argparse.ArgumentParser) -> set[str]:
    """Every option the parser and its subcommands' parsers know, without the leading dashes."""
    keys: set[str] = set()
    for action in parser._actions:  # argparse's list of the parser's actions
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                keys |= _parser_keys(sub)
        keys.update(option.lstrip("-") for option in action.option_strings if option.startswith("--"))
    return keys


class OneLineParser(LightningArgumentParser):
    """LightningCLI's parser, printing a parse error as one line (with the closest key) and exiting 2."""

    def error(self, message: str, *args: Any, **kwargs: Any) -> NoReturn:  # type: ignore[override]
        # ``ex`` (the exception, which knows the subcommand's parser) is jsonargparse's second argument.
        if traceback_requested() or not getattr(self, "exit_on_error", True):
            super().error(message, *args, **kwargs)
        ex = args[0] if args else kwargs.get("ex")
        prog = self.prog.replace(" [options]", "")
        key = close_key(message, _parser_keys(self) | _parser_keys(getattr(ex, "subcommand_parser", None) or self))
        hint = f" (did you mean '{key}'?)" if key else ""
        sys.stderr.write(f"{prog}: error: {one_line(message)}{hint}; --help lists the keys, "
                         f"{TRACEBACK_ENV}=1 prints the full usage\n")
        self.exit(2)


def _user_error_types() -> dict[str, type]:
    found: dict[str, type] = {}
    pending: list[type] = [UserInputError]
    while pending:
        cls = pending.pop()
        found[cls.__name__] = cls
        pending.extend(cls.__subclasses__())
    return found


def _worker_original(text: str) -> tuple[str, str] | None:
    """``(type name, message)`` of the exception a DataLoader worker raised, from torch's re-raised text."""
    match = _WORKER.match(text)
    if match is None:
        return None
    lines = text[match.end():].splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    start = frames[-1] + 1 if frames else 0
    while start < len(lines) and lines[start].startswith("    "):  # the frame's code line and its carets
        start += 1
    original = "\n".join(lines[start:]).strip()
    qualified = _QUALIFIED.match(original)
    if qualified is None:
        return match["type"], original
    return qualified["type"], original[qualified.end():]


def user_error_line(exc: BaseException) -> str | None:
    """The one line the CLI prints for a user's mistake, or ``None`` for anything else (a bug).

    A :class:`~seg_datamodule.errors.UserInputError` gives ``"<Type>: <message>"`` with the
    message on one line, also where a library re-raised it as the cause of its own error
    (jsonargparse's argument links); one re-raised from a DataLoader worker gives the worker's
    original type and message.
    """
    # jsonargparse wraps what a link's function raised (``raise ValueError(...) from ex``)
    while not isinstance(exc, UserInputError) and isinstance(exc.__cause__, UserInputError):
        exc = exc.__cause__
    original = _worker_original(str(exc)) if isinstance(exc, Exception) else None
    if isinstance(exc, UserInputError):
        name, message = original if original is not None else (type(exc).__name__, str(exc))
    elif original is not None and original[0] in _user_error_types():  # torch could not rebuild the type
        name, message = original
    else:
        return None
    return f"{name}: {one_line(message)}"


def user_error_message(prog: str, exc: BaseException) -> str | None:
    """What the CLI prints for ``exc`` (one line, naming :data:`TRACEBACK_ENV`), or ``None``.

    ``None`` means: re-raise it with its traceback (a bug, or a traceback asked for).
    """
    line = None if traceback_requested() else user_error_line(exc)
    return None if line is None else f"{prog}: error: {line} ({TRACEBACK_ENV}=1 prints the traceback)"
