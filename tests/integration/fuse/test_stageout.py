"""``burstctl mount --stage-out PFS_DIR``: closed files drained to the PFS directory, evicted,
served from it and brought back; a kill -9 mid-copy; a rewrite during a copy; an unwritable PFS;
the drain's own stream to the controller; bad flags. Real mounts (libfuse 2 and 3)."""

from __future__ import annotations

import functools
import hashlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_controller import FakeController
from support import MountProcess, clean_env, run_burstctl, wait_until

from burstctl.node.stageout_extents import OPEN_MARK
from burstctl.node.stageout_marks import TEMP_MARK, XATTR_COPIED
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

pytestmark = pytest.mark.integration

MiB = 1 << 20


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def temporaries(pfs: Path) -> list[str]:
    """The copies in progress: a closed file's temporary, or the part of a file drained while
    it was open (a 6 MiB file written at 4 MiB/s starts draining before it is closed)."""
    return [n for _, _, names in os.walk(pfs) for n in names if TEMP_MARK in n or OPEN_MARK in n]


def drained(backing: Path, pfs: Path, rels: list[str]) -> bool:
    """Every file is on the PFS, identical, and its buffer copy evicted (size 0)."""
    for rel in rels:
        target = pfs / rel
        if not target.exists() or os.stat(backing / rel).st_size != 0:
            return False
    return True


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    backing, mnt, pfs = tmp_path / "backing", tmp_path / "mnt", tmp_path / "pfs"
    for d in (backing, mnt, pfs):
        d.mkdir()
    return backing, mnt, pfs


def test_closed_files_are_drained_evicted_and_still_read_through_the_mount(
    fuse_mount: Callable[..., MountProcess], dirs: tuple[Path, Path, Path]
) -> None:
    backing, mnt, pfs = dirs
    fuse_mount(backing, mnt, "--stage-out", str(pfs))
    (mnt / "run" / "ckpt").mkdir(parents=True)
    contents = {
        "a": os.urandom(3 * MiB + 17),
        "run/ckpt/b": os.urandom(200_000),
        "run/empty": b"",
    }
    for rel, data in contents.items():
        (mnt / rel).write_bytes(data)
    wait_until(lambda: drained(backing, pfs, list(contents)), 20, message="the drain")
    for rel, data in contents.items():
        assert sha(pfs / rel) == hashlib.sha256(data).hexdigest(), rel
        assert (mnt / rel).read_bytes() == data, rel  # served from the PFS copy
        assert os.stat(mnt / rel).st_size == len(data)
        assert os.stat(mnt / rel).st_mtime_ns == os.stat(pfs / rel).st_mtime_ns
    assert os.stat(backing / "a").st_blocks * 512 <= 8192  # its data blocks went back
    assert temporaries(pfs) == []
    assert sorted(os.listdir(mnt / "run")) == ["ckpt", "empty"]
    # Opened for writing: brought back first, then the write lands after the PFS bytes.
    with open(mnt / "a", "ab") as f:
        assert os.stat(backing / "a").st_size == len(contents["a"])
        f.write(b"more")
    expected = contents["a"] + b"more"
    assert (mnt / "a").read_bytes() == expected
    # ... and copied again after its close (then evicted again).
    wait_until(
        lambda: (pfs / "a").stat().st_size == len(expected) and drained(backing, pfs, ["a"]),
        20,
        message="the second copy",
    )
    assert sha(pfs / "a") == hashlib.sha256(expected).hexdigest()
    assert (mnt / "a").read_bytes() == expected


