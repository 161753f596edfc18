"""Print the README's quick-start commands, one per line, exactly as the README shows them.

``.ci/run`` runs what this prints, in a fresh clone with nothing beside it, so CI runs the
commands a new user copies, not a copy of them: a change to the README's quick start changes
what CI runs. The commands are the non-comment lines of the first ```` ```bash ```` block under
``## Quick start``; a line ending in a backslash continues on the next. ``tests/test_readme.py``
checks that these are the quick start's install and test commands.

Usage: ``python3 .ci/readme_commands.py [README.md]`` (standard library only: it runs before any
install).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

SECTION = "## Quick start"


def quick_start_commands(readme: str) -> list[str]:
    """The commands of the first bash block under :data:`SECTION`, continuations joined.

    Raises:
        ValueError: no such section, or no bash block in it, or a block without a command.
    """
    lines = readme.splitlines()
    try:
        start = lines.index(SECTION)
    except ValueError:
        raise ValueError(f"README.md has no line {SECTION!r}") from None
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    fence = next((i for i in range(start + 1, end) if re.fullmatch(r"```(bash|sh)\s*", lines[i])), None)
    if fence is None:
        raise ValueError(f"README.md: no ```bash block under {SECTION!r}")
    close = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
    code = re.sub(r"\\\n\s*", "", "\n".join(lines[fence + 1:close]))
    commands = [line.strip() for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not commands:
        raise ValueError(f"README.md: the bash block under {SECTION!r} has no command")
    return commands


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "README.md"
    print("\n".join(quick_start_commands(path.read_text())))
