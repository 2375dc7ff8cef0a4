"""The low-level binding's callbacks, called through their C thunks as libfuse calls them.

No kernel and no session: libfuse's reply functions are replaced by recorders (a reply to a
fake request would dereference it), everything else is the real binding. A callback that let
an exception escape would be reported by ctypes as unraisable, which fails the test.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from burstctl.fuse_shim import _fuse
from burstctl.fuse_shim._fuse import (
    ROOT_ID,
    Entry,
    Opened,
    SetAttr,
    callbacks,
    direct_io_mmap,
    lowlevel,
    operations,
)
from burstctl.fuse_shim.fs import PassthroughFS, _default_caller
from burstctl.fuse_shim.inodes import InodeTable
from burstctl.node.attribution import Caller

REQ = 0x5EED  # a request: never dereferenced (the replies are recorded, not sent)
V3 = _fuse.LIBFUSE_VERSION[0] >= 3


class Replies:
    """What the callbacks answered, as ``(function, request, *what)``."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []
        # What fuse_reply_entry/open/create and fuse_reply_buf return (-ENOENT: the caller
        # was interrupted).
        self.open_result = 0
        self.buf_result = 0

    def only(self) -> tuple[Any, ...]:
        assert len(self.sent) == 1, self.sent
        return self.sent.pop()


def _entry(param: Any) -> tuple[Any, ...]:
    return (
        param.ino,
        param.attr.st_ino,
        param.attr.st_mode,
        param.attr.st_size,
        param.attr_timeout,
        param.entry_timeout,
    )


def _info(fi: Any) -> tuple[int, int, int]:
    info = fi.contents
    return info.fh, info.direct_io, info.keep_cache


@pytest.fixture
def replies(monkeypatch: pytest.MonkeyPatch) -> Replies:
    got = Replies()

    def record(name: str, convert: Callable[..., tuple[Any, ...]], result: Any = 0) -> None:
        def reply(req: int, *args: Any) -> Any:
            got.sent.append((name, req, *convert(*args)))
            if name == "buf":
                return got.buf_result
            return got.open_result if result is None else result

        monkeypatch.setattr(callbacks, "reply_" + name, reply)

    record("err", lambda code: (code,))
    record("none", lambda: ())
    record("entry", lambda param: _entry(param._obj), None)
    record("create", lambda param, fi: (*_entry(param._obj), *_info(fi)), None)
    record("attr", lambda st, timeout: (st._obj.st_ino, st._obj.st_size, timeout))
    record("readlink", lambda target: (target,))
    record("open", lambda fi: _info(fi), None)
    record("write", lambda size: (size,))
    record(
        "buf",
        lambda buf, size: (_buffer_bytes(buf, size),),
    )
    record("statfs", lambda st: (st._obj.f_blocks, st._obj.f_namemax))
    record("xattr", lambda size: (size,))
    record("lseek", lambda offset: (offset,))
    return got


def _buffer_bytes(buf: Any, size: int) -> bytes:
    """What fuse_reply_buf would send: ``size`` bytes of a bytes object, a ctypes buffer, or
    memory at an address (a readdir listing replies from its packed records in place)."""
    if isinstance(buf, bytes):
        return buf[:size]
    if isinstance(buf, int):
        return ctypes.string_at(buf, size) if size else b""
    return bytes(buf.raw[:size])


