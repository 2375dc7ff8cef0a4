"""Restarts of the stage-out and of the controller's books, live (real mounts, libfuse 2 and 3;
a real controller process): a mount killed mid-drain resumes from its journal without scanning
BACKING; a job's ``drained`` goes on after a controller restart; a job's bytes kept on the
buffer (``--evict keep``) stay on the controller's books past ``job_retention``, and after its
mount stopped, until an operator releases them."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_controller import FakeController
from support import MountProcess, wait_until
from test_stageout import temporaries

pytestmark = pytest.mark.integration

MiB = 1 << 20


def identical(pfs: Path, data: dict[str, bytes]) -> bool:
    return all((pfs / n).exists() and (pfs / n).read_bytes() == d for n, d in data.items())


@pytest.fixture
def staged_dirs(fuse_dirs: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path, Path]:
    """``(backing, mountpoint, pfs)``: `fuse_dirs` and a PFS directory beside them."""
    pfs = tmp_path / "pfs"
    pfs.mkdir()
    return (*fuse_dirs, pfs)


@pytest.mark.parametrize("libfuse", ["3"], indirect=True)  # above the binding: conftest.py
def test_a_mount_killed_mid_drain_resumes_from_its_journal_without_a_scan(
    fake_controller: Callable[..., FakeController],
    fuse_mount: Callable[..., MountProcess],
    staged_dirs: tuple[Path, Path, Path],
    tmp_path: Path,
) -> None:
    backing, mnt, pfs = staged_dirs
    journal = ("--journal", str(tmp_path / "journal"))
    fake = fake_controller(initial_rate=4 * MiB, burst=64 * 1024)
    mount = fuse_mount(
        backing, mnt, "--controller", fake.address, "--stage-out", str(pfs), *journal
    )
    (mnt / "d").mkdir()
    data = {name: os.urandom(2 * MiB) for name in ("a", "d/b", "d/c")}
    for name, content in data.items():
        (mnt / name).write_bytes(content)  # paced at 4 MiB/s, and drained as slowly
    wait_until(lambda: temporaries(pfs), 20, interval=0.01, message="a copy to begin")
    mount.stop(signal.SIGKILL, check=False)
    assert not identical(pfs, data)  # the drain was cut short
    again = fuse_mount(backing, mnt, "--stage-out", str(pfs), *journal)  # unpaced now
    assert "resumed from the journal: 3 files (no scan of BACKING)" in again.log_text
    assert "scanning all of" not in again.log_text
    wait_until(lambda: identical(pfs, data), 30, message="the drain after the restart")
    wait_until(lambda: all(os.stat(backing / n).st_size == 0 for n in data), 20, message="evicted")
    for name, content in data.items():
        assert (
            hashlib.sha256((mnt / name).read_bytes()).digest() == hashlib.sha256(content).digest()
        )
    assert temporaries(pfs) == []


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _rows(url: str) -> dict[str, dict[str, Any]]:
    response = httpx.get(f"{url}/v1/capacity", timeout=5)
    assert response.status_code == 200, response.text
    return {row["job_id"]: row for row in response.json()["jobs"]}


def _drained_total(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("burstctl_drained_bytes_total"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no burstctl_drained_bytes_total")


@pytest.mark.parametrize("libfuse", ["3"], indirect=True)  # above the binding: conftest.py
def test_a_jobs_drained_bytes_go_on_after_a_controller_restart(
    controller_factory: Any,
    fuse_mount: Callable[..., MountProcess],
    staged_dirs: tuple[Path, Path, Path],
) -> None:
    backing, mnt, pfs = staged_dirs
    ctl = controller_factory(
        "--pfs-bandwidth", "64MiB/s", address=f"127.0.0.1:{_port()}",
        env={"BURSTCTL_LEDGER_INTERVAL": "0.2"},
    )  # fmt: skip
    args = ("--controller", ctl.address, "--stage-out", str(pfs), "--evict", "keep")
    fuse_mount(backing, mnt, *args)
    (mnt / "first").write_bytes(os.urandom(2 * MiB))

    def drained() -> int:
        rows = _rows(ctl.url)
        return max((row["drained"] for row in rows.values()), default=0)

    wait_until(lambda: drained() >= 2 * MiB, 20, message="the first copy booked as drained")
    before, total = drained(), _drained_total(ctl.url)
    ctl.stop()  # a clean stop saves the ledger
    ctl.start()  # same address, same state directory
    assert _drained_total(ctl.url) == total  # /metrics goes on from the saved value
    (mnt / "second").write_bytes(os.urandom(MiB))  # the mount's sessions reconnect
    wait_until(lambda: drained() >= before + MiB, 30, message="the second copy, booked on top")
    wait_until(lambda: _drained_total(ctl.url) >= total + MiB, 10, message="/metrics, on top")


@pytest.mark.parametrize("libfuse", ["3"], indirect=True)  # above the binding: conftest.py
def test_bytes_kept_on_the_buffer_stay_on_the_books_past_the_job_retention(
    controller_factory: Any,
    fuse_mount: Callable[..., MountProcess],
    staged_dirs: tuple[Path, Path, Path],
) -> None:
    backing, mnt, pfs = staged_dirs
    retention = 1.0
    ctl = controller_factory(
        "--bb-capacity", "64MiB", env={"BURSTCTL_JOB_RETENTION": str(retention)}
    )
    args = ("--controller", ctl.address, "--stage-out", str(pfs), "--evict", "keep")
    mount = fuse_mount(backing, mnt, *args, "--session-idle", "0.3")
    (mnt / "f").write_bytes(os.urandom(2 * MiB))
    resident = os.stat(backing / "f").st_blocks * 512

    def on_the_books() -> bool:
        rows = _rows(ctl.url)
        return len(rows) == 1 and next(iter(rows.values()))["resident"] >= resident

    wait_until(lambda: (pfs / "f").exists() and on_the_books(), 20, message="copied, reported")
    # Idle (its session idles out after 0.3 s) and past the job retention, several times
    # over: the bytes are still on the buffer, so on the books.
    until = time.monotonic() + 4 * retention + 1.0
    while time.monotonic() < until:
        assert on_the_books(), _rows(ctl.url)
    job_id = next(iter(_rows(ctl.url)))
    mount.stop()  # its session says Goodbye: the resident is parked, the bytes stay
    until = time.monotonic() + 2 * retention + 1.0
    while time.monotonic() < until:
        assert on_the_books(), _rows(ctl.url)
    token = (ctl.state_dir / "admin-token").read_text().strip()
    release = httpx.delete(
        f"{ctl.url}/v1/capacity/parked/{job_id}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=5,
    )
    assert release.status_code == 204, release.text
    assert job_id not in _rows(ctl.url) or _rows(ctl.url)[job_id]["resident"] == 0
    again = httpx.delete(
        f"{ctl.url}/v1/capacity/parked/{job_id}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=5,
    )
    assert again.status_code == 404