def test_stat_right_after_an_eviction_and_a_restore_shows_what_the_mount_serves(
    fuse_mount: Callable[..., MountProcess], dirs: tuple[Path, Path, Path]
) -> None:
    # The daemon changes the file on its own: the kernel must drop the attributes it cached,
    # whatever --attr-timeout allows it to keep.
    backing, mnt, pfs = dirs
    mount = fuse_mount(
        backing,
        mnt,
        "--stage-out",
        str(pfs),
        "--attr-timeout",
        "3600",
        "--entry-timeout",
        "3600",
        "--log-level",
        "DEBUG",
    )
    data = os.urandom(MiB + 1)
    with open(mnt / "f", "wb") as f:
        f.write(data)
        f.flush()
        # Cached while it is open (nothing is evicted before its last close).
        before = os.stat(mnt / "f")
    wait_until(lambda: "evicted f" in mount.log_text, 20, message="the eviction")

    def attributes(st: os.stat_result) -> tuple[int, int, int, int]:
        return st.st_size, st.st_blocks, st.st_mtime_ns, st.st_ctime_ns

    # As the mount shows an evicted file: its size and mtime, blocks as if its data were there.
    evicted = (
        len(data),
        -(-len(data) // 512),
        before.st_mtime_ns,
        os.stat(backing / "f").st_ctime_ns,
    )
    assert attributes(before) != evicted
    assert attributes(os.stat(mnt / "f")) == evicted
    assert os.stat(pfs / "f").st_mtime_ns == before.st_mtime_ns
    # Opened for writing: brought back before the open returns (and kept while open).
    with open(mnt / "f", "r+b"):
        assert os.stat(backing / "f").st_size == len(data)
        assert attributes(os.stat(mnt / "f")) == attributes(os.stat(backing / "f"))
    assert (mnt / "f").read_bytes() == data


def test_keep_mode_keeps_the_buffer_copy(
    fuse_mount: Callable[..., MountProcess], dirs: tuple[Path, Path, Path]
) -> None:
    backing, mnt, pfs = dirs
    fuse_mount(backing, mnt, "--stage-out", str(pfs), "--evict", "keep")
    data = os.urandom(MiB)
    (mnt / "f").write_bytes(data)
    wait_until(lambda: XATTR_COPIED in os.listxattr(backing / "f"), 20, message="the copy")
    assert (pfs / "f").read_bytes() == data == (backing / "f").read_bytes()
    assert temporaries(pfs) == []


def _slow_mount(
    fake_controller: Callable[..., FakeController],
    fuse_mount: Callable[..., MountProcess],
    backing: Path,
    mnt: Path,
    pfs: Path,
    rate: float,
) -> tuple[FakeController, MountProcess]:
    fake = fake_controller(initial_rate=rate, burst=64 * 1024)
    mount = fuse_mount(backing, mnt, "--controller", fake.address, "--stage-out", str(pfs))
    return fake, mount


def test_the_drain_has_its_own_stream_and_the_app_stream_reports_the_buffer(
    fake_controller: Callable[..., FakeController],
    fuse_mount: Callable[..., MountProcess],
    dirs: tuple[Path, Path, Path],
) -> None:
    backing, mnt, pfs = dirs
    fake = fake_controller(initial_rate=64 * MiB, burst=64 * 1024)
    args = ("--controller", fake.address, "--stage-out", str(pfs), "--evict", "keep")
    fuse_mount(backing, mnt, *args)
    (mnt / "f").write_bytes(os.urandom(MiB))
    wait_until(lambda: (pfs / "f").exists(), 20, message="the copy")
    assert sorted(h.purpose for h in fake.bodies("hello")) == [pb.PURPOSE_APP, pb.PURPOSE_DRAIN]
    resident = os.stat(backing / "f").st_blocks * 512

    def reported() -> bool:
        return any(
            u.HasField("buffer")
            and (u.buffer.resident, u.buffer.pending, u.buffer.drain_error) == (resident, 0, "")
            and u.buffer.added >= MiB
            for u in fake.bodies("usage")
        )

    # Kept (--evict keep): resident, nothing pending once copied; every byte written counted.
    wait_until(reported, 10, message="the buffer report")


@pytest.mark.parametrize("libfuse", ["3"], indirect=True)  # above the binding: conftest.py
def test_a_kill_9_mid_copy_leaves_no_partial_file_and_the_copy_resumes(
    fake_controller: Callable[..., FakeController],
    fuse_mount: Callable[..., MountProcess],
    dirs: tuple[Path, Path, Path],
) -> None:
    backing, mnt, pfs = dirs
    _, mount = _slow_mount(fake_controller, fuse_mount, backing, mnt, pfs, 4 * MiB)
    data = os.urandom(6 * MiB)
    (mnt / "f").write_bytes(data)  # ~1.5 s at 4 MiB/s, and as long to drain
    wait_until(lambda: temporaries(pfs), 20, interval=0.01, message="the copy to begin")
    mount.stop(signal.SIGKILL, check=False)
    assert not (pfs / "f").exists()  # never a partial file under the final name
    assert temporaries(pfs)  # the half copy, under its temporary name
    fuse_mount(backing, mnt, "--stage-out", str(pfs))  # restarted, unpaced
    wait_until(lambda: drained(backing, pfs, ["f"]), 20, message="the resumed copy")
    assert sha(pfs / "f") == hashlib.sha256(data).hexdigest()
    assert temporaries(pfs) == []
    assert (mnt / "f").read_bytes() == data


@pytest.mark.parametrize("libfuse", ["3"], indirect=True)  # above the binding: conftest.py
def test_a_file_rewritten_during_its_copy_is_copied_again_never_evicted_stale(
    fake_controller: Callable[..., FakeController],
    fuse_mount: Callable[..., MountProcess],
    dirs: tuple[Path, Path, Path],
) -> None:
    backing, mnt, pfs = dirs
    _slow_mount(fake_controller, fuse_mount, backing, mnt, pfs, 4 * MiB)
    data = bytearray(os.urandom(4 * MiB))
    (mnt / "f").write_bytes(data)
    wait_until(lambda: temporaries(pfs), 20, interval=0.01, message="the copy to begin")
    with open(mnt / "f", "r+b") as f:  # not evicted: it is being copied
        f.write(b"rewritten")
    data[:9] = b"rewritten"
    assert (mnt / "f").read_bytes() == data
    wait_until(lambda: drained(backing, pfs, ["f"]), 30, message="the second copy")
    assert (pfs / "f").read_bytes() == data
    assert (mnt / "f").read_bytes() == data


def test_a_mount_in_place_drains_and_resumes_after_a_restart(
    fuse_mount: Callable[..., MountProcess], dirs: tuple[Path, Path, Path]
) -> None:
    backing, _, pfs = dirs
    (backing / "old").write_bytes(b"there before")  # never written through the mount
    mount = fuse_mount(backing, backing, "--stage-out", str(pfs), "--log-level", "DEBUG")
    (backing / "d").mkdir()
    data = os.urandom(MiB + 1)
    (backing / "d" / "f").write_bytes(data)
    wait_until(lambda: "evicted d/f" in mount.log_text, 20, message="the eviction")
    assert (backing / "d" / "f").read_bytes() == data  # through the mount: from the PFS
    mount.stop()
    assert os.stat(backing / "d" / "f").st_size == 0  # evicted, under the mount
    assert not (pfs / "old").exists()
    fuse_mount(backing, backing, "--stage-out", str(pfs))  # the index rebuilt by the scan
    assert (backing / "d" / "f").read_bytes() == data
    with open(backing / "d" / "f", "ab") as f:
        f.write(b"+")
    wait_until(lambda: (pfs / "d" / "f").stat().st_size == len(data) + 1, 20, message="the recopy")
    assert (pfs / "d" / "f").read_bytes() == data + b"+"


def _chattr(flag: str, path: Path) -> bool:
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True, check=False)
    return done.returncode == 0