@pytest.fixture
def backing(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    root = tmp_path / "backing"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    yield root, fd
    os.close(fd)


def serving(fs: Any) -> Any:
    """The ``struct fuse_lowlevel_ops`` libfuse would be given for ``fs``."""
    ops = lowlevel.fuse_lowlevel_ops()
    ops.callbacks = callbacks.Callbacks(fs, ops, callbacks.Interrupts())  # kept with the structure
    return ops


def file_info(fh: int = 0, flags: int = 0, writepage: int = 0) -> Any:
    info = lowlevel.fuse_file_info()
    info.fh, info.flags, info.writepage = fh, flags, writepage
    return ctypes.pointer(info)


NO_INFO = ctypes.POINTER(lowlevel.fuse_file_info)()  # NULL: the kernel sent no handle


def passthrough(fd: int, **options: Any) -> PassthroughFS:
    return PassthroughFS(InodeTable(fd), caller=lambda req: Caller(0, 65534, 65534), **options)


# ---------------------------------------------------------------- the table of callbacks


def test_every_implemented_operation_has_a_thunk() -> None:
    class Nothing:
        attr_timeout = entry_timeout = negative_timeout = 1.0

    ops = serving(Nothing())
    implemented = [
        name for name, kind in lowlevel.fuse_lowlevel_ops._fields_ if kind is not ctypes.c_void_p
    ]
    assert len(implemented) >= 33
    for name in implemented:
        assert ctypes.cast(getattr(ops, name), ctypes.c_void_p).value, name
        # forget_multi forgets node by node; readdirplus lists and looks each entry up.
        method = {"forget_multi": "forget", "readdirplus": "readdir_entry"}.get(name, name)
        assert hasattr(_fuse.Operations, method), name
        assert callable(getattr(PassthroughFS, method, None)), name
    assert ("lseek" in implemented) is V3  # libfuse 2 has neither
    assert ("readdirplus" in implemented) is V3


# ---------------------------------------------------------------- errors never escape


class Failing:
    """A file system whose every method raises ``error``."""

    attr_timeout = entry_timeout = 1.0
    negative_timeout = 0.0

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def fail(*args: Any) -> Any:
            raise self.error

        return fail


def every_request(ops: Any, keep: list[Any]) -> dict[str, Callable[[], None]]:
    """Each answered request of the table, called as libfuse calls it."""
    data = ctypes.create_string_buffer(b"value", 5)
    keep.append(data)
    address = ctypes.addressof(data)
    attr = ctypes.pointer(lowlevel.c_stat())
    calls: dict[str, Callable[[], None]] = {
        "lookup": lambda: ops.lookup(REQ, ROOT_ID, b"x"),
        "getattr": lambda: ops.getattr(REQ, 2, NO_INFO),
        "setattr": lambda: ops.setattr(REQ, 2, attr, lowlevel.SET_ATTR_SIZE, file_info(5)),
        "readlink": lambda: ops.readlink(REQ, 2),
        "mknod": lambda: ops.mknod(REQ, ROOT_ID, b"n", stat.S_IFIFO | 0o600, 0),
        "mkdir": lambda: ops.mkdir(REQ, ROOT_ID, b"d", 0o755),
        "unlink": lambda: ops.unlink(REQ, ROOT_ID, b"x"),
        "rmdir": lambda: ops.rmdir(REQ, ROOT_ID, b"x"),
        "symlink": lambda: ops.symlink(REQ, b"t", ROOT_ID, b"l"),
        "rename": (
            (lambda: ops.rename(REQ, ROOT_ID, b"a", ROOT_ID, b"b", 0))
            if V3
            else (lambda: ops.rename(REQ, ROOT_ID, b"a", ROOT_ID, b"b"))
        ),
        "link": lambda: ops.link(REQ, 2, ROOT_ID, b"n"),
        "open": lambda: ops.open(REQ, 2, file_info(flags=os.O_RDONLY)),
        "read": lambda: ops.read(REQ, 2, 4096, 0, file_info(5)),
        "write": lambda: ops.write(REQ, 2, address, 5, 0, file_info(5)),
        "flush": lambda: ops.flush(REQ, 2, file_info(5)),
        "release": lambda: ops.release(REQ, 2, file_info(5)),
        "fsync": lambda: ops.fsync(REQ, 2, 1, file_info(5)),
        "opendir": lambda: ops.opendir(REQ, ROOT_ID, file_info()),
        "readdir": lambda: ops.readdir(REQ, ROOT_ID, 4096, 0, file_info(5)),
        "releasedir": lambda: ops.releasedir(REQ, ROOT_ID, file_info(5)),
        "fsyncdir": lambda: ops.fsyncdir(REQ, ROOT_ID, 0, file_info(5)),
        "statfs": lambda: ops.statfs(REQ, ROOT_ID),
        "setxattr": lambda: ops.setxattr(REQ, 2, b"user.a", address, 5, 0),
        "getxattr": lambda: ops.getxattr(REQ, 2, b"user.a", 100),
        "listxattr": lambda: ops.listxattr(REQ, 2, 100),
        "removexattr": lambda: ops.removexattr(REQ, 2, b"user.a"),
        "access": lambda: ops.access(REQ, 2, os.R_OK),
        "create": lambda: ops.create(REQ, ROOT_ID, b"c", 0o644, file_info(flags=os.O_WRONLY)),
        "fallocate": lambda: ops.fallocate(REQ, 2, 0, 0, 4096, file_info(5)),
    }
    if V3:
        calls["lseek"] = lambda: ops.lseek(REQ, 2, 0, os.SEEK_DATA, file_info(5))
        calls["readdirplus"] = lambda: ops.readdirplus(REQ, ROOT_ID, 4096, 0, file_info(5))
    return calls


@pytest.mark.parametrize(
    ("error", "code", "logged"),
    [
        (OSError(errno.EACCES, "denied"), errno.EACCES, False),
        (FileNotFoundError(errno.ENOENT, "gone"), errno.ENOENT, False),
        (TypeError("a bug"), errno.EIO, True),
        (OSError("no errno"), errno.EIO, True),
        (OSError(0, "errno 0 would be a success"), errno.EIO, True),
        (SystemExit(3), errno.EIO, True),
        (KeyboardInterrupt(), errno.EIO, True),
    ],
    ids=["errno", "subclass", "bug", "no-errno", "errno-0", "exit", "interrupt"],
)
def test_an_error_is_answered_with_its_errno_and_a_bug_with_eio(
    replies: Replies,
    caplog: pytest.LogCaptureFixture,
    error: BaseException,
    code: int,
    logged: bool,
) -> None:
    keep: list[Any] = []
    ops = serving(Failing(error))
    for name, call in every_request(ops, keep).items():
        caplog.clear()
        with caplog.at_level(logging.ERROR, "burstctl.fuse_shim._fuse"):
            call()
        assert replies.only() == ("err", REQ, code), name
        assert (f"{name} failed on a bug; answering EIO" in caplog.text) is logged, name


def test_forget_init_and_destroy_never_raise(
    replies: Replies, caplog: pytest.LogCaptureFixture
) -> None:
    ops = serving(Failing(TypeError("a bug")))
    forgets = (lowlevel.fuse_forget_data * 2)((2, 1), (3, 4))
    with caplog.at_level(logging.ERROR, "burstctl.fuse_shim._fuse"):
        ops.forget(REQ, 2, 1)
        assert replies.only() == ("none", REQ)  # forget is answered with nothing, always
        ops.forget_multi(REQ, 2, forgets)
        assert replies.only() == ("none", REQ)
        ops.init(None, ctypes.pointer(lowlevel.fuse_conn_info()))
        ops.destroy(None)
    assert replies.sent == []
    for name in ("forget", "init", "destroy"):
        assert f"{name} failed" in caplog.text


# ---------------------------------------------------------------- answers


def test_lookup_answers_the_node_and_its_cache_times(
    backing: tuple[Path, int], replies: Replies
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"abc")
    fs = passthrough(fd, attr_timeout=2.5, entry_timeout=3.5, negative_timeout=4.5)
    ops = serving(fs)
    ops.lookup(REQ, ROOT_ID, b"f")
    node = fs.lookup(REQ, ROOT_ID, b"f").node
    st = os.stat(root / "f")
    assert replies.only() == ("entry", REQ, node, st.st_ino, st.st_mode, 3, 2.5, 3.5)
    ops.lookup(REQ, ROOT_ID, b"missing")  # a negative entry, cached for negative_timeout
    assert replies.only() == ("entry", REQ, 0, 0, 0, 0, 0.0, 4.5)
    fs.negative_timeout = 0.0
    ops.lookup(REQ, ROOT_ID, b"missing")  # 0: not cached, plain ENOENT
    assert replies.only() == ("err", REQ, errno.ENOENT)
    ops.lookup(REQ, 999, b"f")
    assert replies.only() == ("err", REQ, errno.ESTALE)
    ops.forget(REQ, node, 1)
    assert replies.only() == ("none", REQ)
    forgets = (lowlevel.fuse_forget_data * 1)((node, 1))
    ops.forget_multi(REQ, 1, forgets)
    assert replies.only() == ("none", REQ)
    assert fs.inodes.known == 1


def test_getattr_uses_the_handle_when_there_is_one(
    backing: tuple[Path, int], replies: Replies
) -> None:
    _, fd = backing
    fs = passthrough(fd, attr_timeout=0.25)
    ops = serving(fs)
    entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o644, os.O_RDWR)
    os.write(opened.fh, b"12345")
    fs.unlink(REQ, ROOT_ID, b"f")
    ops.getattr(REQ, entry.node, file_info(opened.fh))
    assert replies.only() == ("attr", REQ, entry.attr.st_ino, 5, 0.25)
    ops.getattr(REQ, entry.node, NO_INFO)  # no handle: the node's
    assert replies.only() == ("attr", REQ, entry.attr.st_ino, 5, 0.25)
    fs.release(REQ, entry.node, opened.fh)


