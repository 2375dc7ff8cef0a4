"""A faithful copy to the PFS, on real directories (no FUSE): data extents only (sparse files
stay sparse, both ways), metadata (mode, owner as root, xattrs, times), directories, symlinks,
hard links, and a change of metadata alone going to the PFS copy without its data."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_until

from burstctl.client.job import JobInfo
from burstctl.node.stageout import StageOut
from burstctl.node.stageout_copy import copy_back, copy_to_pfs
from burstctl.node.stageout_extents import PIECE, copy_data
from burstctl.node.stageout_marks import XATTR_COPIED, XATTR_EVICTED, XATTR_JOB
from burstctl.node.stageout_tree import (
    XATTR_NAMES,
    PfsTree,
    add_name,
    copy_xattrs,
    make_parents,
)

MiB = 1 << 20
JOB = JobInfo("j1", "alice", "users")
ROOT = os.geteuid() == 0
OTHER = 4242  # an owner that is not the daemon's


class Paced:
    def __init__(self) -> None:
        self.calls: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, nbytes: int) -> None:
        with self.lock:
            self.calls.append(nbytes)


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[tuple[Path, Path, int]]:
    backing, pfs = tmp_path / "backing", tmp_path / "pfs"
    backing.mkdir()
    pfs.mkdir()
    fd = os.open(backing, os.O_RDONLY | os.O_DIRECTORY)
    yield backing, pfs, fd
    os.close(fd)


@pytest.fixture
def tree(dirs: tuple[Path, Path, int]) -> Iterator[PfsTree]:
    """A `PfsTree` of ``dirs`` with its worker running."""
    backing, pfs, root = dirs
    stopping = threading.Event()
    made = PfsTree(root, str(backing), pfs, stopping)
    worker = threading.Thread(target=made.run, name="test-tree")
    worker.start()
    yield made
    stopping.set()
    made.wake()
    worker.join(10)
    assert not worker.is_alive()


def reproduced(tree: PfsTree, *paths: Path) -> None:
    for path in paths:
        tree.reproduce(str(path))
    wait_until(tree.settled, message="the tree's reproduction")


def sparse(path: Path, size: int, extents: list[tuple[int, int]]) -> bytes:
    """A file of ``size`` bytes with data only in ``extents`` ((offset, length)); its bytes."""
    expected = bytearray(size)
    with open(path, "wb") as f:
        f.truncate(size)
        for offset, length in extents:
            data = os.urandom(length)
            f.seek(offset)
            f.write(data)
            expected[offset : offset + length] = data
    return bytes(expected)


def data_extents(path: Path) -> list[tuple[int, int]]:
    """(start, end) of each data extent, by SEEK_DATA / SEEK_HOLE."""
    found = []
    fd = os.open(path, os.O_RDONLY)
    try:
        end, offset = os.fstat(fd).st_size, 0
        while offset < end:
            try:
                data = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError:
                break
            hole = os.lseek(fd, data, os.SEEK_HOLE)
            found.append((data, hole))
            offset = hole
    finally:
        os.close(fd)
    return found


def test_copy_data_copies_data_only_in_range_and_paces_each_chunk(tmp_path: Path) -> None:
    src_path, dst_path = tmp_path / "src", tmp_path / "dst"
    expected = sparse(src_path, 64 * MiB, [(8 * MiB, 3 * MiB + 5), (40 * MiB, 4096)])
    paced = Paced()
    src = os.open(src_path, os.O_RDONLY)
    dst = os.open(dst_path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        copied = copy_data(src, dst, 0, 64 * MiB, paced, threading.Event())
        os.ftruncate(dst, 64 * MiB)
    finally:
        os.close(src)
        os.close(dst)
    # Extents are whole blocks: the last block of each is copied whole.
    assert copied == sum(paced.calls)
    assert 3 * MiB + 5 + 4096 <= copied <= 3 * MiB + 3 * 4096
    assert max(paced.calls) <= PIECE
    assert dst_path.read_bytes() == expected
    assert os.stat(dst_path).st_blocks * 512 <= 5 * MiB
    assert data_extents(dst_path)[0][0] == 8 * MiB  # the first data is where it was
    # A range: only the data inside [start, end), at the same offsets.
    part = tmp_path / "part"
    src = os.open(src_path, os.O_RDONLY)
    dst = os.open(part, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert copy_data(src, dst, 9 * MiB, 10 * MiB, paced, threading.Event()) == MiB
    finally:
        os.close(src)
        os.close(dst)
    assert data_extents(part) == [(9 * MiB, 10 * MiB)]
    with open(part, "rb") as f:
        f.seek(9 * MiB)
        assert f.read() == expected[9 * MiB : 10 * MiB]


def test_copy_to_pfs_keeps_holes_size_mode_owner_xattrs_and_times(
    dirs: tuple[Path, Path, int],
) -> None:
    backing, pfs, root = dirs
    (backing / "d").mkdir(mode=0o750)
    os.setxattr(backing / "d", "user.dir", b"d")
    path = backing / "d" / "f"
    expected = sparse(path, 1 << 30, [(100 * MiB, MiB)])  # ends with a hole
    if ROOT:
        os.setxattr(path, "trusted.t", b"t")
        os.chown(path, OTHER, OTHER)
        os.chown(backing / "d", OTHER, OTHER + 1)
    os.chmod(path, 0o4755)  # after the chown, which clears set-id bits
    os.setxattr(path, "user.color", b"blue")
    os.setxattr(path, XATTR_JOB, b"{}")  # the stage-out's own: not copied
    os.utime(path, ns=(1_000_000_000, 2_000_000_000))
    paced = Paced()
    src = os.open(path, os.O_RDONLY)
    try:
        copy_to_pfs(src, os.fstat(src), "d/f", pfs, root, paced, threading.Event())
    finally:
        os.close(src)
    copy = pfs / "d" / "f"
    st, orig = os.lstat(copy), os.lstat(path)
    assert sum(paced.calls) == MiB  # the data, not the holes
    assert st.st_size == 1 << 30 and st.st_blocks * 512 <= 2 * MiB
    assert data_extents(copy) == [(100 * MiB, 101 * MiB)]
    with open(copy, "rb") as f:
        f.seek(100 * MiB - 10)
        assert f.read(MiB + 20) == expected[100 * MiB - 10 : 101 * MiB + 10]
    assert stat.S_IMODE(st.st_mode) == 0o4755
    assert st.st_mtime_ns == 2_000_000_000
    assert os.getxattr(copy, "user.color") == b"blue"
    assert XATTR_JOB not in os.listxattr(copy)
    assert os.getxattr(pfs / "d", "user.dir") == b"d"
    assert stat.S_IMODE(os.stat(pfs / "d").st_mode) == 0o750
    assert os.stat(pfs / "d").st_mtime_ns == os.stat(backing / "d").st_mtime_ns
    if ROOT:
        assert (st.st_uid, st.st_gid) == (orig.st_uid, orig.st_gid) == (OTHER, OTHER)
        assert os.getxattr(copy, "trusted.t") == b"t"
        assert (os.stat(pfs / "d").st_uid, os.stat(pfs / "d").st_gid) == (OTHER, OTHER + 1)


def test_copy_back_keeps_holes(tmp_path: Path) -> None:
    pfs_copy, back = tmp_path / "pfs", tmp_path / "back"
    expected = sparse(pfs_copy, 256 * MiB, [(0, 4096), (200 * MiB, MiB)])
    back.write_bytes(b"")
    os.setxattr(back, XATTR_EVICTED, b"{}")
    paced = Paced()
    src = os.open(pfs_copy, os.O_RDONLY)
    path_fd = os.open(back, os.O_PATH)
    try:
        st = copy_back(src, path_fd, 3_000_000_000, paced)
    finally:
        os.close(src)
        os.close(path_fd)
    assert st.st_size == 256 * MiB and st.st_mtime_ns == 3_000_000_000
    assert sum(paced.calls) == MiB + 4096
    assert os.stat(back).st_blocks * 512 <= 2 * MiB
    assert back.read_bytes() == expected
    assert XATTR_EVICTED not in os.listxattr(back) and XATTR_COPIED in os.listxattr(back)


def test_parents_get_their_namesakes_metadata(dirs: tuple[Path, Path, int]) -> None:
    backing, pfs, root = dirs
    (backing / "a" / "b").mkdir(parents=True)
    os.chmod(backing / "a", 0o711)
    os.chmod(backing / "a" / "b", 0o2770)
    os.setxattr(backing / "a" / "b", "user.k", b"v")
    make_parents(pfs, root, "a/b")
    assert stat.S_IMODE(os.stat(pfs / "a").st_mode) == 0o711
    assert stat.S_IMODE(os.stat(pfs / "a" / "b").st_mode) == 0o2770
    assert os.getxattr(pfs / "a" / "b", "user.k") == b"v"


def test_directories_and_symlinks_are_reproduced(
    dirs: tuple[Path, Path, int], tree: PfsTree
) -> None:
    backing, pfs, _ = dirs
    (backing / "x" / "empty").mkdir(parents=True)
    os.chmod(backing / "x" / "empty", 0o700)
    os.setxattr(backing / "x" / "empty", "user.e", b"1")
    reproduced(tree, backing / "x" / "empty")
    os.symlink("../x/empty", backing / "x" / "rel")
    os.symlink("/etc/hostname", backing / "x" / "abs")
    if ROOT:
        os.chown(backing / "x" / "abs", OTHER, OTHER, follow_symlinks=False)
    os.utime(backing / "x" / "abs", ns=(5, 6_000_000_000), follow_symlinks=False)
    reproduced(tree, backing / "x" / "rel", backing / "x" / "abs")
    assert stat.S_IMODE(os.stat(pfs / "x" / "empty").st_mode) == 0o700
    assert os.getxattr(pfs / "x" / "empty", "user.e") == b"1"
    assert os.readlink(pfs / "x" / "rel") == "../x/empty"
    assert os.readlink(pfs / "x" / "abs") == "/etc/hostname"
    st = os.lstat(pfs / "x" / "abs")
    assert st.st_mtime_ns == 6_000_000_000
    if ROOT:
        assert (st.st_uid, st.st_gid) == (OTHER, OTHER)
    assert os.stat(pfs / "x").st_mtime_ns == os.stat(backing / "x").st_mtime_ns
    # A changed target replaces the link.
    os.unlink(backing / "x" / "rel")
    os.symlink("empty", backing / "x" / "rel")
    reproduced(tree, backing / "x" / "rel")
    assert os.readlink(pfs / "x" / "rel") == "empty"
    assert tree.pending() == []


def test_a_failed_reproduction_is_tried_again_after_the_next_that_succeeds(
    dirs: tuple[Path, Path, int], tree: PfsTree
) -> None:
    backing, pfs, _ = dirs
    (backing / "a").mkdir()
    (pfs / "a").write_bytes(b"")  # a file in the way
    reproduced(tree, backing / "a")
    assert tree.pending() == ["a"]
    (backing / "c").mkdir()
    (pfs / "c").write_bytes(b"")
    reproduced(tree, backing / "c")  # failed too: "a" not tried again
    assert tree.pending() == ["a", "c"]
    (pfs / "a").unlink()
    (pfs / "c").unlink()
    (backing / "b").mkdir()
    reproduced(tree, backing / "b")
    assert all((pfs / n).is_dir() for n in "abc") and tree.pending() == []


def test_the_names_of_a_file_are_one_file_on_the_pfs(dirs: tuple[Path, Path, int]) -> None:
    backing, pfs, root = dirs
    (backing / "d").mkdir()
    path = backing / "f"
    path.write_bytes(b"data")
    os.link(path, backing / "d" / "g")
    os.link(path, backing / "h")
    src = os.open(path, os.O_RDONLY)
    try:
        add_name(src, "f", "d/g", "h")
        os.unlink(backing / "h")  # one name gone: the others stay
        copy_to_pfs(src, os.fstat(src), "f", pfs, root, Paced(), threading.Event())
    finally:
        os.close(src)
    assert os.path.samefile(pfs / "f", pfs / "d" / "g")
    assert os.stat(pfs / "f").st_nlink == 2 and not (pfs / "h").exists()
    assert (pfs / "d" / "g").read_bytes() == b"data"
    assert XATTR_NAMES in os.listxattr(path)


class PacedHooks:
    """The drain's hooks: its pacing recorded in ``paced``."""

    def __init__(self) -> None:
        self.paced = Paced()

    def drain(self, job: JobInfo, nbytes: int) -> None:
        self.paced(nbytes)

    def report_buffer(self, job: JobInfo, resident: int, pending: int, error: str) -> None:
        pass


