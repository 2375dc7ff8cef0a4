"""Regression tests for the POSIX findings of issue 16 ("The mount under real programs").

Each test goes through a real mount (`fuse_mount`, on libfuse 2 and 3) and compares it with what
a local file system does: the BACKING directory behind the mount, or a reference directory next
to it. They are independent of how the mount is implemented.

- Finding 1: ``renameat2`` flags (``RENAME_EXCHANGE``, ``RENAME_NOREPLACE``) are passed through
  or refused with EINVAL, never downgraded to a plain rename.
- Finding 2 (pjdfstest ``chmod/12.t``): a write clears set-user-ID / set-group-ID as the kernel
  does on a local file system.
- Finding 3: paths of 4,096 bytes or more below the mount root, reached relatively.
- Finding 4: ``SEEK_DATA`` / ``SEEK_HOLE`` are passed through.
- Finding 5: descriptor operations on a file unlinked or replaced while open.
- Finding 7: writes through a shared ``mmap`` are booked to the writer's job.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from fake_controller import FakeController
from support import MountProcess, clean_env, is_mounted, run_as
from test_posix import Outcome, attempt

from burstctl.node.attribution import Attributor, Caller

pytestmark = pytest.mark.integration

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# Writing as another user (support.run_as) and giving files away (chown) need root.
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory every user can reach (tmp_path's parents are root-only)."""
    path = Path(tempfile.mkdtemp(prefix="burstctl-findings-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        if is_mounted(path / "mnt"):  # only if the test failed before its mount was stopped
            subprocess.run(["fusermount", "-u", "-z", str(path / "mnt")], check=False)
        shutil.rmtree(path)


# ------------------------------------------------------------------------ finding 1: renameat2

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = _libc.renameat2
_renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
_renameat2.restype = ctypes.c_int


def renameat2(old: Path, new: Path, flags: int) -> Outcome:
    """``renameat2(AT_FDCWD, old, AT_FDCWD, new, flags)``: ``("ok", 0)`` or ``("err", name)``."""
    if _renameat2(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), flags) == 0:
        return ("ok", 0)
    code = ctypes.get_errno()
    return ("err", errno.errorcode.get(code, str(code)))


def contents(d: Path) -> dict[str, Any]:
    """Name -> bytes of a file, or the sorted listing of a directory (one level down)."""
    out: dict[str, Any] = {}
    for name in sorted(os.listdir(d)):
        path = d / name
        out[name] = sorted(os.listdir(path)) if path.is_dir() else path.read_bytes()
    return out


def test_rename_exchange_swaps_two_files(mounted: MountProcess, libfuse: str) -> None:
    mnt, backing = mounted.mountpoint, mounted.backing
    (mnt / "ra").write_bytes(b"A" * 100)
    (mnt / "rb").write_bytes(b"B" * 200)
    before = contents(mnt)

    result = renameat2(mnt / "ra", mnt / "rb", RENAME_EXCHANGE)

    if libfuse == "2":  # the FUSE 2 protocol has no flags: refused, nothing changed
        assert result == ("err", "EINVAL")
        assert contents(mnt) == contents(backing) == before
        return
    assert result == ("ok", 0)
    swapped = {"ra": b"B" * 200, "rb": b"A" * 100}
    assert contents(mnt) == swapped
    assert contents(backing) == swapped
    # Both names are usable at once, to open and to create again.
    for name in ("ra", "rb"):
        fd = os.open(mnt / name, os.O_RDWR)
        os.close(fd)
        os.unlink(mnt / name)
        fd = os.open(mnt / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, name.encode())
        os.close(fd)
    assert contents(mnt) == contents(backing) == {"ra": b"ra", "rb": b"rb"}


def test_rename_exchange_of_a_file_and_a_directory(mounted: MountProcess, libfuse: str) -> None:
    mnt, backing = mounted.mountpoint, mounted.backing
    (mnt / "file").write_bytes(b"a file")
    (mnt / "dir").mkdir()
    (mnt / "dir" / "inside").write_bytes(b"x")
    before = contents(mnt)

    result = renameat2(mnt / "file", mnt / "dir", RENAME_EXCHANGE)

    if libfuse == "2":
        assert result == ("err", "EINVAL")
        assert contents(mnt) == contents(backing) == before
        return
    assert result == ("ok", 0)
    swapped = {"dir": b"a file", "file": ["inside"]}
    assert contents(mnt) == swapped
    assert contents(backing) == swapped
    assert (mnt / "file" / "inside").read_bytes() == b"x"
    assert stat.S_ISREG(os.stat(mnt / "dir").st_mode)
    assert os.stat(mnt / "file").st_ino == os.stat(backing / "file").st_ino


def test_rename_noreplace_onto_an_existing_name_is_refused(
    mounted: MountProcess, libfuse: str
) -> None:
    mnt, backing = mounted.mountpoint, mounted.backing
    (mnt / "ra").write_bytes(b"A")
    (mnt / "rb").write_bytes(b"B")
    before = contents(mnt)

    result = renameat2(mnt / "ra", mnt / "rb", RENAME_NOREPLACE)

    # EEXIST as on a local file system; libfuse 2 may refuse every flag with EINVAL instead.
    assert result == ("err", "EEXIST") or (libfuse == "2" and result == ("err", "EINVAL"))
    assert contents(mnt) == contents(backing) == before


def test_rename_noreplace_onto_a_free_name(mounted: MountProcess, libfuse: str) -> None:
    mnt, backing = mounted.mountpoint, mounted.backing
    (mnt / "ra").write_bytes(b"A")

    result = renameat2(mnt / "ra", mnt / "free", RENAME_NOREPLACE)

    if libfuse == "2":
        assert result == ("err", "EINVAL")
        assert contents(mnt) == contents(backing) == {"ra": b"A"}
        return
    assert result == ("ok", 0)
    assert contents(mnt) == contents(backing) == {"free": b"A"}


# ------------------------------------------------------------------------ finding 2: chmod/12


def _write_a_byte(path: str, flags: int, truncate: bool) -> list[Any]:
    # Runs in a child process as another user (see support.run_as): os and errno only.
    try:
        fd = os.open(path, flags)
        try:
            if truncate:
                os.ftruncate(fd, 0)
            else:
                os.write(fd, b"x")
        finally:
            os.close(fd)
        return ["ok"]
    except OSError as err:
        return ["err", errno.errorcode.get(err.errno or 0, str(err.errno))]


def _make_file(path: Path, owner: int, mode: int) -> None:
    path.write_bytes(b"")
    os.chown(path, owner, owner)
    os.chmod(path, mode)  # after chown, which clears the set-id bits
    assert stat.S_IMODE(os.stat(path).st_mode) == mode


def _mode_after(
    root: Path, owner: int, mode: int, writer: int, flags: int, truncate: bool = False
) -> tuple[list[Any], int]:
    path = root / "f"
    _make_file(path, owner, mode)
    if writer == 0:
        result = _write_a_byte(str(path), flags, truncate)
    else:
        result = cast(list[Any], run_as(writer, writer, _write_a_byte, str(path), flags, truncate))
    return result, stat.S_IMODE(os.stat(path).st_mode)


def _setid_mount(
    fuse_mount: Callable[..., MountProcess], world_dir: Path, *args: str
) -> tuple[Path, Path, Path]:
    backing, mnt, reference = world_dir / "backing", world_dir / "mnt", world_dir / "ref"
    fuse_mount(backing, mnt, "--allow-other", *args)
    backing.chmod(0o755)
    reference.mkdir(mode=0o755)
    return backing, mnt, reference


@pytest.mark.parametrize("flags", [os.O_WRONLY, os.O_RDWR], ids=["wronly", "rdwr"])
@pytest.mark.parametrize("mode", [0o4777, 0o2777, 0o6777], ids=oct)
@needs_root
def test_a_write_by_a_non_owner_clears_set_id_bits(
    fuse_mount: Callable[..., MountProcess], world_dir: Path, mode: int, flags: int
) -> None:
    # pjdfstest chmod/12.t: root's file, written by nobody, with the default options.
    backing, mnt, reference = _setid_mount(fuse_mount, world_dir)
    expected = _mode_after(reference, 0, mode, 65534, flags)
    assert expected == (["ok"], 0o777)  # what the local file system does

    assert _mode_after(mnt, 0, mode, 65534, flags) == expected
    assert stat.S_IMODE(os.stat(backing / "f").st_mode) == 0o777


@needs_root
def test_a_truncate_by_a_non_owner_clears_set_id_bits(
    fuse_mount: Callable[..., MountProcess], world_dir: Path
) -> None:
    backing, mnt, reference = _setid_mount(fuse_mount, world_dir)
    expected = _mode_after(reference, 0, 0o6777, 65534, os.O_WRONLY, truncate=True)
    assert expected == (["ok"], 0o777)

    assert _mode_after(mnt, 0, 0o6777, 65534, os.O_WRONLY, truncate=True) == expected
    assert stat.S_IMODE(os.stat(backing / "f").st_mode) == 0o777


@needs_root
def test_a_write_by_the_unprivileged_owner_clears_set_user_id(
    fuse_mount: Callable[..., MountProcess], world_dir: Path
) -> None:
    backing, mnt, reference = _setid_mount(fuse_mount, world_dir)
    expected = _mode_after(reference, 65534, 0o4755, 65534, os.O_WRONLY)
    assert expected == (["ok"], 0o755)

    assert _mode_after(mnt, 65534, 0o4755, 65534, os.O_WRONLY) == expected
    assert stat.S_IMODE(os.stat(backing / "f").st_mode) == 0o755


@needs_root
@pytest.mark.parametrize("flags", [os.O_WRONLY, os.O_RDWR], ids=["wronly", "rdwr"])
def test_a_write_by_root_keeps_set_id_bits(
    fuse_mount: Callable[..., MountProcess], world_dir: Path, flags: int
) -> None:
    # CAP_FSETID: nothing is dropped (the fix must not clear bits for every writer).
    backing, mnt, reference = _setid_mount(fuse_mount, world_dir)
    expected = _mode_after(reference, 65534, 0o6777, 0, flags)
    assert expected == (["ok"], 0o6777)

    assert _mode_after(mnt, 65534, 0o6777, 0, flags) == expected
    assert stat.S_IMODE(os.stat(backing / "f").st_mode) == 0o6777


@needs_root
def test_a_write_by_a_non_owner_clears_set_id_bits_without_direct_io(
    fuse_mount: Callable[..., MountProcess], world_dir: Path
) -> None:
    backing, mnt, reference = _setid_mount(fuse_mount, world_dir, "--direct-io", "none")
    expected = _mode_after(reference, 0, 0o6777, 65534, os.O_WRONLY)
    assert expected == (["ok"], 0o777)

    assert _mode_after(mnt, 0, 0o6777, 65534, os.O_WRONLY) == expected
    assert stat.S_IMODE(os.stat(backing / "f").st_mode) == 0o777


def _mode_as_stat_shows(path: Path) -> int:
    """The mode bits ``stat -c %a`` shows: coreutils asks statx for the mode alone, which the
    kernel answers from its cache unless told the attributes changed (os.stat asks for the
    size and times too, which the kernel refetches after a write of its own accord)."""
    shown = subprocess.run(
        ["stat", "-c", "%a", str(path)], capture_output=True, text=True, check=True
    )
    return int(shown.stdout, 8)


@needs_root
@pytest.mark.parametrize("mode", [0o4777, 0o6777], ids=oct)
def test_stat_right_after_a_non_owners_append_shows_the_cleared_mode(
    fuse_mount: Callable[..., MountProcess], world_dir: Path, mode: int
) -> None:
    # The daemon clears the bits (above); the kernel must drop the mode it cached, whatever
    # --attr-timeout allows it to keep.
    backing, mnt, _ = _setid_mount(fuse_mount, world_dir, "--attr-timeout", "3600")
    _make_file(mnt / "f", 0, mode)
    assert _mode_as_stat_shows(mnt / "f") == mode  # cached now
    append = os.O_WRONLY | os.O_APPEND
    assert run_as(65534, 65534, _write_a_byte, str(mnt / "f"), append, False) == ["ok"]
    assert stat.S_IMODE(os.stat(backing / "f").st_mode) == 0o777
    assert _mode_as_stat_shows(mnt / "f") == 0o777


# ------------------------------------------------------------------------ finding 3: deep paths

DEPTH = 30  # directories of NAME_LENGTH-byte names: 6,030 bytes below the root, > PATH_MAX
NAME_LENGTH = 200


def _deep_tree(root: Path) -> list[Outcome]:
    """Builds a chain of DEPTH directories by names relative to directory fds, works on a file
    at the bottom, then removes it all; stops at the first error (recorded)."""
    out: list[Outcome] = []
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
    names = [f"{depth:03d}".ljust(NAME_LENGTH, "d") for depth in range(DEPTH)]

    def step(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        out.append(attempt(fn, *args, **kwargs))
        return out[-1][0] == "ok"

    try:
        for name in names:
            if not step(os.mkdir, name, 0o755, dir_fd=fds[-1]):
                return out
            if not step(os.open, name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]):
                return out
            fds.append(out.pop()[1])
        bottom = fds[-1]

        def create_write_read() -> bytes:
            fd = os.open("f", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o640, dir_fd=bottom)
            try:
                os.write(fd, b"at the bottom")
                return os.pread(fd, 100, 0)
            finally:
                os.close(fd)

        def read(name: str) -> bytes:
            fd = os.open(name, os.O_RDONLY, dir_fd=bottom)
            try:
                return os.read(fd, 100)
            finally:
                os.close(fd)

        def listdir(name: str) -> list[str]:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=bottom)
            try:
                return sorted(os.listdir(fd))
            finally:
                os.close(fd)

        steps: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = [
            (create_write_read, (), {}),
            (lambda: stat.S_IMODE(os.stat("f", dir_fd=bottom).st_mode), (), {}),
            (lambda: os.stat("f", dir_fd=bottom).st_size, (), {}),
            (os.rename, ("f", "g"), {"src_dir_fd": bottom, "dst_dir_fd": bottom}),
            (read, ("g",), {}),
            (lambda: sorted(os.listdir(bottom)), (), {}),
            (os.mkdir, ("sub",), {"dir_fd": bottom}),
            (os.rename, ("g", "sub/h"), {"src_dir_fd": bottom, "dst_dir_fd": bottom}),
            (listdir, ("sub",), {}),
            (os.unlink, ("sub/h",), {"dir_fd": bottom}),
            (os.rmdir, ("sub",), {"dir_fd": bottom}),
        ]
        for fn, args, kwargs in steps:
            if not step(fn, *args, **kwargs):
                return out
        while len(fds) > 1:
            os.close(fds.pop())
            if not step(os.rmdir, names[len(fds) - 1], dir_fd=fds[-1]):
                return out
        out.append(("ok", sorted(os.listdir(fds[0]))))
        return out
    finally:
        for fd in fds:
            os.close(fd)