class Recording:
    """A file system that records what the callbacks hand it and answers plausibly."""

    attr_timeout = entry_timeout = negative_timeout = 1.0

    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls: list[tuple[Any, ...]] = []

    def setattr(self, req: int, node: int, change: SetAttr, fh: int | None) -> os.stat_result:
        self.calls.append(("setattr", node, change, fh))
        return os.stat(self.root)

    def write(
        self, req: int, node: int, data: memoryview, offset: int, fh: int, writepage: bool
    ) -> int:
        self.calls.append(("write", node, bytes(data), offset, fh, writepage))
        return max(len(data) - 1, 0)  # a short write is passed on as it is

    def rename(
        self, req: int, parent: int, name: bytes, new_parent: int, new_name: bytes, flags: int
    ) -> None:
        self.calls.append(("rename", parent, name, new_parent, new_name, flags))

    def fsync(self, req: int, node: int, datasync: bool, fh: int) -> None:
        self.calls.append(("fsync", node, datasync, fh))


def test_setattr_hands_over_only_the_fields_to_set(tmp_path: Path, replies: Replies) -> None:
    fs = Recording(tmp_path)
    ops = serving(fs)
    attr = lowlevel.c_stat()
    attr.st_mode, attr.st_uid, attr.st_gid, attr.st_size = stat.S_IFREG | 0o640, 7, 8, 99
    attr.st_atimespec.tv_sec, attr.st_atimespec.tv_nsec = 1, 2
    attr.st_mtimespec.tv_sec, attr.st_mtimespec.tv_nsec = 3, 4
    every = (
        lowlevel.SET_ATTR_MODE
        | lowlevel.SET_ATTR_UID
        | lowlevel.SET_ATTR_GID
        | lowlevel.SET_ATTR_SIZE
        | lowlevel.SET_ATTR_ATIME
        | lowlevel.SET_ATTR_MTIME
    )
    ops.setattr(REQ, 5, ctypes.pointer(attr), every, file_info(9))
    ops.setattr(REQ, 5, ctypes.pointer(attr), lowlevel.SET_ATTR_SIZE, NO_INFO)
    ops.setattr(
        REQ,
        5,
        ctypes.pointer(attr),
        lowlevel.SET_ATTR_ATIME | lowlevel.SET_ATTR_ATIME_NOW | lowlevel.SET_ATTR_MTIME_NOW,
        NO_INFO,
    )
    ops.setattr(REQ, 5, ctypes.pointer(attr), lowlevel.SET_ATTR_MTIME, NO_INFO)
    assert fs.calls == [
        ("setattr", 5, SetAttr(stat.S_IFREG | 0o640, 7, 8, 99, 1_000_000_002, 3_000_000_004), 9),
        ("setattr", 5, SetAttr(size=99), None),
        ("setattr", 5, SetAttr(atime=_fuse.NOW, mtime=_fuse.NOW), None),
        ("setattr", 5, SetAttr(mtime=3_000_000_004), None),
    ]
    assert [reply[0] for reply in replies.sent] == ["attr"] * 4


