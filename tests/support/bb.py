"""What the burst-buffer tests measure on disk (bytes under a tree, sampled every 100 ms) and
write (seeded writers of closed files and the digests they must leave; checkpoints larger than
the buffer; a writer that counts what was acknowledged), for both shims."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from support import wait_until

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


def checkpoint_source(path: Path, mib: int, seed: int) -> str:
    """Writes ``mib`` MiB of distinct seeded blocks to ``path`` (a checkpoint to copy with
    dd); their sha256."""
    h = hashlib.sha256()
    base = hashlib.sha256(str(seed).encode()).digest() * (MiB // 32)
    with open(path, "wb") as f:
        for n in range(mib):
            block = n.to_bytes(8, "little") + base[8:]
            h.update(block)
            f.write(block)
    return h.hexdigest()


def wait_checkpoints(
    writers: list[subprocess.Popen[str]],
    pfs: Path,
    files: list[int],
    buffer: Path,
    why: Callable[[], str] = str,
) -> None:
    """Waits for the writers of ``jobN/fN`` (``files``: MiB each) to exit 0, then for every
    file on ``pfs`` at its size and the ``buffer`` empty (evicted); ``why()`` says more when
    a writer is still running at its deadline."""
    deadline = 60 + sum(files) / 20
    for n, proc in enumerate(writers):
        try:
            _, err = proc.communicate(timeout=deadline)
        except subprocess.TimeoutExpired:
            err = "still running; " + why()
        assert proc.returncode == 0, f"writer {n} failed: {err}"
    wait_until(
        lambda: all_copied_each(pfs, {f"job{n}/f{n}": mib * MiB for n, mib in enumerate(files)}),
        deadline,
        message="every file on the PFS",
    )
    wait_until(lambda: tree_bytes(buffer) < MiB, 60, message="the buffer to empty")


def all_copied_each(pfs: Path, sizes: dict[str, int]) -> bool:
    """Whether every file (relative path → size) is on ``pfs`` with its size."""
    return all(all_copied(pfs, [rel], size) for rel, size in sizes.items())


# Writes N MiB (argv[2]) to argv[1] and says how many the shim acknowledged, one line per write.
COUNTING_WRITER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for n in range(int(sys.argv[2])):
    try:
        os.write(fd, n.to_bytes(8, "little") * (1 << 17))
    except OSError:  # the mount went away under it
        sys.exit(3)
    print(n + 1, flush=True)
os.fsync(fd)
os.close(fd)
"""


def counted_block(n: int) -> bytes:
    """The ``n``-th MiB `COUNTING_WRITER` writes."""
    return n.to_bytes(8, "little") * (1 << 17)