@contextlib.contextmanager
def running(dirs: tuple[Path, Path, int]) -> Iterator[tuple[StageOut, Paced]]:
    """A started stage-out of ``dirs`` (keeping the buffer's copies), stopped after."""
    backing, pfs, root = dirs
    hooks = PacedHooks()
    out = StageOut(root, backing, pfs, evict=False, hooks=hooks, report_interval=0.05)
    out.start()
    try:
        yield out, hooks.paced
    finally:
        out.stop()


@pytest.fixture
def stage(dirs: tuple[Path, Path, int]) -> Iterator[tuple[StageOut, Paced]]:
    with running(dirs) as started:
        yield started


def _write(stage: StageOut, path: Path, data: bytes) -> tuple[int, int]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    try:
        stage.opened(key)
        os.pwrite(fd, data, 0)
        stage.modified(key, fd, JOB)
    finally:
        os.close(fd)
    stage.released(key, str(path))
    return key


def test_a_change_of_metadata_goes_to_the_copy_without_its_data(
    stage: tuple[StageOut, Paced], dirs: tuple[Path, Path, int]
) -> None:
    out, paced = stage
    backing, pfs, _ = dirs
    path = backing / "f"
    key = _write(out, path, os.urandom(2 * MiB))
    wait_until(lambda: out.copies == 1 and out.pending_copies() == 0, message="the copy")
    drained = sum(paced.calls)
    os.chmod(path, 0o600)
    os.setxattr(path, "user.late", b"x")
    os.utime(path, ns=(7, 8_000_000_000))
    path_fd = os.open(path, os.O_PATH)
    try:
        out.restamped(key, path_fd)
        os.link(path, backing / "second")
        out.restamped(key, path_fd, str(backing / "second"))
    finally:
        os.close(path_fd)
    st = os.stat(pfs / "f")
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_mtime_ns == 8_000_000_000
    assert os.getxattr(pfs / "f", "user.late") == b"x"
    assert os.path.samefile(pfs / "f", pfs / "second")
    # Marked copied as it is now: nothing copied again, even after a restart's check.
    assert os.getxattr(path, XATTR_COPIED) == f"8000000000:{2 * MiB}".encode()
    out.released(key, str(path))  # a close queues it: nothing to copy
    wait_until(lambda: out.pending_copies() == 0, message="the queue")
    assert sum(paced.calls) == drained and out.copies == 1