def test_write_takes_libfuses_buffer_in_place(tmp_path: Path, replies: Replies) -> None:
    fs = Recording(tmp_path)
    ops = serving(fs)
    data = ctypes.create_string_buffer(b"hello world", 11)
    ops.write(REQ, 5, ctypes.addressof(data), 5, 100, file_info(9))  # only ``size`` bytes
    ops.write(REQ, 5, ctypes.addressof(data), 3, 0, file_info(9, writepage=1))
    ops.write(REQ, 5, None, 0, 0, file_info(9))  # an empty write
    assert fs.calls == [
        ("write", 5, b"hello", 100, 9, False),
        ("write", 5, b"hel", 0, 9, True),
        ("write", 5, b"", 0, 9, False),
    ]
    assert replies.sent == [("write", REQ, 4), ("write", REQ, 2), ("write", REQ, 0)]


def test_rename_passes_its_flags_and_fsync_datasync(tmp_path: Path, replies: Replies) -> None:
    fs = Recording(tmp_path)
    ops = serving(fs)
    if V3:
        ops.rename(REQ, 1, b"a", 2, b"b", 2)  # RENAME_EXCHANGE
    else:
        ops.rename(REQ, 1, b"a", 2, b"b")  # libfuse 2 has no flags
    ops.fsync(REQ, 5, 1, file_info(9))
    ops.fsync(REQ, 5, 0, file_info(9))
    assert fs.calls == [
        ("rename", 1, b"a", 2, b"b", 2 if V3 else 0),
        ("fsync", 5, True, 9),
        ("fsync", 5, False, 9),
    ]
    assert replies.sent == [("err", REQ, 0)] * 3


def test_read_fills_libfuses_buffer(backing: tuple[Path, int], replies: Replies) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"0123456789")
    fs = passthrough(fd)
    ops = serving(fs)
    f = fs.lookup(REQ, ROOT_ID, b"f")
    opened = fs.open(REQ, f.node, os.O_RDONLY)
    ops.read(REQ, f.node, 6, 2, file_info(opened.fh))
    assert replies.only() == ("buf", REQ, b"234567")
    ops.read(REQ, f.node, 8, 7, file_info(opened.fh))
    assert replies.only() == ("buf", REQ, b"789")  # short: the end of the file
    ops.read(REQ, f.node, 0, 0, file_info(opened.fh))
    assert replies.only() == ("buf", REQ, b"")
    ops.read(REQ, f.node, 1 << 20, 0, file_info(opened.fh))  # the buffer grows
    assert replies.only() == ("buf", REQ, b"0123456789")
    fs.release(REQ, f.node, opened.fh)
    ops.read(REQ, f.node, 4, 0, file_info(opened.fh))
    assert replies.only() == ("err", REQ, errno.EBADF)


@pytest.mark.parametrize("granted", [False, True], ids=["no-mmap-grant", "mmap-granted"])
def test_open_and_create_set_direct_io_as_the_file_system_chooses(
    backing: tuple[Path, int], replies: Replies, granted: bool
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"x")
    fs = passthrough(fd, direct_io="writes")
    fs.direct_io_mmap = granted
    ops = serving(fs)
    f = fs.lookup(REQ, ROOT_ID, b"f")
    seen = {}
    for name, flags in (("ro", os.O_RDONLY), ("wo", os.O_WRONLY), ("rw", os.O_RDWR)):
        ops.open(REQ, f.node, file_info(flags=flags))
        kind, _, fh, direct_io, keep_cache = replies.only()
        assert kind == "open" and fh > 2 and keep_cache == 0
        seen[name] = direct_io
        fs.release(REQ, f.node, fh)
    ops.create(REQ, ROOT_ID, b"g", 0o644, file_info(flags=os.O_RDWR))
    kind, _, node, ino, mode, *_, fh, direct_io, _ = replies.only()
    assert kind == "create" and ino == os.stat(root / "g").st_ino and stat.S_ISREG(mode)
    assert node == fs.lookup(REQ, ROOT_ID, b"g").node
    seen["create-rw"] = direct_io
    fs.release(REQ, node, fh)
    assert seen == {"ro": 0, "wo": 1, "rw": int(granted), "create-rw": int(granted)}


def test_a_failed_open_sets_nothing(backing: tuple[Path, int], replies: Replies) -> None:
    _, fd = backing
    ops = serving(passthrough(fd, direct_io="all"))
    fi = file_info(flags=os.O_WRONLY)
    ops.open(REQ, 999, fi)
    assert replies.only() == ("err", REQ, errno.ESTALE)
    assert (fi.contents.fh, fi.contents.direct_io) == (0, 0)


def test_an_interrupted_open_is_released(backing: tuple[Path, int], replies: Replies) -> None:
    # fuse_reply_open fails when the caller was interrupted: the kernel will never release
    # the handle, so the callback does.
    root, fd = backing
    (root / "f").write_bytes(b"x")
    fs = passthrough(fd)
    ops = serving(fs)
    f = fs.lookup(REQ, ROOT_ID, b"f")
    replies.open_result = -errno.ENOENT
    for call in (
        lambda: ops.open(REQ, f.node, file_info(flags=os.O_RDONLY)),
        lambda: ops.create(REQ, ROOT_ID, b"c", 0o644, file_info(flags=os.O_WRONLY)),
        lambda: ops.opendir(REQ, ROOT_ID, file_info()),
    ):
        call()
        fh = replies.only()[-3]
        with pytest.raises(OSError) as info:
            os.fstat(fh)
        assert info.value.errno == errno.EBADF
    assert fs._dirs._open == {}


