"""A writer that waits in the mount can be killed: the kernel's interrupt ends the wait.

A real controller on loopback and a real mount (libfuse 2 and 3). A writer process writes
1 MiB blocks to a file through the mount and prints how many were acknowledged; once it is
blocked in the kernel on a request the mount holds (``/proc/PID/wchan`` is
``request_wait_answer``), it gets SIGKILL, a second writer SIGTERM (the default action), and
each must be gone within 1 s — also with one core kept busy by another process. Then:

- every block the writer was told was written is in the backing file, intact;
- the controller's books show no writer still waiting for space;
- the mount goes on serving: another write completes.

Two waits: for space on the burst buffer (``--bb-capacity`` small and no stage-out, so
nothing ever frees it), and for tokens at a very low rate (an interrupted wait gives its
tokens back, so the next small write does not wait behind the killed one's megabyte).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from support import ControllerProcess, MountProcess, wait_until
from support.killing import WRITER, assert_written, kill_within_a_second

pytestmark = pytest.mark.integration

MiB = 1 << 20
JOB = "intr-job"

# write(2)'s number, as /proc/PID/syscall shows it.
_WRITE = {"x86_64": "1", "aarch64": "64"}[os.uname().machine]


def in_write(pid: int) -> bool:
    """The process is blocked in a write(2) that the mount holds (or that the kernel waits on)."""
    try:
        blocked = Path(f"/proc/{pid}/wchan").read_text() == "request_wait_answer"
        return blocked and Path(f"/proc/{pid}/syscall").read_text().split()[0] == _WRITE
    except (OSError, IndexError):
        return False


ENV = {**os.environ, "SLURM_JOB_ID": JOB, "SLURM_NNODES": "1"}


def start_writer(path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], env=ENV, stdout=subprocess.PIPE, text=True
    )


def write_once(path: Path, nbytes: int, backing_file: Path) -> None:
    """Another process of the job writes ``nbytes`` through the mount (30 s at most)."""
    code = f"open({str(path)!r}, 'wb').write(b'x' * {nbytes})"
    assert subprocess.run([sys.executable, "-c", code], env=ENV, timeout=30).returncode == 0
    assert backing_file.read_bytes() == b"x" * nbytes


def kill_while_blocked(
    writer: subprocess.Popen[str], sig: int, ready: Callable[[], object] = lambda: True
) -> int:
    """Sends ``sig`` once the writer is blocked in a write the mount holds and ``ready`` (the
    wait is the one meant); asserts it is gone within 1 s; returns how many blocks it was told
    were written."""
    wait_until(
        lambda: (in_write(writer.pid) and ready()) or writer.poll() is not None,
        60,
        message="the writer to block in the mount",
    )
    assert writer.poll() is None, "the writer ended before it blocked"
    return kill_within_a_second(writer, sig)


def setup(
    controller_factory: Callable[..., ControllerProcess],
    fuse_mount: Callable[..., MountProcess],
    fuse_dirs: tuple[Path, Path],
    *controller_args: str,
) -> tuple[ControllerProcess, MountProcess]:
    controller = controller_factory("--node-bandwidth", "1GiB/s", *controller_args)
    backing, mountpoint = fuse_dirs
    mount = fuse_mount(backing, mountpoint, "--controller", controller.address)
    return controller, mount


def test_a_writer_waiting_for_space_dies_of_sigkill_and_sigterm(
    controller_factory: Callable[..., ControllerProcess],
    fuse_mount: Callable[..., MountProcess],
    fuse_dirs: tuple[Path, Path],
    busy_core: None,
) -> None:
    controller, mount = setup(
        controller_factory,
        fuse_mount,
        fuse_dirs,
        "--capacity",
        "1GiB/s",
        "--bb-capacity",
        "8MiB",
    )
    backing, mountpoint = fuse_dirs

    def waiting() -> list[str]:
        return list(httpx.get(f"{controller.url}/v1/capacity", timeout=5).json()["waiting"])

    def full() -> bool:  # the first writer's file holds most of S, and a writer waits
        a = backing / "a"
        return a.exists() and a.stat().st_size >= 6 * MiB and bool(waiting())

    # The first writer fills the buffer and waits for more; the second waits at its first
    # write. Each is killed once the controller knows it waits for space.
    for name, sig in (("a", signal.SIGKILL), ("b", signal.SIGTERM)):
        writer = start_writer(mountpoint / name)
        assert_written(backing / name, kill_while_blocked(writer, sig, full))
        wait_until(lambda: not waiting(), 10, message="no job waiting for space")
    # The mount serves on: space freed by a removal is granted to the next write.
    (mountpoint / "a").unlink()
    (mountpoint / "b").unlink()
    write_once(mountpoint / "c", MiB, backing / "c")
    assert mount.proc is not None and mount.proc.poll() is None


def test_a_writer_waiting_at_a_very_low_rate_dies_of_sigkill_and_sigterm(
    controller_factory: Callable[..., ControllerProcess],
    fuse_mount: Callable[..., MountProcess],
    fuse_dirs: tuple[Path, Path],
    busy_core: None,
) -> None:
    # 16 KiB/s: a 1 MiB write waits about a minute for its tokens.
    setup(controller_factory, fuse_mount, fuse_dirs, "--capacity", "16KiB/s")
    backing, mountpoint = fuse_dirs
    for name, sig in (("a", signal.SIGKILL), ("b", signal.SIGTERM)):
        writer = start_writer(mountpoint / name)
        assert_written(backing / name, kill_while_blocked(writer, sig))
    # The killed writers' tokens were given back: 4 KiB go through in well under the minute
    # they would wait behind a megabyte still reserved.
    started = time.monotonic()
    write_once(mountpoint / "c", 4096, backing / "c")
    assert time.monotonic() - started < 20


def test_more_writers_waiting_than_libfuse_3_starts_threads_by_default_all_die(
    controller_factory: Callable[..., ControllerProcess],
    fuse_mount: Callable[..., MountProcess],
    fuse_dirs: tuple[Path, Path],
) -> None:
    # Each waiting request holds a worker thread of libfuse's loop; libfuse 3 starts 10 by
    # default, and the interrupts need one more to be read.
    setup(
        controller_factory, fuse_mount, fuse_dirs, "--capacity", "1GiB/s", "--bb-capacity", "4MiB"
    )
    _, mountpoint = fuse_dirs
    writers = [start_writer(mountpoint / f"w{n}") for n in range(12)]
    try:
        wait_until(
            lambda: (
                all(in_write(w.pid) for w in writers) or any(w.poll() is not None for w in writers)
            ),
            60,
            message="twelve writers waiting in the mount",
        )
        assert all(w.poll() is None for w in writers), "a writer ended before it waited"
        sent = time.monotonic()
        for writer in writers:
            writer.kill()
        wait_until(
            lambda: all(w.poll() is not None for w in writers), 5, message="every writer gone"
        )
        took = time.monotonic() - sent
        assert took < 1.0, f"the writers took {took:.2f} s to die"
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
            writer.wait()
            if writer.stdout is not None:
                writer.stdout.close()
