"""What the burst-buffer tests measure on disk (bytes under a tree, sampled every 100 ms) and
write (seeded writers of closed files and the digests they must leave), for both shims."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import threading
import time
from pathlib import Path

MiB = 1 << 20

# A writer: FILES files of MIB MiB of seeded pseudo-random bytes, 1 MiB per write, each closed
# (argv: DIRECTORY SEED FILES MIB).
WRITER = """
import random, sys
directory, seed, files, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
for n in range(files):
    with open(f"{directory}/f{n:02d}", "wb") as f:
        for _ in range(mib):
            f.write(rng.randbytes(1 << 20))
"""


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


def expected_digests(seed: int, files: int, mib: int) -> list[str]:
    """sha256 of each file `WRITER` with ``seed`` writes, in order."""
    rng = random.Random(seed)
    digests = []
    for _ in range(files):
        h = hashlib.sha256()
        for _ in range(mib):
            h.update(rng.randbytes(MiB))
        digests.append(h.hexdigest())
    return digests


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MiB):
            h.update(chunk)
    return h.hexdigest()


def all_copied(pfs: Path, rels: list[str], size: int) -> bool:
    """Whether every file ``rels`` (relative paths) is on ``pfs`` with ``size`` bytes."""
    for rel in rels:
        try:
            if (pfs / rel).stat().st_size != size:
                return False
        except FileNotFoundError:
            return False
    return True