@pytest.mark.parametrize("request_kind", ["lookup", "mkdir", "create"])
def test_an_interrupted_entry_reply_forgets_the_node(
    backing: tuple[Path, int], replies: Replies, request_kind: str
) -> None:
    # The kernel never got the entry, so it will never forget it: the reference must be
    # given back at once, or the node's O_PATH handle (which pins an unlinked file's space)
    # stays open until unmount. libfuse's high-level layer does the same (fuse.c,
    # reply_entry and fuse_lib_create: forget_node).
    root, fd = backing
    (root / "f").write_bytes(b"x")
    fs = passthrough(fd)
    ops = serving(fs)
    replies.open_result = -errno.ENOENT
    if request_kind == "lookup":
        ops.lookup(REQ, ROOT_ID, b"f")
    elif request_kind == "mkdir":
        ops.mkdir(REQ, ROOT_ID, b"d", 0o755)
    else:
        ops.create(REQ, ROOT_ID, b"c", 0o644, file_info(flags=os.O_WRONLY))
    assert replies.only()[0] in ("entry", "create")
    assert fs.inodes.known == 1  # only the root: the kernel holds no reference to the node


def dirents(data: bytes) -> list[tuple[bytes, int, int, int]]:
    """(name, ino, next offset, type) of each ``struct fuse_dirent`` in a readdir reply."""
    found = []
    at = 0
    while at < len(data):
        ino, off, namelen, kind = (
            int.from_bytes(data[at : at + 8], "little"),
            int.from_bytes(data[at + 8 : at + 16], "little"),
            int.from_bytes(data[at + 16 : at + 20], "little"),
            int.from_bytes(data[at + 20 : at + 24], "little"),
        )
        found.append((data[at + 24 : at + 24 + namelen], ino, off, kind))
        at += (24 + namelen + 7) & ~7
    return found


def test_readdir_packs_what_fits_and_resumes(backing: tuple[Path, int], replies: Replies) -> None:
    root, fd = backing
    for i in range(30):
        (root / f"file-{i:02}").write_bytes(b"")
    (root / "sub").mkdir()
    fs = passthrough(fd)
    ops = serving(fs)
    fi = file_info()
    ops.opendir(REQ, ROOT_ID, fi)
    assert replies.only()[0] == "open"
    listing: list[tuple[bytes, int, int, int]] = []
    pages = 0
    offset = 0
    while True:
        ops.readdir(REQ, ROOT_ID, 256, offset, fi)  # room for a few entries per reply
        kind, _, data = replies.only()
        assert kind == "buf" and len(data) <= 256
        if not data:
            break
        page = dirents(data)
        assert page
        pages += 1
        listing += page
        offset = page[-1][2]
    assert pages > 3  # it did not fit one reply: each went on where the last stopped
    names = [name for name, *_ in listing]
    assert sorted(names) == sorted([b".", b"..", b"sub"] + [b"file-%02d" % i for i in range(30)])
    by_name = {name: (ino, kind) for name, ino, _, kind in listing}
    assert by_name[b"."] == (os.stat(root).st_ino, stat.S_IFDIR >> 12)
    assert by_name[b"sub"] == (os.stat(root / "sub").st_ino, stat.S_IFDIR >> 12)
    assert by_name[b"file-07"] == (os.stat(root / "file-07").st_ino, stat.S_IFREG >> 12)
    ops.releasedir(REQ, ROOT_ID, fi)
    assert replies.only() == ("err", REQ, 0)


def direntplus(data: bytes) -> list[tuple[bytes, int, int, int, int]]:
    """(name, node id, ino, next offset, mode) of each ``struct fuse_direntplus``."""
    found = []
    at = 0
    while at < len(data):
        nodeid = int.from_bytes(data[at : at + 8], "little")
        attr = at + 40  # struct fuse_entry_out: nodeid, generation, 2 valids, 2 nsecs
        ino = int.from_bytes(data[attr : attr + 8], "little")
        mode = int.from_bytes(data[attr + 60 : attr + 64], "little")
        dirent = at + 128  # sizeof(struct fuse_entry_out)
        off = int.from_bytes(data[dirent + 8 : dirent + 16], "little")
        namelen = int.from_bytes(data[dirent + 16 : dirent + 20], "little")
        found.append((data[dirent + 24 : dirent + 24 + namelen], nodeid, ino, off, mode))
        at = dirent + ((24 + namelen + 7) & ~7)
    return found


needs_readdirplus = pytest.mark.skipif(not V3, reason="libfuse 2 has no readdirplus")


