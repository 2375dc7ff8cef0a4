"""`fuse_shim.syscalls`: the libc calls `os` lacks, against a temporary directory."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from burstctl.common import syscalls

NOW = -1  # any value the caller reserves for "now"
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root")
KEEP_SIZE, PUNCH_HOLE = 0x01, 0x02  # FALLOC_FL_*


@pytest.fixture
def dir_fd(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def path_handle(path: Path) -> int:
    return os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)


def errno_of(call: object, *args: object, **kwargs: object) -> OSError:
    assert callable(call)
    with pytest.raises(OSError) as info:
        call(*args, **kwargs)
    return info.value


def test_renameat2_without_flags_replaces(tmp_path: Path, dir_fd: int) -> None:
    (tmp_path / "a").write_bytes(b"A")
    (tmp_path / "b").write_bytes(b"B")
    syscalls.renameat2(dir_fd, b"a", dir_fd, b"b", 0)
    assert (tmp_path / "b").read_bytes() == b"A" and not (tmp_path / "a").exists()


def test_renameat2_noreplace(tmp_path: Path, dir_fd: int) -> None:
    (tmp_path / "a").write_bytes(b"A")
    (tmp_path / "b").write_bytes(b"B")
    err = errno_of(syscalls.renameat2, dir_fd, b"a", dir_fd, b"b", syscalls.RENAME_NOREPLACE)
    assert err.errno == errno.EEXIST and err.filename == "a"
    assert (tmp_path / "b").read_bytes() == b"B"
    (tmp_path / "d").mkdir()
    sub = os.open(tmp_path / "d", os.O_RDONLY | os.O_DIRECTORY)
    try:
        syscalls.renameat2(dir_fd, b"a", sub, b"moved", syscalls.RENAME_NOREPLACE)
    finally:
        os.close(sub)
    assert (tmp_path / "d" / "moved").read_bytes() == b"A"


def test_renameat2_exchange(tmp_path: Path, dir_fd: int) -> None:
    (tmp_path / "a").write_bytes(b"A")
    (tmp_path / "d").mkdir()
    syscalls.renameat2(dir_fd, b"a", dir_fd, b"d", syscalls.RENAME_EXCHANGE)
    assert (tmp_path / "a").is_dir() and (tmp_path / "d").read_bytes() == b"A"
    err = errno_of(syscalls.renameat2, dir_fd, b"a", dir_fd, b"none", syscalls.RENAME_EXCHANGE)
    assert err.errno == errno.ENOENT
    err = errno_of(syscalls.renameat2, dir_fd, b"missing", dir_fd, b"d", 0)
    assert (err.errno, err.filename) == (errno.ENOENT, "missing")
    err = errno_of(syscalls.renameat2, dir_fd, b"a", dir_fd, b"d", 1 << 20)  # unknown flag
    assert err.errno == errno.EINVAL


@ROOT_ONLY
def test_chown_node_through_a_path_handle(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    (tmp_path / "target").write_bytes(b"")
    os.symlink("target", tmp_path / "l")
    for name in ("f", "l"):
        fd = path_handle(tmp_path / name)
        try:
            syscalls.chown_node(fd, 1234, -1)  # -1: the group is left alone
            st = os.lstat(tmp_path / name)
            assert (st.st_uid, st.st_gid) == (1234, 0)
            syscalls.chown_node(fd, -1, 5678)
            assert os.lstat(tmp_path / name).st_uid == 1234
            assert os.lstat(tmp_path / name).st_gid == 5678
            if name == "l":  # the link itself, never its target
                target = os.stat(tmp_path / "l")
                assert (target.st_uid, target.st_gid) == (0, 0)
        finally:
            os.close(fd)
    (tmp_path / "d").mkdir()
    fd = os.open(tmp_path / "d", os.O_RDONLY | os.O_DIRECTORY)  # any handle, not only O_PATH
    try:
        syscalls.chown_node(fd, 42, 43)
    finally:
        os.close(fd)
    assert (os.stat(tmp_path / "d").st_uid, os.stat(tmp_path / "d").st_gid) == (42, 43)


def test_chown_node_errors() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    os.close(write_end)
    assert errno_of(syscalls.chown_node, write_end, 0, 0).errno == errno.EBADF


def test_chown_node_of_someone_elses_file_is_eperm_without_root(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root may give files away")
    (tmp_path / "f").write_bytes(b"")
    fd = path_handle(tmp_path / "f")
    try:
        assert errno_of(syscalls.chown_node, fd, 0, -1).errno == errno.EPERM
    finally:
        os.close(fd)


@pytest.mark.parametrize("handle", [True, False], ids=["futimens", "utimensat"])
def test_set_times(tmp_path: Path, handle: bool) -> None:
    (tmp_path / "f").write_bytes(b"x")
    os.utime(tmp_path / "f", ns=(1_000, 2_000))
    fd = os.open(tmp_path / "f", os.O_RDONLY) if handle else path_handle(tmp_path / "f")
    try:
        syscalls.set_times(fd, None, 5_000_000_007, now=NOW, handle=handle)
        st = os.stat(tmp_path / "f")
        assert (st.st_atime_ns, st.st_mtime_ns) == (1_000, 5_000_000_007)
        syscalls.set_times(fd, 3, None, now=NOW, handle=handle)
        st = os.stat(tmp_path / "f")
        assert (st.st_atime_ns, st.st_mtime_ns) == (3, 5_000_000_007)
        before = time.time_ns() - 50_000_000  # the kernel's clock is coarse
        syscalls.set_times(fd, NOW, None, now=NOW, handle=handle)
        st = os.stat(tmp_path / "f")
        assert st.st_atime_ns >= before and st.st_mtime_ns == 5_000_000_007
        syscalls.set_times(fd, None, NOW, now=NOW, handle=handle)
        assert os.stat(tmp_path / "f").st_mtime_ns >= before
        syscalls.set_times(fd, 0, 0, now=NOW, handle=handle)  # 0 is a time, not "now"
        st = os.stat(tmp_path / "f")
        assert (st.st_atime_ns, st.st_mtime_ns) == (0, 0)
    finally:
        os.close(fd)
    assert errno_of(syscalls.set_times, fd, 1, 1, now=NOW, handle=handle).errno == errno.EBADF


def test_set_times_of_a_symbolic_link_is_the_links(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    os.utime(tmp_path / "f", ns=(1, 1))
    os.symlink("f", tmp_path / "l")
    fd = path_handle(tmp_path / "l")
    try:
        syscalls.set_times(fd, 7_000_000_000, 8_000_000_000, now=NOW, handle=False)
    finally:
        os.close(fd)
    link = os.lstat(tmp_path / "l")
    assert (link.st_atime_ns, link.st_mtime_ns) == (7_000_000_000, 8_000_000_000)
    assert os.stat(tmp_path / "f").st_mtime_ns == 1


def test_fallocate(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        syscalls.fallocate(fd, 0, 0, 1 << 20)
        assert os.fstat(fd).st_size == 1 << 20
        syscalls.fallocate(fd, KEEP_SIZE, 0, 4 << 20)
        st = os.fstat(fd)
        assert st.st_size == 1 << 20 and st.st_blocks * 512 >= 4 << 20
        os.pwrite(fd, b"x" * 8192, 0)
        syscalls.fallocate(fd, PUNCH_HOLE | KEEP_SIZE, 0, 4096)
        assert os.pread(fd, 8192, 0) == b"\0" * 4096 + b"x" * 4096
        err = errno_of(syscalls.fallocate, fd, PUNCH_HOLE, 0, 4096)  # needs KEEP_SIZE
        assert err.errno == errno.EOPNOTSUPP
        assert errno_of(syscalls.fallocate, fd, 0, 0, 0).errno == errno.EINVAL
    finally:
        os.close(fd)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        assert errno_of(syscalls.fallocate, fd, 0, 0, 4096).errno == errno.EBADF
    finally:
        os.close(fd)
