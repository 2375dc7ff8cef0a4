"""The passthrough operations called directly (no kernel): errno barrier, ownership, pacing."""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from burstctl.fuse_shim._fuse import FuseOSError, Operations
from burstctl.fuse_shim.attribution import Caller
from burstctl.fuse_shim.fs import _UTIME_NOW, _UTIME_OMIT, PassthroughFS

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="giving files away needs root")
NOBODY = Caller(pid=0, uid=65534, gid=65534)


class RecordingPacer:
    """Stands in for `Pacer`: records calls; ``fail`` makes data() raise like a bug would."""

    paces_metadata = False

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail = fail

    def data(self, caller: Caller, kind: str, nbytes: int) -> None:
        self.calls.append(("data", caller.uid, kind, nbytes))
        if self.fail:
            raise ZeroDivisionError("a pacing bug")

    def metadata(self, caller: Caller) -> None:
        self.calls.append(("metadata", caller.uid))

    def opened(self, caller: Caller, fh: int) -> None:
        self.calls.append(("opened", caller.uid))

    def released(self, fh: int) -> None:
        self.calls.append(("released",))


@pytest.fixture
def backing(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield tmp_path, fd
    os.close(fd)


def make_fs(fd: int, pacer: Any = None, caller: Caller = NOBODY) -> PassthroughFS:
    return PassthroughFS(fd, pacer, caller=lambda: caller)


def raises_errno(code: int, fn: Any, *args: Any) -> None:
    with pytest.raises(FuseOSError) as info:
        fn(*args)
    assert info.value.errno == code


def test_every_callback_is_behind_the_errno_barrier() -> None:
    overridden = [
        name
        for name, value in vars(PassthroughFS).items()
        if callable(value) and not name.startswith("_") and hasattr(Operations, name)
    ]
    assert len(overridden) >= 25
    for name in overridden:
        assert hasattr(getattr(PassthroughFS, name), "__wrapped__"), name


def test_os_errors_become_their_errno(backing: tuple[Path, int]) -> None:
    _, fd = backing
    fs = make_fs(fd)
    raises_errno(errno.ENOENT, fs.getattr, "/missing")
    raises_errno(errno.ENOENT, fs.open, "/missing", os.O_RDONLY)
    fs.mkdir("/d", 0o755)
    raises_errno(errno.EEXIST, fs.mkdir, "/d", 0o755)
    fs.mkdir("/d/e", 0o755)
    raises_errno(errno.ENOTEMPTY, fs.rmdir, "/d")
    raises_errno(errno.EISDIR, fs.unlink, "/d")
    raises_errno(errno.ENOENT, fs.getattr, None)  # a path libfuse could not give


def test_a_bug_becomes_eio_and_is_logged(
    backing: tuple[Path, int], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"data")
    fs = make_fs(fd)
    fh = fs.open("/f", os.O_RDONLY)

    def broken(*args: object) -> bytes:
        raise TypeError("a bug")

    monkeypatch.setattr(os, "pread", broken)
    with caplog.at_level(logging.ERROR, "burstctl.fuse_shim.fs"):
        raises_errno(errno.EIO, fs.read, "/f", 4, 0, fh)

    def exits(*args: object) -> bytes:
        raise SystemExit(3)

    monkeypatch.setattr(os, "pread", exits)
    raises_errno(errno.EIO, fs.read, "/f", 4, 0, fh)

    def no_errno(*args: object) -> bytes:
        raise OSError("no errno")

    monkeypatch.setattr(os, "pread", no_errno)
    raises_errno(errno.EIO, fs.read, "/f", 4, 0, fh)
    monkeypatch.undo()
    assert fs.read("/f", 4, 0, fh) == b"data"  # still serving
    fs.release("/f", fh)
    assert "read failed on a bug" in caplog.text


def test_reads_and_writes_use_the_handle_and_are_paced_first(backing: tuple[Path, int]) -> None:
    root, fd = backing
    pacer = RecordingPacer()
    fs = make_fs(fd, pacer)
    fh = fs.create("/f", 0o644, os.O_CREAT | os.O_RDWR)
    os.rename(root / "f", root / "renamed")  # the handle, not the path, is used
    assert fs.write("/f", b"hello", 0, fh) == 5
    assert fs.read("/f", 100, 0, fh) == b"hello"
    fs.truncate(None, 2, fh)
    assert fs.getattr(None, fh)["st_size"] == 2
    fs.release("/f", fh)
    assert pacer.calls == [
        ("opened", 65534),
        ("data", 65534, "write", 5),
        ("data", 65534, "read", 100),
        ("released",),
    ]
    assert (root / "renamed").read_bytes() == b"he"


def test_reads_and_writes_in_place_use_the_handle_and_are_paced_first(
    backing: tuple[Path, int],
) -> None:
    root, fd = backing
    pacer = RecordingPacer()
    fs = make_fs(fd, pacer)
    fh = fs.create("/f", 0o644, os.O_CREAT | os.O_RDWR)
    os.rename(root / "f", root / "renamed")
    assert fs.write_from("/f", memoryview(b"hello world"), 0, fh) == 11
    buf = bytearray(8)
    assert fs.read_into(None, memoryview(buf), 6, fh) == 5  # short: the end of the file
    assert bytes(buf) == b"world\0\0\0"
    assert fs.read_into("/f", memoryview(buf)[:0], 0, fh) == 0
    fs.release("/f", fh)
    assert pacer.calls == [
        ("opened", 65534),
        ("data", 65534, "write", 11),
        ("data", 65534, "read", 8),
        ("data", 65534, "read", 0),
        ("released",),
    ]
    assert (root / "renamed").read_bytes() == b"hello world"


def test_in_place_reads_and_writes_are_behind_the_errno_barrier(
    backing: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"data")
    fs = make_fs(fd)
    fh = fs.open("/f", os.O_RDONLY)
    raises_errno(errno.EBADF, fs.write_from, "/f", memoryview(b"x"), 0, fh)

    def broken(*args: object) -> int:
        raise TypeError("a bug")

    monkeypatch.setattr(os, "preadv", broken)
    raises_errno(errno.EIO, fs.read_into, "/f", memoryview(bytearray(4)), 0, fh)
    monkeypatch.undo()
    fs.release("/f", fh)
    raises_errno(errno.EBADF, fs.read_into, "/f", memoryview(bytearray(4)), 0, fh)
    assert (root / "f").read_bytes() == b"data"


def test_init_on_libfuse_3_sets_write_limit_and_cache_checks(backing: tuple[Path, int]) -> None:
    _, fd = backing
    inits: list[bool] = []
    auto_inval_data = 1 << 12  # FUSE_CAP_AUTO_INVAL_DATA

    class Conn:
        max_write = 1 << 20  # what libfuse 3 computed from its buffer
        want = 0xFFFF

    config = object()  # libfuse 3's struct fuse_config (None on libfuse 2)
    fs = PassthroughFS(fd, on_init=lambda: inits.append(True), max_write=256 << 10)
    conn = Conn()
    fs.init_with_config(conn, config)
    assert conn.max_write == 256 << 10 and inits == [True]
    assert conn.want == 0xFFFF & ~auto_inval_data  # no GETATTR before every read, as on 2
    conn = Conn()
    PassthroughFS(fd, max_write=4 << 20).init_with_config(conn, config)
    assert conn.max_write == 1 << 20  # never above what libfuse can take
    conn = Conn()
    PassthroughFS(fd).init_with_config(conn, config)
    assert conn.max_write == 1 << 20  # no --max-write: libfuse's own
    conn = Conn()
    PassthroughFS(fd, max_write=4096).init_with_config(conn, None)
    assert conn.max_write == 1 << 20  # libfuse 2: a mount option, not set here
    assert conn.want == 0xFFFF


@pytest.mark.parametrize("config", [object(), None], ids=["libfuse3", "libfuse2"])
def test_init_asks_for_the_read_ahead_window(backing: tuple[Path, int], config: object) -> None:
    # The kernel keeps min(its window, max_readahead) after init: both must be raised.
    _, fd = backing

    class Conn:
        max_write = 1 << 20
        want = 0
        max_readahead = 128 << 10  # what the kernel proposed

    conn = Conn()
    PassthroughFS(fd, read_ahead=1 << 20).init_with_config(conn, config)
    assert conn.max_readahead == 1 << 20
    conn = Conn()
    PassthroughFS(fd, read_ahead=64 << 10).init_with_config(conn, config)
    assert conn.max_readahead == 128 << 10  # never lowered
    conn = Conn()
    PassthroughFS(fd).init_with_config(conn, config)
    assert conn.max_readahead == 128 << 10  # 0: the kernel's default


def test_a_pacing_failure_never_fails_the_io(
    backing: tuple[Path, int], caplog: pytest.LogCaptureFixture
) -> None:
    _, fd = backing
    fs = make_fs(fd, RecordingPacer(fail=True))
    fh = fs.create("/f", 0o644, os.O_CREAT | os.O_RDWR)
    with caplog.at_level(logging.ERROR, "burstctl.fuse_shim.fs"):
        assert fs.write("/f", b"x", 0, fh) == 1
    fs.release("/f", fh)
    assert "serving it unpaced" in caplog.text


@ROOT_ONLY
def test_what_a_caller_creates_is_the_callers(backing: tuple[Path, int]) -> None:
    root, fd = backing
    fs = make_fs(fd)
    fs.release("/f", fs.create("/f", 0o640, os.O_CREAT | os.O_WRONLY))
    fs.mkdir("/d", 0o755)
    fs.symlink("/l", "f")
    fs.mknod("/p", stat.S_IFIFO | 0o600, 0)
    for name in ("f", "d", "l", "p"):
        st = os.lstat(root / name)
        assert (st.st_uid, st.st_gid) == (65534, 65534), name
    os.chmod(root / "d", 0o2777)
    os.chown(root / "d", 0, 123)
    fs.release("/d/g", fs.create("/d/g", 0o600, os.O_CREAT | os.O_WRONLY))
    assert os.stat(root / "d" / "g").st_gid == 123  # a set-group-id directory's group
    fs.release("/s", fs.create("/s", 0o6755, os.O_CREAT | os.O_WRONLY))
    st = os.stat(root / "s")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (65534, 0o6755)  # not cleared by chown
    root_fs = make_fs(fd, caller=Caller(0, 0, 0))
    root_fs.mkdir("/mine", 0o700)
    assert os.stat(root / "mine").st_uid == 0


def test_utimens_handles_now_and_omit(backing: tuple[Path, int]) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"x")
    os.utime(root / "f", ns=(1_000, 2_000))
    fs = make_fs(fd)
    fs.utimens("/f", (_UTIME_OMIT, 5_000_000_007))
    st = os.stat(root / "f")
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000, 5_000_000_007)
    fs.utimens("/f", (_UTIME_NOW, _UTIME_OMIT))
    st = os.stat(root / "f")
    assert st.st_atime_ns > 10**18 and st.st_mtime_ns == 5_000_000_007
    fs.utimens("/f", None)
    assert os.stat(root / "f").st_mtime_ns > 10**18