@needs_readdirplus
def test_readdirplus_looks_up_each_entry_it_sends(
    backing: tuple[Path, int], replies: Replies
) -> None:
    root, fd = backing
    names = [b"file-%02d" % i for i in range(12)]
    for name in names:
        (root / os.fsdecode(name)).write_bytes(b"x" * len(name))
    (root / "sub").mkdir()
    fs = passthrough(fd)
    ops = serving(fs)
    fi = file_info()
    ops.opendir(REQ, ROOT_ID, fi)
    replies.only()
    listing = []
    offset, pages = 0, 0
    while True:
        ops.readdirplus(REQ, ROOT_ID, 512, offset, fi)  # room for two or three entries
        kind, _, data = replies.only()
        assert kind == "buf"
        if not data:
            break
        pages += 1
        page = direntplus(data)
        listing += page
        offset = page[-1][3]
    assert pages > 3
    by_name = {name: rest for name, *rest in listing}
    assert sorted(by_name) == sorted([b".", b"..", b"sub", *names])
    assert by_name[b"."][:2] == [0, os.stat(root).st_ino]  # no entry: not looked up
    for name in [b"sub", *names]:
        node, ino, _, mode = by_name[name]
        st = os.lstat(root / os.fsdecode(name))
        assert (ino, mode) == (st.st_ino, st.st_mode), name
        assert fs.inodes.get(node).nlookup == 1, name  # one reference per entry sent, no more
    # Every entry that did not fit a reply gave its reference back.
    assert fs.inodes.known == 1 + 1 + len(names)
    ops.releasedir(REQ, ROOT_ID, fi)


@needs_readdirplus
def test_readdirplus_gives_references_back_when_the_reply_fails(
    backing: tuple[Path, int], replies: Replies, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, fd = backing
    for i in range(5):
        (root / f"f{i}").write_bytes(b"")
    fs = passthrough(fd)
    ops = serving(fs)
    fi = file_info()
    ops.opendir(REQ, ROOT_ID, fi)
    replies.only()
    replies.buf_result = -errno.ENOENT  # interrupted: the kernel takes none of them
    ops.readdirplus(REQ, ROOT_ID, 4096, 0, fi)
    assert replies.only()[0] == "buf"
    assert fs.inodes.known == 1
    replies.buf_result = 0
    looked_up: list[bytes] = []
    real = fs.readdir_entry

    def third_fails(parent: int, name: bytes) -> Entry:
        looked_up.append(name)
        if len(looked_up) == 3:
            raise OSError(errno.EIO, "backing failed")
        return real(parent, name)

    monkeypatch.setattr(fs, "readdir_entry", third_fails)
    ops.readdirplus(REQ, ROOT_ID, 4096, 0, fi)
    assert replies.only() == ("err", REQ, errno.EIO)
    assert fs.inodes.known == 1  # the two looked up before were given back
    monkeypatch.delattr(fs, "readdir_entry")  # the class's again (the replies stay recorded)
    os.unlink(root / "f2")  # removed since the listing was taken: skipped
    ops.readdirplus(REQ, ROOT_ID, 4096, 2, fi)
    names = sorted(name for name, *_ in direntplus(replies.only()[2]))
    assert names == [b"f0", b"f1", b"f3", b"f4"]
    assert fs.inodes.known == 1 + 4
    ops.releasedir(REQ, ROOT_ID, fi)


@needs_readdirplus
def test_open_and_create_ask_for_no_flush_at_close(
    backing: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"")
    sent: list[tuple[int, int]] = []

    def reply(req: int, *args: Any) -> int:
        info = args[-1].contents
        sent.append((info.fh, info.noflush))
        return 0

    monkeypatch.setattr(callbacks, "reply_open", reply)
    monkeypatch.setattr(callbacks, "reply_create", reply)
    fs = passthrough(fd)
    ops = serving(fs)
    ops.open(REQ, fs.lookup(REQ, ROOT_ID, b"f").node, file_info(flags=os.O_RDONLY))
    ops.create(REQ, ROOT_ID, b"g", 0o644, file_info(flags=os.O_WRONLY))
    ops.opendir(REQ, ROOT_ID, file_info())
    assert [noflush for _, noflush in sent] == [1, 1, 0]
    for fh, _ in sent[:2]:
        os.close(fh)
    fs.releasedir(REQ, ROOT_ID, sent[2][0])


def test_statfs_readlink_and_xattr_sizes(backing: tuple[Path, int], replies: Replies) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"")
    os.setxattr(root / "f", "user.k", b"value")
    os.symlink("f", root / "l")
    fs = passthrough(fd)
    ops = serving(fs)
    ops.statfs(REQ, ROOT_ID)
    vfs = os.statvfs(root)
    assert replies.only() == ("statfs", REQ, vfs.f_blocks, vfs.f_namemax)
    ops.readlink(REQ, fs.lookup(REQ, ROOT_ID, b"l").node)
    assert replies.only() == ("readlink", REQ, b"f")
    f = fs.lookup(REQ, ROOT_ID, b"f").node
    # size 0 asks how big; too small is ERANGE; enough gets the value.
    ops.getxattr(REQ, f, b"user.k", 0)
    assert replies.only() == ("xattr", REQ, 5)
    ops.getxattr(REQ, f, b"user.k", 4)
    assert replies.only() == ("err", REQ, errno.ERANGE)
    ops.getxattr(REQ, f, b"user.k", 5)
    assert replies.only() == ("buf", REQ, b"value")
    ops.listxattr(REQ, f, 0)
    assert replies.only() == ("xattr", REQ, len(b"user.k\0"))
    ops.listxattr(REQ, f, 3)
    assert replies.only() == ("err", REQ, errno.ERANGE)
    ops.listxattr(REQ, f, 100)
    assert replies.only() == ("buf", REQ, b"user.k\0")
    value = ctypes.create_string_buffer(b"new\0value", 9)
    ops.setxattr(REQ, f, b"user.n", ctypes.addressof(value), 9, 0)
    assert replies.only() == ("err", REQ, 0)
    assert os.getxattr(root / "f", "user.n") == b"new\0value"  # every byte, NULs too
    ops.setxattr(REQ, f, b"user.empty", None, 0, 0)
    assert replies.only() == ("err", REQ, 0)
    assert os.getxattr(root / "f", "user.empty") == b""
    ops.removexattr(REQ, f, b"user.n")
    assert replies.only() == ("err", REQ, 0)
    ops.getxattr(REQ, f, b"user.n", 0)
    assert replies.only() == ("err", REQ, errno.ENODATA)


