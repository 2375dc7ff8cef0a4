"""Workloads of the burst buffer's tests, for both shims: seeded writers of closed files, the
digests they must leave, and what a directory holds on disk."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
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


def tree_bytes(root: Path, allocated: bool) -> int:
    """Σ st_blocks · 512 (``allocated``) or Σ st_size of the files under ``root``."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # renamed or removed meanwhile
                st = os.lstat(os.path.join(dirpath, name))
                total += st.st_blocks * 512 if allocated else st.st_size
    return total


def all_copied(pfs: Path, rels: list[str], size: int) -> bool:
    """Whether every file ``rels`` (relative paths) is on ``pfs`` with ``size`` bytes."""
    for rel in rels:
        try:
            if (pfs / rel).stat().st_size != size:
                return False
        except FileNotFoundError:
            return False
    return True
