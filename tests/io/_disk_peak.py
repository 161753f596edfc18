"""The most bytes of chunk files in a cache folder at once, sampled from a thread (tests and benchmarks)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["DiskPeak"]


class DiskPeak:
    """The most bytes of LitData chunk files (partial downloads too) under ``folder`` at once.

    A context manager: a thread sums the sizes every ``every_s`` seconds while the block runs;
    :attr:`peak` is the largest sum seen (so a peak shorter than a sample can be missed: a floor).

    Args:
        folder: the cache folder (searched recursively: LitData nests a folder per dataset).
        every_s: seconds between samples.
    """

    def __init__(self, folder: Path, every_s: float = 0.01) -> None:
        self.folder, self.every_s, self.peak = Path(folder), every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def size(self) -> int:
        """Bytes of chunk files under the folder now (``chunk-*``, not the counts and locks beside them)."""
        total = 0
        for root, _, names in os.walk(self.folder):
            for name in names:
                if name.startswith("chunk-") and ".cnt" not in name and not name.endswith(".lock"):
                    try:
                        total += os.stat(os.path.join(root, name)).st_size
                    except FileNotFoundError:  # deleted or renamed as it was listed
                        pass
        return total

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, self.size())
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> "DiskPeak":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