def test_readdir_gives_names_with_inodes_and_types(backing: tuple[Path, int]) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"")
    (root / "d").mkdir()
    os.symlink("f", root / "l")
    entries = {e[0]: e[1] for e in make_fs(fd).readdir("/", 0) if isinstance(e, tuple)}
    assert set(entries) == {".", "..", "f", "d", "l"}
    assert entries["f"] == {"st_ino": os.stat(root / "f").st_ino, "st_mode": stat.S_IFREG}
    assert entries["d"]["st_mode"] == stat.S_IFDIR
    assert entries["l"]["st_mode"] == stat.S_IFLNK


def test_access_checks_the_callers_permissions(backing: tuple[Path, int]) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"")
    os.chmod(root / "f", 0o604)
    fs = make_fs(fd, caller=Caller(0, 4242, 4242))
    assert fs.access("/f", os.R_OK) == 0
    raises_errno(errno.EACCES, fs.access, "/f", os.W_OK)
    raises_errno(errno.ENOENT, fs.access, "/missing", os.F_OK)


def test_fallocate_and_statfs(backing: tuple[Path, int]) -> None:
    root, fd = backing
    fs = make_fs(fd)
    fh = fs.create("/f", 0o644, os.O_CREAT | os.O_RDWR)
    fs.fallocate("/f", 0, 0, 1 << 20, fh)
    assert os.stat(root / "f").st_size == 1 << 20
    raises_errno(errno.EOPNOTSUPP, fs.fallocate, "/f", 1, 0, 10, fh)
    fs.release("/f", fh)
    assert fs.statfs("/")["f_blocks"] == os.statvfs(root).f_blocks