def test_names_and_links_are_answered_with_entries(
    backing: tuple[Path, int], replies: Replies
) -> None:
    root, fd = backing
    fs = passthrough(fd)
    ops = serving(fs)
    ops.mkdir(REQ, ROOT_ID, b"d", 0o750)
    kind, _, node, ino, mode, *_ = replies.only()
    assert kind == "entry" and ino == os.stat(root / "d").st_ino and stat.S_ISDIR(mode)
    ops.mknod(REQ, node, b"p", stat.S_IFIFO | 0o600, 0)
    assert replies.only()[0] == "entry" and stat.S_ISFIFO(os.lstat(root / "d" / "p").st_mode)
    ops.symlink(REQ, b"p", node, b"l")
    assert replies.only()[0] == "entry" and os.readlink(root / "d" / "l") == "p"
    pipe = fs.lookup(REQ, node, b"p").node
    ops.link(REQ, pipe, ROOT_ID, b"hard")
    kind, _, linked, *_ = replies.only()
    assert (kind, linked) == ("entry", pipe)
    ops.unlink(REQ, ROOT_ID, b"hard")
    ops.access(REQ, node, os.F_OK)
    ops.rmdir(REQ, ROOT_ID, b"d")
    assert replies.sent == [("err", REQ, 0), ("err", REQ, 0), ("err", REQ, errno.ENOTEMPTY)]


@pytest.mark.skipif(not V3, reason="libfuse 2 has no lseek")
def test_lseek_answers_the_offset(backing: tuple[Path, int], replies: Replies) -> None:
    _, fd = backing
    fs = passthrough(fd)
    ops = serving(fs)
    entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o644, os.O_RDWR)
    os.pwrite(opened.fh, b"x", 1 << 20)
    ops.lseek(REQ, entry.node, 0, os.SEEK_DATA, file_info(opened.fh))
    assert replies.only() == ("lseek", REQ, os.lseek(opened.fh, 0, os.SEEK_DATA))
    ops.lseek(REQ, entry.node, 2 << 20, os.SEEK_DATA, file_info(opened.fh))
    assert replies.only() == ("err", REQ, errno.ENXIO)
    fs.release(REQ, entry.node, opened.fh)


def test_init_gets_the_connection_and_the_session(replies: Replies) -> None:
    seen: list[tuple[Any, ...]] = []

    class Init:
        attr_timeout = entry_timeout = negative_timeout = 1.0

        def init(self, conn: Any, is_v3: bool, session: int) -> None:
            seen.append((conn.max_write, is_v3, session))
            conn.want = 0x42  # written where libfuse reads it back

        def destroy(self) -> None:
            seen.append(("destroyed",))

    ops = serving(Init())
    ops.callbacks.fuse_session = 0xABC
    conn = lowlevel.fuse_conn_info()
    conn.max_write = 4096
    ops.init(None, ctypes.pointer(conn))
    ops.destroy(None)
    assert seen == [(4096, V3, 0xABC), ("destroyed",)]
    assert conn.want == 0x42
    assert replies.sent == []


# ---------------------------------------------------------------- request context


def test_request_context_reads_the_callers_credentials() -> None:
    # fuse_req_ctx only computes the address of the request's ctx: a buffer can stand in for
    # a request, with the credentials written where libfuse keeps them.
    request = ctypes.create_string_buffer(4096)
    req = ctypes.addressof(request)
    offset = ctypes.addressof(lowlevel.req_ctx(req).contents) - req
    assert 0 <= offset <= 4096 - ctypes.sizeof(lowlevel.fuse_ctx)
    ctx = lowlevel.fuse_ctx.from_buffer(request, offset)
    ctx.uid, ctx.gid, ctx.pid = 1000, 100, 4242
    assert _fuse.request_context(req) == _fuse.Context(uid=1000, gid=100, pid=4242)
    assert _default_caller(req) == Caller(pid=4242, uid=1000, gid=100)


# ---------------------------------------------------------------- serve


