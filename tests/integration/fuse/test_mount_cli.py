"""``burstctl mount`` / ``burstctl umount`` from the command line: help, errors, daemon mode."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from support import MountProcess, clean_env, is_mounted, run_burstctl, wait_until

pytestmark = pytest.mark.integration


# The commands under test, without the runner's BURSTCTL_* settings or its stdin.
burstctl = functools.partial(run_burstctl, env=clean_env(), stdin=subprocess.DEVNULL)


def test_help_lists_the_options() -> None:
    out = burstctl("mount", "--help").stdout
    for flag in (
        "--controller",
        "--fallback",
        "--allow-other",
        "--max-write",
        "--read-ahead",
        "--direct-io",
        "--libfuse",
        "--big-writes",
        "--foreground",
        "--quiet-gap",
        "--session-idle",
        "--metadata-cost",
        "--attach-timeout",
        "--attribution-ttl",
        "--log-level",
        "--log-file",
        "--stage-out",
        "--evict",
    ):
        assert flag in out, flag
    assert "--lazy" in burstctl("umount", "--help").stdout


def test_umount_stops_a_foreground_mount(
    fuse_mount: Callable[..., MountProcess], fuse_dirs: tuple[Path, Path]
) -> None:
    backing, mnt = fuse_dirs
    mount = fuse_mount(backing, mnt)
    (mnt / "f").write_bytes(b"x")
    result = burstctl("umount", str(mnt))
    assert result.returncode == 0, result.stderr
    assert mount.proc is not None
    assert mount.proc.wait(15) == 0  # the daemon notices and exits cleanly
    assert not is_mounted(mnt)
    assert "unmounted" in mount.log_text


def test_sigint_unmounts(
    fuse_mount: Callable[..., MountProcess], fuse_dirs: tuple[Path, Path]
) -> None:
    backing, mnt = fuse_dirs
    mount = fuse_mount(backing, mnt)
    assert mount.stop(signal.SIGINT) == 0
    assert not is_mounted(mnt)


def test_umount_of_a_busy_mount_fails_unless_lazy(
    fuse_mount: Callable[..., MountProcess], fuse_dirs: tuple[Path, Path]
) -> None:
    backing, mnt = fuse_dirs
    mount = fuse_mount(backing, mnt)
    with open(mnt / "held", "wb") as held:
        busy = burstctl("umount", str(mnt))
        assert busy.returncode != 0 and "busy" in busy.stderr.lower()
        assert is_mounted(mnt)
        lazy = burstctl("umount", "--lazy", str(mnt))
        assert lazy.returncode == 0, lazy.stderr
        held.write(b"still writable while detached")
    assert mount.proc is not None
    assert mount.proc.wait(15) == 0  # gone once the last file closed
    assert (backing / "held").read_bytes() == b"still writable while detached"


def test_sigterm_with_open_files_detaches_and_exits_after_the_last_close(
    fuse_mount: Callable[..., MountProcess], fuse_dirs: tuple[Path, Path]
) -> None:
    backing, mnt = fuse_dirs
    mount = fuse_mount(backing, mnt)
    with open(mnt / "held", "wb") as held:
        os.kill(mount.pid, signal.SIGTERM)
        wait_until(lambda: not is_mounted(mnt), timeout=15, message="the lazy detach")
        held.write(b"after the signal")
    assert mount.proc is not None
    assert mount.proc.wait(15) == 0
    assert (backing / "held").read_bytes() == b"after the signal"


@pytest.fixture
def daemons() -> Iterator[list[psutil.Process]]:
    """Background mounts found by the test; any still running at the end is ended by pid."""
    found: list[psutil.Process] = []
    yield found
    for proc in found:
        if proc.is_running():
            proc.terminate()
            proc.wait(15)


def daemon_for(mnt: Path) -> psutil.Process:
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "mount" in cmdline and str(mnt) in cmdline and proc.pid != os.getpid():
            return proc
    raise AssertionError(f"no daemon serves {mnt}")


def test_background_mount_returns_once_mounted(
    fuse_dirs: tuple[Path, Path], daemons: list[psutil.Process], tmp_path: Path
) -> None:
    backing, mnt = fuse_dirs
    log = tmp_path / "mount.log"
    try:
        result = burstctl("mount", str(backing), str(mnt), "--log-file", str(log))
        assert result.returncode == 0, result.stderr
        assert os.path.ismount(mnt)  # mounted by the time the command returned
        daemon = daemon_for(mnt)
        daemons.append(daemon)
        assert daemon.ppid() != os.getpid()  # detached from the command
        (mnt / "f").write_bytes(b"in the background")
        assert burstctl("umount", str(mnt)).returncode == 0
        daemon.wait(15)
        assert (backing / "f").read_bytes() == b"in the background"
        text = log.read_text()
        assert "mounted" in text and "unmounted" in text
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount", "-u", "-z", str(mnt)], check=False)


def test_errors_are_reported_before_mounting(tmp_path: Path) -> None:
    backing = tmp_path / "b"
    (backing / "inner").mkdir(parents=True)
    inside = burstctl("mount", str(backing), str(backing / "inner"), "--foreground")
    assert inside.returncode != 0 and "inside BACKING" in inside.stderr
    missing = burstctl("mount", str(tmp_path / "nope"), str(backing), "--foreground")
    assert missing.returncode != 0 and "BACKING" in missing.stderr
    wb = burstctl("mount", str(backing), str(tmp_path), "-o", "writeback_cache", "-f")
    assert wb.returncode != 0 and "writeback_cache" in wb.stderr
    fallback = burstctl("mount", str(backing), str(tmp_path), "--fallback", "x", "-f")
    assert fallback.returncode != 0 and "fallback" in fallback.stderr
    # A daemonizing mount that libfuse refuses says why and fails (an option libfuse 2 and
    # 3 both reject, passed on by the shim).
    (tmp_path / "m").mkdir()
    try:
        failed = burstctl("mount", str(backing), str(tmp_path / "m"), "-o", "no_such_option")
        assert failed.returncode != 0 and "no_such_option" in failed.stderr
        assert not is_mounted(tmp_path / "m")
    finally:
        if is_mounted(tmp_path / "m"):
            subprocess.run(["fusermount", "-u", "-z", str(tmp_path / "m")], check=False)
    not_mounted = burstctl("umount", str(tmp_path))
    assert not_mounted.returncode != 0 and "not a FUSE mount" in not_mounted.stderr


def _read_ahead_kb(mountpoint: Path) -> int:
    device = os.stat(mountpoint).st_dev
    return int(
        Path(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb").read_text()
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="the read-ahead window is set through sysfs (root)")
def test_the_mount_reads_ahead_1mib_unless_told_otherwise(
    fuse_mount: Callable[..., MountProcess], tmp_path: Path
) -> None:
    default = fuse_mount(tmp_path / "b1", tmp_path / "m1")
    assert _read_ahead_kb(default.mountpoint) == 1024
    larger = fuse_mount(tmp_path / "b2", tmp_path / "m2", "--read-ahead", "4MiB")
    assert _read_ahead_kb(larger.mountpoint) == 4096
    kernel = fuse_mount(tmp_path / "b3", tmp_path / "m3", "--read-ahead", "0")
    assert _read_ahead_kb(kernel.mountpoint) == 128  # the kernel's own, untouched
    assert "read-ahead" not in default.log_text + larger.log_text  # no warning
