"""A writer process to kill while it waits in a shim, and the checks after: it is gone within
1 s of the signal, and every block it was told was written is intact (tests of interrupted
waits, tests/integration/fuse/test_mount_interrupts.py and preload/test_preload_interrupts.py)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

MiB = 1 << 20

# Writes 1 MiB blocks (block i all bytes i % 251) to argv[1] until killed, printing the count
# of blocks acknowledged after each.
WRITER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
i = 0
while True:
    os.write(fd, bytes([i % 251]) * (1 << 20))
    i += 1
    print(i, flush=True)
"""


def kill_within_a_second(writer: subprocess.Popen[str], sig: int) -> int:
    """Sends ``sig`` to a `WRITER` (started with ``stdout=PIPE``); asserts it died of it within
    1 s; returns how many blocks it was told were written."""
    sent = time.monotonic()
    writer.send_signal(sig)
    try:
        writer.wait(5)
    except subprocess.TimeoutExpired:
        writer.kill()
        writer.wait()
        raise AssertionError(f"the writer outlived signal {sig} by 5 s") from None
    took = time.monotonic() - sent
    assert writer.returncode == -sig
    assert took < 1.0, f"the writer took {took:.2f} s to die of signal {sig}"
    assert writer.stdout is not None
    with writer.stdout:
        lines = writer.stdout.read().split()
    return int(lines[-1]) if lines else 0


def assert_written(path: Path, blocks: int) -> None:
    """The first ``blocks`` blocks of a `WRITER`'s file are intact."""
    with open(path, "rb") as f:
        for i in range(blocks):
            assert f.read(MiB) == bytes([i % 251]) * MiB, f"block {i} of {path}"
