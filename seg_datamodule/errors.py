"""The base of every error that a user's input, files or environment can cause.

Each such error names what was wrong (the file, the image id, the annotation id, the key) and
what was expected, so the CLI can print it as one line instead of a traceback. Bugs are not
``UserInputError``: they keep their traceback.
"""

from __future__ import annotations

__all__ = ["UserInputError"]


class UserInputError(Exception):
    """A mistake in what the user gave (a path, a file's content, a key, the machine's limits).

    Subclasses also derive from the builtin type a caller would catch (``ValueError``,
    ``OSError``, ``RuntimeError``), so ``except ValueError`` keeps working.
    """
