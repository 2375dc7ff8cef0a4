"""Which files bypass the mount's page cache (``--direct-io``), and shared ``mmap`` of them.

A read through a file that bypasses the page cache always reaches the daemon, so it sees a
change made to BACKING behind the mount's back; a cached file keeps showing the bytes it
already read (the mount never revalidates its pages: no ``auto_inval_data``). That difference
is how these tests see which files went direct.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from support import MountProcess

pytestmark = pytest.mark.integration

OLD, NEW = b"old-bytes", b"NEW-BYTES"


def reads_bypass_the_cache(mount: MountProcess, access: int) -> bool:
    """Whether a file of ``mount`` opened with ``access`` reads past the page cache."""
    name = f"probe-{access}"
    (mount.mountpoint / name).write_bytes(OLD)
    fd = os.open(mount.mountpoint / name, access)
    try:
        assert os.pread(fd, len(OLD), 0) == OLD  # now in the page cache, if it is cached
        (mount.backing / name).write_bytes(NEW)  # behind the mount's back
        seen = os.pread(fd, len(OLD), 0)
    finally:
        os.close(fd)
    assert seen in (OLD, NEW)
    return seen == NEW


@pytest.mark.parametrize("mode", ["writes", "all", "none"])
def test_which_files_bypass_the_page_cache(
    fuse_mount: Callable[..., MountProcess], tmp_path: Path, libfuse: str, mode: str
) -> None:
    # Files that could be mapped shared go direct only where the kernel was asked to allow
    # mapping them (libfuse 3.14 here): never on libfuse 2.
    mount = fuse_mount(tmp_path / "b", tmp_path / "m", "--direct-io", mode)
    assert f"direct I/O for {mode}" in mount.log_text
    mappable_direct = libfuse == "3" and mode != "none"
    assert reads_bypass_the_cache(mount, os.O_RDWR) == mappable_direct
    assert reads_bypass_the_cache(mount, os.O_RDONLY) == (mappable_direct and mode == "all")


def test_a_cached_reader_sees_what_a_direct_writer_wrote(
    fuse_mount: Callable[..., MountProcess], tmp_path: Path
) -> None:
    mount = fuse_mount(tmp_path / "b", tmp_path / "m")
    path = mount.mountpoint / "f"
    path.write_bytes(b"a" * 10_000)
    reader = os.open(path, os.O_RDONLY)
    writer = os.open(path, os.O_WRONLY)  # direct on both libraries
    try:
        assert os.pread(reader, 10_000, 0) == b"a" * 10_000  # cached
        assert os.pwrite(writer, b"b" * 5_000, 4_000) == 5_000
        assert os.pread(reader, 10_000, 0) == b"a" * 4_000 + b"b" * 5_000 + b"a" * 1_000
    finally:
        os.close(reader)
        os.close(writer)


def test_a_file_open_for_writing_maps_shared(
    fuse_mount: Callable[..., MountProcess], tmp_path: Path
) -> None:
    # On libfuse 3 this file is direct; a shared mapping of it must still work and agree with
    # reads and writes through the descriptor and with BACKING.
    mount = fuse_mount(tmp_path / "b", tmp_path / "m")
    path = mount.mountpoint / "f"
    path.write_bytes(b"a" * 8192)
    fd = os.open(path, os.O_RDWR)
    try:
        with mmap.mmap(fd, 8192) as mapping:  # MAP_SHARED, read and write
            mapping[0:5] = b"hello"
            mapping.flush()
            assert os.pread(fd, 5, 0) == b"hello"
            assert (mount.backing / "f").read_bytes()[:5] == b"hello"
            assert os.pwrite(fd, b"WORLD", 4096) == 5
            assert mapping[4096:4101] == b"WORLD"
    finally:
        os.close(fd)
    assert path.read_bytes() == b"hello" + b"a" * 4091 + b"WORLD" + b"a" * 4091


def test_o_direct_io_maps_shared_where_the_kernel_was_asked(
    fuse_mount: Callable[..., MountProcess], tmp_path: Path, libfuse: str
) -> None:
    # -o direct_io makes every file direct. libfuse 2 cannot have the kernel allow shared
    # mappings of such files (ENODEV): the reason the mount never makes a mappable file
    # direct there on its own.
    mount = fuse_mount(tmp_path / "b", tmp_path / "m", "-o", "direct_io")
    (mount.backing / "f").write_bytes(b"0123456789" * 500)
    with open(mount.mountpoint / "f", "rb") as f:
        if libfuse == "2":
            with pytest.raises(OSError) as refused:
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            assert refused.value.errno == errno.ENODEV
        else:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapping:
                assert mapping[10:20] == b"0123456789"