def _depth_of(root: Path) -> tuple[int, list[str]]:
    """How deep the chain below ``root`` goes and what its bottom holds (fd-relative walk)."""
    depth, bottom = 0, sorted(os.listdir(root))
    for _, dirnames, filenames, _ in os.fwalk(root):
        if dirnames:
            depth += 1
        else:
            bottom = sorted(filenames)
    return depth, bottom


def test_paths_longer_than_path_max_below_the_mount_root(
    mounted: MountProcess, tmp_path: Path
) -> None:
    reference = tmp_path / "reference"
    reference.mkdir()
    (mounted.mountpoint / "deep").mkdir()

    expected = _deep_tree(reference)
    assert len(expected) == 2 * DEPTH + 11 + 1 and all(o[0] == "ok" for o in expected)

    assert _deep_tree(mounted.mountpoint / "deep") == expected
    assert os.listdir(mounted.backing / "deep") == []


def test_a_deep_tree_through_the_mount_is_in_backing(mounted: MountProcess) -> None:
    mnt = mounted.mountpoint
    fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    fds = [fd]
    try:
        for depth in range(DEPTH):
            name = f"{depth:03d}".ljust(NAME_LENGTH, "d")
            os.mkdir(name, dir_fd=fds[-1])
            fds.append(os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
        created = os.open("leaf", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fds[-1])
        os.write(created, b"leaf")
        os.close(created)
    finally:
        for opened in fds:
            os.close(opened)
    assert _depth_of(mounted.backing) == (DEPTH, ["leaf"])
    assert _depth_of(mnt) == (DEPTH, ["leaf"])


# ------------------------------------------------------------------------ finding 4: lseek


def _data_and_hole(path: Path) -> list[Outcome]:
    fd = os.open(path, os.O_RDONLY)
    try:
        data = attempt(os.lseek, fd, 0, os.SEEK_DATA)
        hole = attempt(os.lseek, fd, data[1] if data[0] == "ok" else 0, os.SEEK_HOLE)
        past = attempt(os.lseek, fd, 600 * MiB, os.SEEK_DATA)  # no data after: ENXIO
        beyond = attempt(os.lseek, fd, 2 * GiB, os.SEEK_HOLE)  # past the end: ENXIO
        return [data, hole, past, beyond]
    finally:
        os.close(fd)


def test_seek_data_and_seek_hole_are_passed_through(
    mounted: MountProcess, libfuse: str, request: pytest.FixtureRequest
) -> None:
    if libfuse == "2":
        request.applymarker(
            pytest.mark.xfail(
                reason="libfuse 2 has no lseek operation: the kernel answers SEEK_DATA / "
                "SEEK_HOLE itself, as if the whole file were data",
                strict=True,
            )
        )
    path = mounted.mountpoint / "sparse"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.ftruncate(fd, 1 * GiB)
        os.pwrite(fd, b"thirteen byte", 512 * MiB)
    finally:
        os.close(fd)
    expected = _data_and_hole(mounted.backing / "sparse")
    data, hole = expected[0], expected[1]
    # What the local file system says: data in the block at 512 MiB, a hole after it.
    assert data[0] == "ok" and 512 * MiB - 64 * KiB <= data[1] <= 512 * MiB, expected
    assert hole[0] == "ok" and 512 * MiB < hole[1] < 1 * GiB, expected
    assert expected[2:] == [("err", "ENXIO"), ("err", "ENXIO")]

    assert _data_and_hole(path) == expected


# ------------------------------------------------------------------------ finding 5: open files


def _on_an_open_file(d: Path, replace: bool) -> list[Outcome]:
    """Opens ``d/f``, unlinks it (or renames another file over it), then works on the fd."""
    path = d / "f"
    path.write_bytes(b"original")
    os.chmod(path, 0o644)
    fd = os.open(path, os.O_RDWR)
    if replace:
        (d / "new").write_bytes(b"replacement")
        os.chmod(d / "new", 0o640)
        os.rename(d / "new", path)
    else:
        os.unlink(path)

    def fstat() -> tuple[int, int, int, int]:
        st = os.fstat(fd)
        return (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_size)

    out: list[Outcome] = []
    try:
        out.append(attempt(fstat))
        out.append(attempt(os.fchmod, fd, 0o600))
        out.append(attempt(fstat))
        out.append(attempt(os.fchown, fd, os.getuid(), os.getgid()))
        out.append(attempt(os.fchown, fd, 65534, 65534))
        out.append(attempt(fstat))
        out.append(attempt(os.utime, fd, ns=(1_000_000_000, 2_000_000_123)))
        out.append(attempt(lambda: (os.fstat(fd).st_atime_ns, os.fstat(fd).st_mtime_ns)))
        out.append(attempt(os.ftruncate, fd, 4))
        out.append(attempt(fstat))
        out.append(attempt(os.pwrite, fd, b"XY", 6))
        out.append(attempt(os.pread, fd, 100, 0))
        out.append(attempt(fstat))
        out.append(attempt(lambda: os.fstat(fd).st_nlink))
    finally:
        os.close(fd)
    if replace:  # the file now under the name is untouched
        st = os.stat(path)
        out.append(("replacement", (path.read_bytes(), stat.S_IMODE(st.st_mode), st.st_uid)))
    out.append(("names", sorted(os.listdir(d))))
    return out


@pytest.mark.parametrize("replace", [False, True], ids=["unlinked", "replaced"])
@needs_root
def test_descriptor_operations_on_a_file_gone_from_its_name(
    mounted: MountProcess, tmp_path: Path, replace: bool
) -> None:
    reference = tmp_path / "reference"
    reference.mkdir()
    expected = _on_an_open_file(reference, replace)
    assert all(o[0] != "err" for o in expected), expected
    assert expected[2] == ("ok", (0o600, os.getuid(), os.getgid(), 8))
    assert expected[-3 if replace else -2] == ("ok", 0)  # no link left

    assert _on_an_open_file(mounted.mountpoint, replace) == expected
    if replace:
        assert (mounted.backing / "f").read_bytes() == b"replacement"
        assert stat.S_IMODE(os.stat(mounted.backing / "f").st_mode) == 0o640
    assert sorted(os.listdir(mounted.backing)) == (["f"] if replace else [])


# ------------------------------------------------------------------------ finding 7: mmap

_MAP_AND_WRITE = r"""
import mmap, os, sys
path, size = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
os.ftruncate(fd, size)
with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
    for offset in range(0, size, 4096):
        m[offset : offset + 4096] = bytes([offset // 4096 % 251]) * 4096
    m.flush()  # msync(MS_SYNC): the dirty pages are written back now
os.close(fd)
"""


def _bytes_written_by_job(fake: FakeController) -> dict[str, int]:
    """Job id -> the most its sessions reported as written (Usage totals are cumulative)."""
    job_of_stream = {r.stream: r.message.hello.job_id for r in fake.received("hello")}
    written: dict[str, int] = {}
    for r in fake.received("usage"):
        job = job_of_stream.get(r.stream, "?")
        written[job] = max(written.get(job, 0), r.message.usage.totals.bytes_written)
    return written


def test_writes_through_a_shared_mapping_are_booked_to_the_writers_job(
    fake_controller: Callable[..., FakeController],
    fuse_mount: Callable[..., MountProcess],
    fuse_dirs: tuple[Path, Path],
) -> None:
    fake = fake_controller(initial_rate=256 * MiB)
    backing, mnt = fuse_dirs
    fuse_mount(backing, mnt, "--controller", fake.address)
    clean = clean_env(("BURSTCTL_", "SLURM_"))
    # The job of a request with no job of its own from this uid (user:root when run as root):
    # where kernel writeback (pid 0) lands today.
    default_job = Attributor().job_for(Caller(os.getpid(), os.getuid(), os.getgid())).job_id

    subprocess.run(
        [sys.executable, "-c", _MAP_AND_WRITE, str(mnt / "mapped"), str(MiB)],
        env={**clean, "BURSTCTL_JOB_ID": "mapper"},
        check=True,
        timeout=60,
    )

    assert (backing / "mapped").read_bytes() == b"".join(
        bytes([i % 251]) * 4096 for i in range(MiB // 4096)
    )
    # The megabyte is booked to some job; it must be the mapper's.
    fake.wait_for(lambda: sum(_bytes_written_by_job(fake).values()) >= MiB, timeout=15)
    written = _bytes_written_by_job(fake)
    assert written.get("mapper", 0) >= MiB, written
    assert written.get(default_job, 0) < MiB, written