# ---------------------------------------------------------------- security.capability cache

# A VFS_CAP_REVISION_2 capability (cap_net_bind_service, effective): setting it needs root.
_CAP_BLOB = bytes.fromhex("0100000200040000000000000000000000000000")
_CAP = "security.capability"


def test_absent_capability_is_answered_from_the_cache(backing: tuple[Path, int]) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"x")
    fs = make_fs(fd)
    raises_errno(errno.ENODATA, fs.getxattr, "/f", _CAP)
    raises_errno(errno.ENODATA, fs.getxattr, "/f", _CAP)
    assert fs._no_capability.hits == 1
    # Other names, and missing files, always go to BACKING.
    raises_errno(errno.ENODATA, fs.getxattr, "/f", "user.absent")
    raises_errno(errno.ENODATA, fs.getxattr, "/f", "user.absent")
    raises_errno(errno.ENOENT, fs.getxattr, "/missing", _CAP)
    raises_errno(errno.ENOENT, fs.getxattr, "/missing", _CAP)
    assert fs._no_capability.hits == 1


@ROOT_ONLY
def test_setxattr_through_the_mount_shows_the_capability_at_once(
    backing: tuple[Path, int],
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"x")
    fs = make_fs(fd)
    raises_errno(errno.ENODATA, fs.getxattr, "/f", _CAP)
    fs.setxattr("/f", _CAP, _CAP_BLOB, 0)
    assert fs.getxattr("/f", _CAP) == _CAP_BLOB
    fs.removexattr("/f", _CAP)
    raises_errno(errno.ENODATA, fs.getxattr, "/f", _CAP)
    # A failed setxattr forgets too (it may have changed something).
    raises_errno(errno.ENODATA, fs.setxattr, "/f", "user.none", b"v", os.XATTR_REPLACE)
    hits = fs._no_capability.hits
    raises_errno(errno.ENODATA, fs.getxattr, "/f", _CAP)
    assert fs._no_capability.hits == hits