def test_an_unwritable_pfs_evicts_nothing_and_says_why(
    fuse_mount: Callable[..., MountProcess], dirs: tuple[Path, Path, Path]
) -> None:
    backing, mnt, pfs = dirs
    if not _chattr("+i", pfs):
        pytest.skip("chattr +i does not work here (root on ext4/xfs needed)")
    try:
        mount = fuse_mount(backing, mnt, "--stage-out", str(pfs))
        assert "is not writable now" in mount.log_text  # warned, not refused
        data = os.urandom(300_000)
        (mnt / "f").write_bytes(data)  # writes go on
        cause = "PFS_DIR not writable: Operation not permitted"
        wait_until(lambda: cause in mount.log_text, 10, message="the cause in the log")
        assert (backing / "f").read_bytes() == data  # nothing evicted
        assert mount.log_text.count(cause) == 1  # once per cause, not per retry
    finally:
        _chattr("-i", pfs)
    wait_until(lambda: drained(backing, pfs, ["f"]), 40, message="the copy once writable")
    assert (pfs / "f").read_bytes() == data
    # said once the pass that copied it ends, which may be just after the copy shows
    wait_until(lambda: "works again" in mount.log_text, 10, message="the recovery logged")


@pytest.mark.parametrize("libfuse", ["3"], indirect=True)  # above the binding: conftest.py
def test_an_unwritable_pfs_fills_the_buffer_then_writes_wait_and_the_controller_says_why(
    controller_factory: Any,
    fuse_mount: Callable[..., MountProcess],
    dirs: tuple[Path, Path, Path],
) -> None:
    backing, mnt, pfs = dirs
    ctl = controller_factory(
        "--bb-capacity", "8MiB", "--capacity", "4GiB/s", "--node-bandwidth", "4GiB/s"
    )
    assert ctl.url is not None
    if not _chattr("+i", pfs):
        pytest.skip("chattr +i does not work here (root on ext4/xfs needed)")
    writer = None
    try:
        fuse_mount(backing, mnt, "--controller", ctl.address, "--stage-out", str(pfs))
        env = clean_env()
        script = (
            "import sys\n"
            "for i in range(4):\n"
            "    with open(f'{sys.argv[1]}/f{i}', 'wb', buffering=0) as f:\n"
            "        for _ in range(4): f.write(bytes([i]) * (1 << 20))\n"
        )
        writer = subprocess.Popen(
            [sys.executable, "-c", script, str(mnt)], env={**env, "BURSTCTL_JOB_ID": "stuck"}
        )
        cause = "PFS_DIR not writable: Operation not permitted"

        def blocked() -> dict[str, Any] | None:
            body = httpx.get(f"{ctl.url}/v1/capacity", timeout=5).json()
            jobs = {j["job_id"]: j for j in body["jobs"]}
            if "stuck" in body["waiting"] and jobs.get("stuck", {}).get("drain_error") == cause:
                return body
            return None

        body = wait_until(blocked, 20, message="the writer waiting, the cause in /v1/capacity")
        # S, plus what the books take as it comes: a block per file for the mount's xattrs.
        assert isinstance(body, dict) and body["used"] <= 8 * MiB + 4 * 4096
        assert writer.poll() is None  # waits, does not fail
        on_buffer = sum(os.stat(p).st_blocks * 512 for p in backing.iterdir())
        assert 4 * MiB <= on_buffer <= 9 * MiB  # filled up to S (one write in flight)
        assert not any(os.stat(p).st_size == 0 for p in backing.iterdir())  # nothing evicted
    except BaseException:
        if writer is not None:  # never leave the writer running behind a failed check
            writer.kill()
            writer.wait()
        raise
    finally:
        _chattr("-i", pfs)
    assert writer is not None
    try:
        assert writer.wait(60) == 0  # the drain frees the buffer: the writer completes
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    names = [f"f{i}" for i in range(4)]
    wait_until(lambda: drained(backing, pfs, names), 40, message="every file drained")
    for i, name in enumerate(names):
        assert (pfs / name).read_bytes() == bytes([i]) * (4 << 20)
        assert (mnt / name).read_bytes() == bytes([i]) * (4 << 20)


