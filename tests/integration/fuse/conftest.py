"""Fixtures for the FUSE shim's integration tests: real mounts of ``burstctl mount``.

``fuse_mount`` starts ``python -m burstctl mount BACKING MOUNTPOINT --foreground ...`` as a child
process and returns once the mount answers; every mount it started is stopped by pid (SIGTERM)
at teardown, which asserts that it exited cleanly and that nothing is left mounted.

Every test that mounts through ``fuse_mount`` runs twice, on libfuse 2 and on libfuse 3
(``--libfuse``; ids ``libfuse2`` / ``libfuse3``): the two differ in their loops, options and
callback signatures. CI installs both; elsewhere a missing one skips its half. A test of what
lies above the binding (the stage-out's copies and restarts, the controller's secret, how a
phase ends, who a job is) runs on libfuse 3 only (``parametrize("libfuse", ["3"],
indirect=True)``), what ``--libfuse auto`` takes as root: its other half would run the same
Python code again, and CI time is better spent elsewhere. What reaches the binding (the
POSIX, integrity, lifecycle, interrupt and workload tests, evictions the kernel must see)
keeps both.
"""

from __future__ import annotations

import ctypes.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fake_controller import FakeController, fake_controllers
from support import MountProcess, is_mounted, wait_until


def _require_fuse() -> None:
    # CI has /dev/fuse and must run these tests: there a missing device is a failure.
    if not os.path.exists("/dev/fuse"):
        if os.environ.get("CI"):
            pytest.fail("/dev/fuse is missing on CI; the FUSE tests must run there")
        pytest.skip("/dev/fuse is absent on this machine")


@pytest.fixture(params=["2", "3"], ids=["libfuse2", "libfuse3"])
def libfuse(request: pytest.FixtureRequest) -> str:
    """The libfuse major version this test's mounts use (``--libfuse``)."""
    major = str(request.param)
    if ctypes.util.find_library("fuse" if major == "2" else "fuse3") is None:
        if os.environ.get("CI"):
            pytest.fail(f"libfuse {major} is missing on CI (deploy/system-deps.sh installs it)")
        pytest.skip(f"libfuse {major} is not installed on this machine")
    return major


@pytest.fixture
def fuse_mount(libfuse: str, tmp_path: Path) -> Iterator[Callable[..., MountProcess]]:
    """A factory of real mounts, all stopped (by pid) and checked at teardown.

    ``fuse_mount(backing: Path, mountpoint: Path, *extra_args: str,
    env: dict[str, str] | None = None, timeout: float = 20.0) -> MountProcess``

    - creates ``backing`` and ``mountpoint`` if they do not exist;
    - runs ``python -m burstctl mount BACKING MOUNTPOINT --foreground --libfuse N *extra_args``
      (N from the ``libfuse`` fixture) with this environment less any ``BURSTCTL_*`` variable
      and ``FUSE_LIBRARY_PATH``, with ``XDG_STATE_HOME`` in the test's ``tmp_path`` (where the
      stage-out's journals go by default), plus ``env``;
    - waits (deadline ``timeout``) until ``os.path.ismount(mountpoint)`` and the mount has
      logged which libfuse it loaded (it must be N); fails with the child's log if it exits or
      is not up in time.

    The `MountProcess` has ``.pid``, ``.backing``, ``.mountpoint``, ``.log`` (stderr lines so
    far), ``.log_text`` and ``.stop(sig=SIGTERM, timeout=15.0, check=True) -> returncode``. A
    test may stop a mount itself (stop is idempotent); teardown stops the rest and asserts each
    exited with 0 and unmounted its mount point (a leftover is removed with ``fusermount -u``).
    """
    _require_fuse()
    started: list[MountProcess] = []

    def make(
        backing: Path,
        mountpoint: Path,
        *extra_args: str,
        env: dict[str, str] | None = None,
        timeout: float = 20.0,
    ) -> MountProcess:
        Path(backing).mkdir(parents=True, exist_ok=True)
        Path(mountpoint).mkdir(parents=True, exist_ok=True)
        mount = MountProcess(
            backing,
            mountpoint,
            ("--libfuse", libfuse, *extra_args),
            {"FUSE_LIBRARY_PATH": "", "XDG_STATE_HOME": str(tmp_path / "state"), **(env or {})},
        )
        started.append(mount)
        mount.start(timeout)
        wait_until(
            lambda: ", libfuse " in mount.log_text,
            timeout,
            message=f"the mount on {mountpoint} to log its libfuse",
        )
        assert f", libfuse {libfuse}." in mount.log_text, mount.log_text
        return mount

    yield make
    failures = []
    for mount in reversed(started):
        try:
            mount.stop()
        except AssertionError as err:
            failures.append(str(err))
    left = [str(m.mountpoint) for m in started if is_mounted(m.mountpoint)]
    assert not left, f"mount points left mounted: {left}"
    assert not failures, "\n".join(failures)


@pytest.fixture
def fuse_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """``(backing, mountpoint)``: two fresh empty directories under this test's tmp_path."""
    backing, mountpoint = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mountpoint.mkdir()
    return backing, mountpoint


@pytest.fixture
def mounted(fuse_mount: Callable[..., MountProcess], fuse_dirs: tuple[Path, Path]) -> MountProcess:
    """A mount of ``fuse_dirs`` with the default options and no controller (unthrottled)."""
    backing, mountpoint = fuse_dirs
    return fuse_mount(backing, mountpoint)


@pytest.fixture
def fake_controller() -> Iterator[Callable[..., FakeController]]:
    """Starts scripted controllers (tests/fake_controller.py) that record what mounts say.

    ``fake_controller(**kwargs) -> FakeController`` (e.g. ``initial_rate=1 << 20``); every one
    is stopped at teardown, after the mounts (fixtures tear down in reverse order of setup, so
    request this fixture before ``fuse_mount``).
    """
    yield from fake_controllers("the mount")