@ROOT_ONLY
@pytest.mark.parametrize("how", ["rename", "unlink+link", "rmdir+rename"])
def test_a_change_of_names_forgets_absent_capabilities(backing: tuple[Path, int], how: str) -> None:
    root, fd = backing
    (root / "d").mkdir()
    (root / "d" / "plain").write_bytes(b"x")
    (root / "capped").write_bytes(b"y")
    os.setxattr(root / "capped", _CAP, _CAP_BLOB)
    fs = make_fs(fd)
    raises_errno(errno.ENODATA, fs.getxattr, "/d/plain", _CAP)
    if how == "rename":
        fs.rename("/capped", "/d/plain")
    elif how == "unlink+link":
        fs.unlink("/d/plain")
        fs.link("/d/plain", "/capped")
    else:
        os.unlink(root / "d" / "plain")  # behind the mount's back, then through it:
        fs.rmdir("/d")
        os.mkdir(root / "d")
        fs.rename("/capped", "/d/plain")
    assert fs.getxattr("/d/plain", _CAP) == _CAP_BLOB


@ROOT_ONLY
def test_a_capability_set_behind_the_mount_is_seen_after_the_ttl(
    backing: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from burstctl.fuse_shim import capabilities

    root, fd = backing
    (root / "f").write_bytes(b"x")
    fs = make_fs(fd)
    fs._no_capability = capabilities.AbsentCapabilities(ttl=0.2)
    raises_errno(errno.ENODATA, fs.getxattr, "/f", _CAP)
    os.setxattr(root / "f", _CAP, _CAP_BLOB)  # behind the mount's back: the documented limit
    raises_errno(errno.ENODATA, fs.getxattr, "/f", _CAP)
    real = time.monotonic
    monkeypatch.setattr(capabilities.time, "monotonic", lambda: real() + 0.3)
    assert fs.getxattr("/f", _CAP) == _CAP_BLOB


def test_a_lookup_that_raced_with_a_change_is_not_remembered() -> None:
    from burstctl.fuse_shim.capabilities import AbsentCapabilities

    cache = AbsentCapabilities()
    before = cache.generation
    cache.forget_all()  # e.g. a setxattr finished while the lookup was on BACKING
    cache.remember("/f", before)
    assert not cache.known_absent("/f")
    cache.remember("/f", cache.generation)
    assert cache.known_absent("/f")


@ROOT_ONLY
def test_backing_strips_the_capability_on_the_daemons_own_write(
    backing: tuple[Path, int],
) -> None:
    # What makes a stale "absent" harmless for writes: the kernel skips its REMOVEXATTR, but
    # BACKING strips the capability when the daemon writes or truncates.
    root, fd = backing
    (root / "f").write_bytes(b"abc")
    fs = make_fs(fd)
    for change in ("write", "truncate"):
        os.setxattr(root / "f", _CAP, _CAP_BLOB)
        fh = fs.open("/f", os.O_WRONLY)
        try:
            if change == "write":
                fs.write("/f", b"z", 1, fh)
            else:
                fs.truncate("/f", 1, fh)
        finally:
            fs.release("/f", fh)
        with pytest.raises(OSError) as info:
            os.getxattr(root / "f", _CAP)
        assert info.value.errno == errno.ENODATA


@pytest.mark.parametrize("granted", [False, True], ids=["no-mmap-grant", "mmap-granted"])
def test_which_opens_bypass_the_page_cache(backing: tuple[Path, int], granted: bool) -> None:
    # A file that could be mapped shared goes direct only where the kernel allows mapping it;
    # a write-only one cannot be mapped, so it always may.
    _, fd = backing
    extra = os.O_CREAT | os.O_APPEND | os.O_TRUNC | os.O_CLOEXEC
    chosen = {}
    for mode in ("writes", "all", "none"):
        fs = PassthroughFS(fd, direct_io=mode)
        fs.direct_io_mmap = granted
        for name, access in (("ro", os.O_RDONLY), ("wo", os.O_WRONLY), ("rw", os.O_RDWR)):
            chosen[mode, name] = fs.direct_io_for(access), fs.direct_io_for(access | extra)
    assert all(plain == with_extra for plain, with_extra in chosen.values())
    assert {key: plain for key, (plain, _) in chosen.items()} == {
        ("writes", "ro"): False,
        ("writes", "wo"): True,
        ("writes", "rw"): granted,
        ("all", "ro"): granted,
        ("all", "wo"): True,
        ("all", "rw"): granted,
        ("none", "ro"): False,
        ("none", "wo"): False,
        ("none", "rw"): False,
    }
    with pytest.raises(ValueError, match="direct_io"):
        PassthroughFS(fd, direct_io="sometimes")