# The commands under test, without the runner's BURSTCTL_* settings or its stdin.
burstctl = functools.partial(run_burstctl, env=clean_env(), stdin=subprocess.DEVNULL)


def test_bad_stage_out_flags_are_refused_at_start(dirs: tuple[Path, Path, Path]) -> None:
    backing, mnt, pfs = dirs
    (backing / "in").mkdir()
    (mnt / "in").mkdir()
    for args, message in (
        (["--stage-out", str(mnt / "in")], "is inside MOUNTPOINT"),
        (["--stage-out", str(backing / "in")], "is inside BACKING"),
        (["--stage-out", str(pfs / "missing")], "no such directory"),
        (["--stage-out", str(backing.parent)], "contains BACKING"),
        (["--evict", "keep"], "--evict needs --stage-out PFS_DIR"),
        (["--stage-out", str(pfs), "--evict", "never"], "after-copy"),
    ):
        result = burstctl("mount", str(backing), str(mnt), "--foreground", *args)
        assert result.returncode != 0, args
        assert message in result.stderr, (args, result.stderr)
    help_text = burstctl("mount", "--help").stdout
    assert "--stage-out PFS_DIR" in help_text and "--evict" in help_text


@pytest.mark.parametrize("libfuse", ["3"], indirect=True)
def test_a_controller_killed_mid_copy_loses_nothing_and_the_drain_goes_on_after_its_restart(
    controller_factory: Any,
    fuse_mount: Callable[..., MountProcess],
    dirs: tuple[Path, Path, Path],
) -> None:
    """kill -9 of the controller while a paced copy is under way: no partial file under the
    final name, nothing evicted before its copy is complete, and after the controller's
    restart (same address) every file is on the PFS, identical, and reads back through the
    mount; no temporary is left."""
    backing, mnt, pfs = dirs
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctl = controller_factory(
        "--pfs-bandwidth", "2MiB/s", "--bb-capacity", "256MiB",
        address=f"127.0.0.1:{port}",
    )  # fmt: skip
    fuse_mount(backing, mnt, "--controller", ctl.address, "--stage-out", str(pfs))
    data = {name: os.urandom(4 * MiB) for name in ("a", "b")}
    for name, content in data.items():
        (mnt / name).write_bytes(content)
    wait_until(lambda: temporaries(pfs), 20, interval=0.01, message="a paced copy to begin")
    ctl.stop(signal.SIGKILL)
    assert not [n for n in data if (pfs / n).exists() and (pfs / n).read_bytes() != data[n]]
    for name in data:  # nothing evicted that is not complete on the PFS
        if os.stat(backing / name).st_size == 0:
            assert (pfs / name).read_bytes() == data[name]
    ctl.start()
    wait_until(lambda: drained(backing, pfs, list(data)), 60, message="every copy, evicted")
    for name, content in data.items():
        assert sha(pfs / name) == hashlib.sha256(content).hexdigest()
        assert (mnt / name).read_bytes() == content
    assert temporaries(pfs) == []
