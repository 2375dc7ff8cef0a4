"""What the burst-buffer tests measure on disk: bytes under a tree, sampled every 100 ms."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path


def tree_bytes(root: Path, allocated: bool = True) -> int:
    """Σ st_blocks · 512 (``allocated``) or Σ st_size of the files under ``root``."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # renamed or removed meanwhile
                st = os.lstat(os.path.join(dirpath, name))
                total += st.st_blocks * 512 if allocated else st.st_size
    return total


class Sampler(threading.Thread):
    """(time, bytes allocated under ``backing``, bytes of the files under ``pfs``) every
    100 ms until ``halt`` is set (0 for the PFS when there is none)."""

    def __init__(self, backing: Path, pfs: Path | None = None) -> None:
        super().__init__(daemon=True)
        self.backing, self.pfs = backing, pfs
        self.samples: list[tuple[float, int, int]] = []
        self.halt = threading.Event()

    @property
    def used(self) -> list[int]:
        return [used for _, used, _ in self.samples]

    def run(self) -> None:
        while not self.halt.wait(0.1):
            on_pfs = 0 if self.pfs is None else tree_bytes(self.pfs, False)
            self.samples.append((time.monotonic(), tree_bytes(self.backing), on_pfs))