def test_serve_raises_mount_failed_where_it_cannot_mount(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(_fuse.MountFailed):
            _fuse.serve(
                PassthroughFS(InodeTable(root)), str(tmp_path / "missing"), {"subtype": "burstctl"}
            )
    finally:
        os.close(root)
    assert "missing" in capfd.readouterr().err  # libfuse said why


def test_option_args() -> None:
    assert _fuse.option_args({"ro": True, "max_read": 4096, "fsname": "a\\,b"}) == [
        "-o",
        "ro,max_read=4096,fsname=a\\,b",
    ]
    assert _fuse.option_args({}) == []


def test_the_data_classes() -> None:
    assert Opened(3) == Opened(fh=3, direct_io=False, keep_cache=False)
    assert SetAttr() == SetAttr(None, None, None, None, None, None)
    st = os.stat("/")
    assert Entry(2, st).attr is st
    assert operations.file_type(stat.S_IFDIR | 0o755) == stat.S_IFDIR


# ---------------------------------------------------------------- DirectIoMmap


def init_reply(flags: int, *, major: int = 7, body_size: int = 64) -> tuple[Any, Any]:
    """An INIT reply as libfuse hands it to its writer: header, then fuse_init_out."""
    header = ctypes.create_string_buffer(16)
    body = ctypes.create_string_buffer(body_size)
    ctypes.c_uint32.from_buffer(body, 0).value = major
    ctypes.c_uint32.from_buffer(body, 4).value = 38
    if body_size >= 16:
        ctypes.c_uint32.from_buffer(body, 12).value = flags
    iov = (direct_io_mmap._IoVec * 2)()
    iov[0].iov_base, iov[0].iov_len = ctypes.addressof(header), 16
    iov[1].iov_base, iov[1].iov_len = ctypes.addressof(body), body_size
    return iov, body


FUSE_INIT_EXT = 1 << 30


def test_the_init_reply_gets_the_direct_io_mmap_flag() -> None:
    iov, body = init_reply(FUSE_INIT_EXT | 0x1234)
    before = body.raw
    assert _fuse.grant_direct_io_mmap(iov, 2)
    after = body.raw
    assert int.from_bytes(after[32:36], "little") == 1 << 4  # bit 36 of the 64-bit flags
    assert after[:32] == before[:32] and after[36:] == before[36:]  # nothing else touched


@pytest.mark.parametrize(
    "reply",
    [
        {"flags": 0x1234},  # the kernel offered no 64-bit flags: no flags2 to set
        {"flags": FUSE_INIT_EXT, "major": 8},  # not protocol 7
        {"flags": FUSE_INIT_EXT, "body_size": 24},  # an old, short reply
    ],
    ids=["no-init-ext", "other-major", "short-reply"],
)
def test_other_replies_are_left_alone(reply: dict[str, int]) -> None:
    iov, body = init_reply(**reply)
    before = body.raw
    assert not _fuse.grant_direct_io_mmap(iov, 2)
    assert body.raw == before
    assert not _fuse.grant_direct_io_mmap(init_reply(FUSE_INIT_EXT)[0], 1)  # one part only


def test_the_hook_writes_the_patched_reply_then_hands_writing_to_libc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replies: list[bool] = []
    hook = _fuse.DirectIoMmap(replies.append)
    installed: list[int] = []

    def custom_io(session: Any, io: Any, fd: int) -> int:
        installed.append(ctypes.cast(io, ctypes.POINTER(direct_io_mmap._CustomIo)).contents.writev)
        return 0

    monkeypatch.setattr(hook, "_custom_io", custom_io)
    read_end, write_end = os.pipe()
    try:
        hook._fd = write_end
        iov, _body = init_reply(FUSE_INIT_EXT)  # _body: keeps the buffer alive
        written = hook._hook(write_end, iov, 2, None)  # called through ctypes, as libfuse does
        assert written == 16 + 64
        sent = os.read(read_end, 1024)
        # Only the first message is the INIT reply: a later one passes untouched.
        again, _again = init_reply(FUSE_INIT_EXT)
        assert hook._hook(write_end, again, 2, None) == 16 + 64
        assert int.from_bytes(os.read(read_end, 1024)[16 + 32 : 16 + 36], "little") == 0
    finally:
        os.close(read_end)
        os.close(write_end)
    assert replies == [True]
    assert int.from_bytes(sent[16 + 32 : 16 + 36], "little") == 1 << 4
    assert installed == [ctypes.cast(direct_io_mmap._libc.writev, ctypes.c_void_p).value]


def test_a_failing_on_reply_still_writes_the_reply(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(granted: bool) -> None:
        raise ZeroDivisionError("a bug")

    hook = _fuse.DirectIoMmap(broken)
    monkeypatch.setattr(hook, "_custom_io", lambda *args: 0)
    read_end, write_end = os.pipe()
    try:
        iov, _body = init_reply(FUSE_INIT_EXT)
        with caplog.at_level(logging.ERROR, "burstctl.fuse_shim._fuse"):
            assert hook._hook(write_end, iov, 2, None) == 16 + 64
        assert len(os.read(read_end, 1024)) == 16 + 64
    finally:
        os.close(read_end)
        os.close(write_end)
    assert "asking for shared mmap of direct_io files failed" in caplog.text


@pytest.mark.parametrize(
    ("release", "expected"),
    [
        ("6.18.44-fc-v595", (6, 18)),
        ("5.15.0-91-generic", (5, 15)),
        ("6.6", (6, 6)),
        ("6.10rc1", (6, 10)),
        ("weird", (0, 0)),
    ],
)
def test_kernel_release(release: str, expected: tuple[int, int]) -> None:
    assert _fuse.kernel_release(release) == expected


def test_kernel_release_of_the_running_kernel() -> None:
    major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    assert _fuse.kernel_release() == (major, minor)


def test_the_hook_is_used_only_where_it_was_checked() -> None:
    assert _fuse.DirectIoMmap.unavailable((3, 14), (6, 18)) is None
    assert "needs 6.6" in str(_fuse.DirectIoMmap.unavailable((3, 14), (6, 5)))
    for other in ((2, 9), (3, 16), (3, 17)):
        assert "only on 3.14" in str(_fuse.DirectIoMmap.unavailable(other, (6, 18)))
