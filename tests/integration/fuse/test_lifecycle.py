"""The mount's lifecycle under trouble: its controller dies mid-write; it is told to stop.

- Controller down while fio writes: a mount at a controller (B = 40 MiB/s, lease 1 s) with
  ``--fallback fixed:8MiB/s``; fio writes two files with crc32c verify headers; once 48 MiB
  are on the backing store the controller is killed (SIGKILL, by pid). fio must finish
  without an error, the pace after the lease must be the fallback rate (measured from fio's
  per-I/O log), and every block must verify when read back directly from the backing store.
- SIGTERM with open files: a child process holds files open on the mount, has written and
  fsynced data and written more; SIGTERM to the mount (by pid) must detach it from the
  namespace at once (lazily: nothing stale is left mounted) with every fsynced byte already in
  the backing files. The open files keep working until the child closes them; then the mount's
  process exits 0 and nothing the child wrote is lost (docs/fuse.md: the daemon exits after the
  last close).
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fio_tools import LOGGED, FioProcess, MiB, job_file, rate, run_fio, span
from support import is_mounted, wait_until

pytestmark = pytest.mark.integration

LEASE = 1.0  # s: the controller's allocation lease, after which the fallback applies
CAPACITY = 40 * MiB
FALLBACK = 8 * MiB


def verify_job(directory: Path, processes: int, size: int, **extra: object) -> str:
    """Sequential 1 MiB writes, each block with a crc32c header (offset, length, checksum)."""
    options = {
        "directory": str(directory),
        "filename_format": "part.$jobnum",
        "numjobs": processes,
        "size": size,
        "bs": "1M",
        "rw": "write",
        "fallocate": "none",
        "verify": "crc32c",
        **extra,
    }
    return job_file(LOGGED, [("verified", options)])


def on_disk(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("part.*"))


def test_controller_down_while_fio_writes_falls_back_and_keeps_data(
    controller_factory, fuse_mount, fuse_dirs, tmp_path: Path
) -> None:
    controller = controller_factory(
        "--capacity", "40MiB/s", "--node-bandwidth", "1GiB/s", env={"BURSTCTL_LEASE": str(LEASE)}
    )
    backing, mountpoint = fuse_dirs
    fuse_mount(
        backing, mountpoint, "--controller", controller.address, "--fallback", "fixed:8MiB/s"
    )
    (mountpoint / "data").mkdir()
    processes, size = 2, 64 * MiB
    fio = FioProcess(
        tmp_path / "fio-write",
        verify_job(mountpoint / "data", processes, size, do_verify=0),
        env={"SLURM_JOB_ID": "writer", "SLURM_NNODES": "1"},
    )
    try:
        wait_until(
            lambda: on_disk(backing / "data") >= 48 * MiB, timeout=30, message="48 MiB written"
        )
        controller.stop(signal.SIGKILL)
        down = time.time()  # fio's logs are on the epoch clock
        run = fio.wait(timeout=60)
    finally:
        fio.stop()

    assert not run.errors(), run.errors()
    assert run.moved("write") == processes * size
    first, last = span(run.ios)
    before = rate(run.ios, first + 0.5, down)
    after = rate(run.ios, down + LEASE + 0.5, last)
    print({"before_mib_s": before / MiB, "after_mib_s": after / MiB})
    assert last - (down + LEASE + 0.5) >= 2.0, "too little written after the lease to measure"
    # Before: the controller's rate, never above B; above the fallback, which a loaded machine
    # cannot fake (how close it comes to B is the machine's, not the mount's).
    assert 1.25 * FALLBACK <= before <= 1.1 * CAPACITY
    assert 0.8 * FALLBACK <= after <= 1.1 * FALLBACK

    # Every block, read straight from the backing store, carries its own offset and checksum.
    check = run_fio(
        tmp_path / "fio-verify",
        verify_job(backing / "data", processes, size, verify_only=1),
        timeout=60,
    )
    assert not check.errors(), check.errors()
    assert check.moved("read") == processes * size


# The application: writes and fsyncs SYNCED bytes to each file, writes UNSYNCED more, says
# "ready", then on any input writes LATE bytes, closes and reports what each step raised.
HOLDER = r"""
import os, random, sys
names, synced, unsynced = sys.argv[1:-2], int(sys.argv[-2]), int(sys.argv[-1])
files = [open(n, "wb", buffering=0) for n in names]
for i, f in enumerate(files):
    f.write(random.Random(i).randbytes(synced))
    os.fsync(f.fileno())
for f in files:
    f.write(b"u" * unsynced)
print("ready", flush=True)
sys.stdin.readline()
outcome = []
for f in files:
    for step in (lambda: f.write(b"late"), f.close):
        try:
            step()
            outcome.append("ok")
        except OSError as err:
            outcome.append(type(err).__name__ + ":" + str(err.errno))
print(" ".join(outcome), flush=True)
"""


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The child's next stdout line, failing the test if none comes within ``timeout``."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no answer from the child within {timeout} s"
    return proc.stdout.readline().strip()


def test_sigterm_unmounts_with_open_files_and_keeps_fsynced_data(
    controller_factory, fuse_mount, fuse_dirs
) -> None:
    controller = controller_factory("--capacity", "1GiB/s", "--node-bandwidth", "1GiB/s")
    backing, mountpoint = fuse_dirs
    mount = fuse_mount(backing, mountpoint, "--controller", controller.address)
    names = [f"held.{i}" for i in range(3)]
    synced, unsynced = 4 * MiB + 123, 64 * 1024
    paths = [str(mountpoint / n) for n in names]
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, *paths, str(synced), str(unsynced)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert read_line(holder, 30) == "ready"

            os.kill(mount.pid, signal.SIGTERM)
            # Detached from the namespace at once (lazily: the files are still open) ...
            wait_until(lambda: not is_mounted(mountpoint), timeout=10, message="the unmount")
            assert not os.listdir(mountpoint)  # the bare directory again, no stale mount
            # ... and everything fsynced is on the backing store already.
            for i, name in enumerate(names):
                data = (backing / name).read_bytes()
                assert data[:synced] == random.Random(i).randbytes(synced), name

            # The open files keep working until the application closes them; then the mount's
            # process exits, cleanly, with nothing of the application's data lost.
            assert holder.stdin is not None
            holder.stdin.write("go\n")
            holder.stdin.flush()
            outcome = read_line(holder, 15)
            assert holder.wait(timeout=15) == 0, outcome
            wait_until(
                lambda: mount.proc.poll() is not None, timeout=15, message="the mount's exit"
            )
            assert mount.stop() == 0
            print({"after_sigterm": outcome})
            for i, name in enumerate(names):
                data = (backing / name).read_bytes()
                expected = random.Random(i).randbytes(synced) + b"u" * unsynced
                assert data[: len(expected)] == expected, name
        finally:
            if holder.poll() is None:
                holder.kill()
