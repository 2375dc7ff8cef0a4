"""Which files bypass the mount's page cache (``--direct-io``), and shared ``mmap`` of them.

A read through a file that bypasses the page cache always reaches the daemon, so it sees a
change made to BACKING behind the mount's back; a cached file keeps showing the bytes it
already read (the mount never revalidates its pages: no ``auto_inval_data``). That difference
is how these tests see which files went direct.
"""

from __future__ import annotations

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


def test_path_api_options_are_refused_with_what_to_use_instead(
    fuse_mount: Callable[..., MountProcess], tmp_path: Path
) -> None:
    # -o direct_io, attr_timeout, use_ino...: options of libfuse's path-based API, which the
    # mount does not use. Refused before anything is mounted, naming the mount's own option.
    for option, instead in (("direct_io", "--direct-io all"), ("attr_timeout=5", "--attr-timeout")):
        with pytest.raises(AssertionError) as failed:
            fuse_mount(tmp_path / "b", tmp_path / "m", "-o", option)
        assert f"-o {option.split('=')[0]} is an option of libfuse's path-based API" in str(
            failed.value
        )
        assert instead in str(failed.value)
        assert not os.path.ismount(tmp_path / "m")