def test_a_name_that_cannot_be_linked_leaves_the_copy_good(
    dirs: tuple[Path, Path, int], caplog: pytest.LogCaptureFixture
) -> None:
    backing, pfs, root = dirs
    path = backing / "f"
    path.write_bytes(b"data")
    os.link(path, backing / "g")
    (pfs / "g").mkdir()  # a directory in the way of the second name
    (pfs / "g" / "x").write_bytes(b"")
    src = os.open(path, os.O_RDONLY)
    try:
        add_name(src, "f", "g")
        copy_to_pfs(src, os.fstat(src), "f", pfs, root, Paced(), threading.Event())
    finally:
        os.close(src)
    assert (pfs / "f").read_bytes() == b"data" and (pfs / "g").is_dir()
    assert "cannot link g to f" in caplog.text


def test_after_a_restart_a_change_of_metadata_still_goes_to_the_copy(
    dirs: tuple[Path, Path, int],
) -> None:
    backing, pfs, _ = dirs
    path = backing / "f"
    with running(dirs) as (out, _):
        _write(out, path, os.urandom(MiB))
        wait_until(lambda: out.copies == 1, message="the copy")
    with running(dirs) as (out, paced):  # restarted: the copy is known from its mark only
        st = os.stat(path)
        key = (st.st_dev, st.st_ino)
        os.chmod(path, 0o640)
        os.utime(path, ns=(3, 4_000_000_000))
        path_fd = os.open(path, os.O_PATH)
        try:
            out.restamped(key, path_fd)
        finally:
            os.close(path_fd)
        copy = os.stat(pfs / "f")
        assert (stat.S_IMODE(copy.st_mode), copy.st_mtime_ns) == (0o640, 4_000_000_000)
        out.released(key, str(path))
        wait_until(lambda: out.pending_copies() == 0, message="the queue")
        assert paced.calls == [] and out.copies == 0  # no data copied again


def test_an_attribute_the_pfs_refuses_is_skipped(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "link"
    src.write_bytes(b"")
    os.setxattr(src, "user.kept", b"1")
    os.symlink("src", dst)  # Linux refuses user.* xattrs on a symlink: EPERM
    copy_xattrs(src, str(dst), follow_symlinks=False)
    assert os.listxattr(dst, follow_symlinks=False) == []
