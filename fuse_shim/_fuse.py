"""The one import seam for the FUSE binding: libfuse's low-level API, over ctypes.

Everything else in `burstctl.fuse_shim` imports FUSE names from here. Importing this module
loads libfuse (2 or 3, through mfusepy's loader, which honours ``FUSE_LIBRARY_PATH``) and
raises `OSError` when it is missing; callers import it lazily. mfusepy gives the C structures
(``struct stat``, ``statvfs``, ``fuse_file_info``, ``fuse_conn_info``) for the loaded
library; this module binds the low-level session and reply functions itself.

Why the low-level API (``fuse_lowlevel.h``) rather than libfuse's path-based one: requests
name an inode, not a path. The file system keeps a handle per inode (`fs.PassthroughFS`), so

- depth is not limited by PATH_MAX, and a file unlinked or replaced while open keeps working
  through its handle (``fstat``, ``fchmod``, ``futimens`` included);
- hard links are one kernel inode, so the kernel may cache attributes and names
  (``attr_timeout`` / ``entry_timeout``): a ``stat`` of a cached name never reaches Python;
- one request is one Python call (the path API adds a GETATTR after every create, mknod,
  mkdir, symlink and link, and builds a path for each request under a global lock);
- ``rename`` gets its flags (RENAME_EXCHANGE, RENAME_NOREPLACE) and libfuse 3 ``lseek``
  (SEEK_DATA / SEEK_HOLE).

`Operations` lists what the file system implements; `serve` mounts, runs libfuse's
multithreaded loop until the mount is gone, and unmounts. Each callback is a thin C-callable
wrapper: it calls the file system's method, sends the reply, and turns an `OSError` into its
errno (anything else is logged and answered EIO), so nothing ever raises into libfuse.

`DirectIoMmap` patches libfuse 3.14's INIT reply to allow shared ``mmap`` of ``direct_io``
files (see its docstring).
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import itertools
import logging
import os
import re
import stat
import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import mfusepy

logger = logging.getLogger(__name__)

# (major, minor) of the libfuse that was loaded, e.g. (2, 9).
LIBFUSE_VERSION: tuple[int, int] = (mfusepy.fuse_version_major, mfusepy.fuse_version_minor)
_V3 = LIBFUSE_VERSION[0] >= 3

_lib = ctypes.CDLL(mfusepy._libfuse_path)
# Reply and context functions, bound again without releasing the GIL: each is a few
# instructions plus a writev to /dev/fuse, cheaper than the GIL hand-over a CDLL call makes.
_plib = ctypes.PyDLL(mfusepy._libfuse_path)

c_stat = mfusepy.c_stat
c_statvfs = mfusepy.c_statvfs
fuse_file_info = mfusepy.fuse_file_info
fuse_conn_info = mfusepy.fuse_conn_info

_ino_t = ctypes.c_uint64
_req_t = ctypes.c_void_p
_off_t = ctypes.c_int64
_fi_p = ctypes.POINTER(fuse_file_info)
_stat_p = ctypes.POINTER(c_stat)


class fuse_entry_param(ctypes.Structure):
    _fields_ = [
        ("ino", _ino_t),
        ("generation", ctypes.c_uint64),
        ("attr", c_stat),
        ("attr_timeout", ctypes.c_double),
        ("entry_timeout", ctypes.c_double),
    ]


class fuse_ctx(ctypes.Structure):
    _fields_ = [
        ("uid", ctypes.c_uint32),
        ("gid", ctypes.c_uint32),
        ("pid", ctypes.c_int32),
        ("umask", ctypes.c_uint32),
    ]


class fuse_forget_data(ctypes.Structure):
    _fields_ = [("ino", _ino_t), ("nlookup", ctypes.c_uint64)]


class fuse_args(ctypes.Structure):
    _fields_ = [
        ("argc", ctypes.c_int),
        ("argv", ctypes.POINTER(ctypes.c_char_p)),
        ("allocated", ctypes.c_int),
    ]


_CB = ctypes.CFUNCTYPE
_V = None  # void return
_name = ctypes.c_char_p
_fields: list[tuple[str, Any]] = [
    ("init", _CB(_V, ctypes.c_void_p, ctypes.POINTER(fuse_conn_info))),
    ("destroy", _CB(_V, ctypes.c_void_p)),
    ("lookup", _CB(_V, _req_t, _ino_t, _name)),
    ("forget", _CB(_V, _req_t, _ino_t, ctypes.c_uint64)),
    ("getattr", _CB(_V, _req_t, _ino_t, _fi_p)),
    ("setattr", _CB(_V, _req_t, _ino_t, _stat_p, ctypes.c_int, _fi_p)),
    ("readlink", _CB(_V, _req_t, _ino_t)),
    ("mknod", _CB(_V, _req_t, _ino_t, _name, ctypes.c_uint32, ctypes.c_uint64)),
    ("mkdir", _CB(_V, _req_t, _ino_t, _name, ctypes.c_uint32)),
    ("unlink", _CB(_V, _req_t, _ino_t, _name)),
    ("rmdir", _CB(_V, _req_t, _ino_t, _name)),
    ("symlink", _CB(_V, _req_t, _name, _ino_t, _name)),
    (
        "rename",
        _CB(_V, _req_t, _ino_t, _name, _ino_t, _name, ctypes.c_uint)
        if _V3
        else _CB(_V, _req_t, _ino_t, _name, _ino_t, _name),
    ),
    ("link", _CB(_V, _req_t, _ino_t, _ino_t, _name)),
    ("open", _CB(_V, _req_t, _ino_t, _fi_p)),
    ("read", _CB(_V, _req_t, _ino_t, ctypes.c_size_t, _off_t, _fi_p)),
    ("write", _CB(_V, _req_t, _ino_t, ctypes.c_void_p, ctypes.c_size_t, _off_t, _fi_p)),
    ("flush", _CB(_V, _req_t, _ino_t, _fi_p)),
    ("release", _CB(_V, _req_t, _ino_t, _fi_p)),
    ("fsync", _CB(_V, _req_t, _ino_t, ctypes.c_int, _fi_p)),
    ("opendir", _CB(_V, _req_t, _ino_t, _fi_p)),
    ("readdir", _CB(_V, _req_t, _ino_t, ctypes.c_size_t, _off_t, _fi_p)),
    ("releasedir", _CB(_V, _req_t, _ino_t, _fi_p)),
    ("fsyncdir", _CB(_V, _req_t, _ino_t, ctypes.c_int, _fi_p)),
    ("statfs", _CB(_V, _req_t, _ino_t)),
    (
        "setxattr",
        _CB(_V, _req_t, _ino_t, _name, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int),
    ),
    ("getxattr", _CB(_V, _req_t, _ino_t, _name, ctypes.c_size_t)),
    ("listxattr", _CB(_V, _req_t, _ino_t, ctypes.c_size_t)),
    ("removexattr", _CB(_V, _req_t, _ino_t, _name)),
    ("access", _CB(_V, _req_t, _ino_t, ctypes.c_int)),
    ("create", _CB(_V, _req_t, _ino_t, _name, ctypes.c_uint32, _fi_p)),
    ("getlk", ctypes.c_void_p),
    ("setlk", ctypes.c_void_p),
    ("bmap", ctypes.c_void_p),
    ("ioctl", ctypes.c_void_p),
    ("poll", ctypes.c_void_p),
    ("write_buf", ctypes.c_void_p),
    ("retrieve_reply", ctypes.c_void_p),
    (
        "forget_multi",
        _CB(_V, _req_t, ctypes.c_size_t, ctypes.POINTER(fuse_forget_data)),
    ),
    ("flock", ctypes.c_void_p),
    ("fallocate", _CB(_V, _req_t, _ino_t, ctypes.c_int, _off_t, _off_t, _fi_p)),
]
if _V3:
    _fields += [
        ("readdirplus", _CB(_V, _req_t, _ino_t, ctypes.c_size_t, _off_t, _fi_p)),
        ("copy_file_range", ctypes.c_void_p),
        ("lseek", _CB(_V, _req_t, _ino_t, _off_t, ctypes.c_int, _fi_p)),
    ]


class fuse_lowlevel_ops(ctypes.Structure):
    _fields_ = _fields


def _bind(name: str, restype: Any, *argtypes: Any, lib: Any = _plib) -> Any:
    function = getattr(lib, name)
    function.restype = restype
    function.argtypes = list(argtypes)
    return function


_reply_err = _bind("fuse_reply_err", ctypes.c_int, _req_t, ctypes.c_int)
_reply_none = _bind("fuse_reply_none", None, _req_t)
_reply_entry = _bind("fuse_reply_entry", ctypes.c_int, _req_t, ctypes.POINTER(fuse_entry_param))
_reply_create = _bind(
    "fuse_reply_create", ctypes.c_int, _req_t, ctypes.POINTER(fuse_entry_param), _fi_p
)
_reply_attr = _bind("fuse_reply_attr", ctypes.c_int, _req_t, _stat_p, ctypes.c_double)
_reply_readlink = _bind("fuse_reply_readlink", ctypes.c_int, _req_t, ctypes.c_char_p)
_reply_open = _bind("fuse_reply_open", ctypes.c_int, _req_t, _fi_p)
_reply_write = _bind("fuse_reply_write", ctypes.c_int, _req_t, ctypes.c_size_t)
_reply_buf = _bind("fuse_reply_buf", ctypes.c_int, _req_t, ctypes.c_void_p, ctypes.c_size_t)
_reply_statfs = _bind("fuse_reply_statfs", ctypes.c_int, _req_t, ctypes.POINTER(c_statvfs))
_reply_xattr = _bind("fuse_reply_xattr", ctypes.c_int, _req_t, ctypes.c_size_t)
_add_direntry_plus = (
    _bind(
        "fuse_add_direntry_plus",
        ctypes.c_size_t,
        _req_t,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_char_p,
        ctypes.POINTER(fuse_entry_param),
        _off_t,
    )
    if _V3
    else None
)
_notify_inval_entry = _bind(
    "fuse_lowlevel_notify_inval_entry",
    ctypes.c_int,
    ctypes.c_void_p,
    _ino_t,
    ctypes.c_char_p,
    ctypes.c_size_t,
    lib=_lib,  # it writes to /dev/fuse and may wait: the GIL is released
)
_req_ctx = _bind("fuse_req_ctx", ctypes.POINTER(fuse_ctx), _req_t)
_reply_lseek = _bind("fuse_reply_lseek", ctypes.c_int, _req_t, _off_t) if _V3 else None

# fuse_common.h: the capabilities the file system turns on or off at init.
CAP_ASYNC_READ = 1 << 0
CAP_ATOMIC_O_TRUNC = 1 << 3
CAP_BIG_WRITES = 1 << 5  # libfuse 2 only
CAP_AUTO_INVAL_DATA = 1 << 12  # libfuse 3
CAP_HANDLE_KILLPRIV = 1 << 20  # libfuse 3
CAP_CACHE_SYMLINKS = 1 << 23  # libfuse 3

# fuse_lowlevel.h: which fields a setattr changes.
SET_ATTR_MODE = 1 << 0
SET_ATTR_UID = 1 << 1
SET_ATTR_GID = 1 << 2
SET_ATTR_SIZE = 1 << 3
SET_ATTR_ATIME = 1 << 4
SET_ATTR_MTIME = 1 << 5
SET_ATTR_ATIME_NOW = 1 << 7
SET_ATTR_MTIME_NOW = 1 << 8

ROOT_ID = 1  # FUSE_ROOT_ID: the node id of the mount's root


@dataclass(frozen=True, slots=True)
class Context:
    """Who made a request: uid, gid (the caller's fsuid/fsgid) and pid (a thread id; 0 for
    requests the kernel makes on its own, e.g. writeback of a shared mapping)."""

    uid: int
    gid: int
    pid: int


def request_context(req: int) -> Context:
    """The caller of the request ``req``."""
    ctx = _req_ctx(req).contents
    return Context(ctx.uid, ctx.gid, ctx.pid)


@dataclass(frozen=True, slots=True)
class Entry:
    """A looked-up name: the kernel's node id for it and its attributes."""

    node: int
    attr: os.stat_result


@dataclass(frozen=True, slots=True)
class Opened:
    """An open file or directory: the handle the kernel passes back, and how it is cached."""

    fh: int
    direct_io: bool = False
    keep_cache: bool = False
    # No FLUSH request at close(2) (libfuse 3; libfuse 2 always sends it).
    noflush: bool = False


@dataclass(frozen=True, slots=True)
class SetAttr:
    """The changes of one setattr: a field is None when it is not changed.

    Times are nanoseconds since the epoch, or `NOW`.
    """

    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    size: int | None = None
    atime: int | None = None
    mtime: int | None = None


NOW = -1  # SetAttr.atime / mtime: the current time


class Operations(Protocol):
    """What `serve` needs of a file system. Every method may raise `OSError` (its errno is
    the reply); ``req`` is the request, for `request_context`. Node ids are the file
    system's own (`ROOT_ID` is the root); ``fh`` is what ``open``/``create``/``opendir``
    returned, None when the kernel sent none."""

    attr_timeout: float
    entry_timeout: float
    negative_timeout: float
    # Set by `serve` once the session exists: asks the kernel to drop its cached
    # (parent, name) entry, after which it forgets the inode unless it is in use.
    invalidate_entry: Callable[[int, bytes], int] | None

    def init(self, conn: Any, is_v3: bool, session: int) -> None: ...
    def destroy(self) -> None: ...
    def lookup(self, req: int, parent: int, name: bytes) -> Entry: ...
    def forget(self, node: int, nlookup: int) -> None: ...
    def getattr(self, req: int, node: int, fh: int | None) -> os.stat_result: ...
    def setattr(self, req: int, node: int, change: SetAttr, fh: int | None) -> os.stat_result: ...
    def readlink(self, req: int, node: int) -> bytes: ...
    def mknod(self, req: int, parent: int, name: bytes, mode: int, rdev: int) -> Entry: ...
    def mkdir(self, req: int, parent: int, name: bytes, mode: int) -> Entry: ...
    def unlink(self, req: int, parent: int, name: bytes) -> None: ...
    def rmdir(self, req: int, parent: int, name: bytes) -> None: ...
    def symlink(self, req: int, target: bytes, parent: int, name: bytes) -> Entry: ...
    def rename(
        self, req: int, parent: int, name: bytes, new_parent: int, new_name: bytes, flags: int
    ) -> None: ...
    def link(self, req: int, node: int, new_parent: int, new_name: bytes) -> Entry: ...
    def open(self, req: int, node: int, flags: int) -> Opened: ...
    def create(
        self, req: int, parent: int, name: bytes, mode: int, flags: int
    ) -> tuple[Entry, Opened]: ...
    def read(self, req: int, node: int, buf: memoryview, offset: int, fh: int) -> int: ...
    def write(
        self, req: int, node: int, data: memoryview, offset: int, fh: int, writepage: bool
    ) -> int: ...
    def flush(self, req: int, node: int, fh: int) -> None: ...
    def release(self, req: int, node: int, fh: int) -> None: ...
    def fsync(self, req: int, node: int, datasync: bool, fh: int) -> None: ...
    def opendir(self, req: int, node: int) -> Opened: ...
    def readdir(self, req: int, node: int, offset: int, fh: int) -> Listing: ...
    def readdir_entry(self, parent: int, name: bytes) -> Entry: ...
    def releasedir(self, req: int, node: int, fh: int) -> None: ...
    def fsyncdir(self, req: int, node: int, datasync: bool, fh: int) -> None: ...
    def statfs(self, req: int, node: int) -> os.statvfs_result: ...
    def setxattr(self, req: int, node: int, name: bytes, value: bytes, flags: int) -> None: ...
    def getxattr(self, req: int, node: int, name: bytes) -> bytes: ...
    def listxattr(self, req: int, node: int) -> bytes: ...
    def removexattr(self, req: int, node: int, name: bytes) -> None: ...
    def access(self, req: int, node: int, mask: int) -> None: ...
    def fallocate(
        self, req: int, node: int, mode: int, offset: int, length: int, fh: int
    ) -> None: ...
    def lseek(self, req: int, node: int, offset: int, whence: int, fh: int) -> int: ...


@dataclass(frozen=True, slots=True)
class DirEntry:
    """One directory entry for readdir: its name, inode number, file type (S_IFMT bits),
    and the offset at which the next readdir continues after it."""

    name: bytes
    ino: int
    mode: int
    next_offset: int


_DIRENT = struct.Struct("<QQII")  # fuse_kernel.h struct fuse_dirent, before the name


class Listing:
    """A directory's entries, packed once in the form the kernel reads them (``struct
    fuse_dirent``, 8-byte aligned): each readdir request is then one slice of whole records,
    with no Python work per entry."""

    def __init__(self, entries: Sequence[DirEntry]) -> None:
        self.entries = list(entries)
        parts: list[bytes] = []
        ends: list[int] = []
        end = 0
        for entry in self.entries:
            size = (_DIRENT.size + len(entry.name) + 7) & ~7
            head = _DIRENT.pack(entry.ino, entry.next_offset, len(entry.name), entry.mode >> 12)
            parts.append(head + entry.name + bytes(size - _DIRENT.size - len(entry.name)))
            end += size
            ends.append(end)
        self._ends = ends
        self._buffer = ctypes.create_string_buffer(b"".join(parts), max(end, 1))
        self._address = ctypes.addressof(self._buffer)

    def chunk(self, offset: int, size: int) -> tuple[int, int]:
        """(address, length) of the records from entry ``offset`` on that fit in ``size``."""
        if offset >= len(self._ends):
            return self._address, 0
        start = self._ends[offset - 1] if offset > 0 else 0
        fit = bisect.bisect_right(self._ends, start + size)  # entries ending within the size
        end = self._ends[fit - 1] if fit > offset else start
        return self._address + start, end - start


def _fill_stat(out: Any, st: os.stat_result) -> None:
    out.st_dev = st.st_dev
    out.st_ino = st.st_ino
    out.st_nlink = st.st_nlink
    out.st_mode = st.st_mode
    out.st_uid = st.st_uid
    out.st_gid = st.st_gid
    out.st_rdev = st.st_rdev
    out.st_size = st.st_size
    out.st_blksize = st.st_blksize
    out.st_blocks = st.st_blocks
    out.st_atimespec.tv_sec, out.st_atimespec.tv_nsec = divmod(st.st_atime_ns, 1_000_000_000)
    out.st_mtimespec.tv_sec, out.st_mtimespec.tv_nsec = divmod(st.st_mtime_ns, 1_000_000_000)
    out.st_ctimespec.tv_sec, out.st_ctimespec.tv_nsec = divmod(st.st_ctime_ns, 1_000_000_000)


def _time_ns(spec: Any) -> int:
    return int(spec.tv_sec) * 1_000_000_000 + int(spec.tv_nsec)


class _Buffers(threading.local):
    """A read buffer per libfuse worker thread, grown to the largest request seen."""

    def __init__(self) -> None:
        self.buffer = ctypes.create_string_buffer(0)
        self.view = memoryview(self.buffer).cast("B")

    def get(self, size: int) -> tuple[Any, memoryview]:
        if len(self.buffer) < size:
            self.buffer = ctypes.create_string_buffer(size)
            self.view = memoryview(self.buffer).cast("B")
        return self.buffer, self.view[:size]


def _view(address: int | None, size: int) -> memoryview:
    """A view of ``size`` bytes of libfuse's memory at ``address`` (no copy)."""
    if size == 0 or address is None:
        return memoryview(b"")
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B")


_PyGILState_Ensure = ctypes.pythonapi.PyGILState_Ensure
_PyGILState_Ensure.restype = ctypes.c_int
_PyGILState_Ensure.argtypes = []
_pins = threading.local()


def _pinned(method: Callable[..., None]) -> Callable[..., None]:
    """``method``, keeping the Python thread state of the libfuse worker that calls it.

    ctypes enters a callback on a thread Python did not start with ``PyGILState_Ensure`` and
    leaves it with ``PyGILState_Release``, which creates and destroys a thread state each
    time: on Python 3.11 that is an mmap and a munmap of its frame stack per request, and
    every munmap in a multithreaded process shoots down TLBs on the other CPUs. One extra
    ``PyGILState_Ensure`` per worker thread (never released) keeps its thread state alive.
    """

    def call(*args: Any) -> None:
        if not getattr(_pins, "pinned", False):
            _PyGILState_Ensure()  # the GIL is held here: this only counts one more user
            _pins.pinned = True
        method(*args)

    return call


class _Callbacks:
    """The C-callable callbacks of one mount: each calls the file system and replies."""

    def __init__(self, fs: Operations, ops: Any) -> None:
        self.fs = fs
        self.ops = ops
        self._buffers = _Buffers()
        self._keep: list[Any] = []  # the ctypes thunks must live as long as the session
        self.session: int = 0
        names = [name for name, kind in fuse_lowlevel_ops._fields_ if kind is not ctypes.c_void_p]
        for name in names:
            prototype = dict(fuse_lowlevel_ops._fields_)[name]
            thunk = prototype(_pinned(getattr(self, "_" + name)))
            self._keep.append(thunk)
            setattr(ops, name, thunk)

    # Every callback: the file system's answer, or its errno; nothing escapes into libfuse.
    def _fail(self, req: int, name: str, err: BaseException) -> None:
        if isinstance(err, OSError) and isinstance(err.errno, int) and err.errno > 0:
            code = err.errno
        else:
            logger.error("%s failed on a bug; answering EIO", name, exc_info=err)
            code = errno.EIO
        _reply_err(req, code)

    def _entry(self, entry: Entry) -> fuse_entry_param:
        param = fuse_entry_param()
        param.ino = entry.node
        _fill_stat(param.attr, entry.attr)
        param.attr_timeout = self.fs.attr_timeout
        param.entry_timeout = self.fs.entry_timeout
        return param

    def _reply_entry(self, req: int, entry: Entry) -> None:
        if _reply_entry(req, ctypes.byref(self._entry(entry))) != 0:
            # The caller was interrupted: the kernel never took this reference.
            self.fs.forget(entry.node, 1)

    def _init(self, userdata: Any, conn: Any) -> None:
        try:
            self.fs.init(conn.contents, _V3, self.session)
        except BaseException:
            logger.exception("init failed")

    def _destroy(self, userdata: Any) -> None:
        try:
            self.fs.destroy()
        except BaseException:
            logger.exception("destroy failed")

    def _lookup(self, req: int, parent: int, name: bytes) -> None:
        try:
            entry = self.fs.lookup(req, parent, name)
        except OSError as err:
            if err.errno == errno.ENOENT and self.fs.negative_timeout > 0:
                # A negative entry, cached by the kernel for negative_timeout.
                param = fuse_entry_param()
                param.entry_timeout = self.fs.negative_timeout
                _reply_entry(req, ctypes.byref(param))
                return
            self._fail(req, "lookup", err)
            return
        except BaseException as err:
            self._fail(req, "lookup", err)
            return
        self._reply_entry(req, entry)

    def _forget(self, req: int, node: int, nlookup: int) -> None:
        try:
            self.fs.forget(node, nlookup)
        except BaseException:
            logger.exception("forget failed")
        _reply_none(req)

    def _forget_multi(self, req: int, count: int, forgets: Any) -> None:
        try:
            for i in range(count):
                self.fs.forget(forgets[i].ino, forgets[i].nlookup)
        except BaseException:
            logger.exception("forget failed")
        _reply_none(req)

    def _attr(self, req: int, st: os.stat_result) -> None:
        out = c_stat()
        _fill_stat(out, st)
        _reply_attr(req, ctypes.byref(out), self.fs.attr_timeout)

    def _getattr(self, req: int, node: int, fi: Any) -> None:
        try:
            st = self.fs.getattr(req, node, fi.contents.fh if fi else None)
        except BaseException as err:
            self._fail(req, "getattr", err)
            return
        self._attr(req, st)

    def _setattr(self, req: int, node: int, attr: Any, to_set: int, fi: Any) -> None:
        try:
            a = attr.contents
            atime = mtime = None
            if to_set & SET_ATTR_ATIME_NOW:
                atime = NOW
            elif to_set & SET_ATTR_ATIME:
                atime = _time_ns(a.st_atimespec)
            if to_set & SET_ATTR_MTIME_NOW:
                mtime = NOW
            elif to_set & SET_ATTR_MTIME:
                mtime = _time_ns(a.st_mtimespec)
            change = SetAttr(
                mode=a.st_mode if to_set & SET_ATTR_MODE else None,
                uid=a.st_uid if to_set & SET_ATTR_UID else None,
                gid=a.st_gid if to_set & SET_ATTR_GID else None,
                size=a.st_size if to_set & SET_ATTR_SIZE else None,
                atime=atime,
                mtime=mtime,
            )
            st = self.fs.setattr(req, node, change, fi.contents.fh if fi else None)
        except BaseException as err:
            self._fail(req, "setattr", err)
            return
        self._attr(req, st)

    def _readlink(self, req: int, node: int) -> None:
        try:
            target = self.fs.readlink(req, node)
        except BaseException as err:
            self._fail(req, "readlink", err)
            return
        _reply_readlink(req, target)

    def _made(self, req: int, name: str, make: Callable[[], Entry]) -> None:
        try:
            entry = make()
        except BaseException as err:
            self._fail(req, name, err)
            return
        self._reply_entry(req, entry)

    def _mknod(self, req: int, parent: int, name: bytes, mode: int, rdev: int) -> None:
        self._made(req, "mknod", lambda: self.fs.mknod(req, parent, name, mode, rdev))

    def _mkdir(self, req: int, parent: int, name: bytes, mode: int) -> None:
        self._made(req, "mkdir", lambda: self.fs.mkdir(req, parent, name, mode))

    def _symlink(self, req: int, target: bytes, parent: int, name: bytes) -> None:
        self._made(req, "symlink", lambda: self.fs.symlink(req, target, parent, name))

    def _link(self, req: int, node: int, new_parent: int, new_name: bytes) -> None:
        self._made(req, "link", lambda: self.fs.link(req, node, new_parent, new_name))

    def _done(self, req: int, name: str, call: Callable[[], object]) -> None:
        try:
            call()
        except BaseException as err:
            self._fail(req, name, err)
            return
        _reply_err(req, 0)

    def _unlink(self, req: int, parent: int, name: bytes) -> None:
        self._done(req, "unlink", lambda: self.fs.unlink(req, parent, name))

    def _rmdir(self, req: int, parent: int, name: bytes) -> None:
        self._done(req, "rmdir", lambda: self.fs.rmdir(req, parent, name))

    def _rename(
        self, req: int, parent: int, name: bytes, new_parent: int, new_name: bytes, flags: int = 0
    ) -> None:
        self._done(
            req, "rename", lambda: self.fs.rename(req, parent, name, new_parent, new_name, flags)
        )

    @staticmethod
    def _set_open(fi: Any, opened: Opened) -> None:
        fi.fh = opened.fh
        if opened.direct_io:
            fi.direct_io = 1
        if opened.keep_cache:
            fi.keep_cache = 1
        if opened.noflush and _V3:
            fi.noflush = 1

    def _open(self, req: int, node: int, fi: Any) -> None:
        try:
            opened = self.fs.open(req, node, fi.contents.flags)
        except BaseException as err:
            self._fail(req, "open", err)
            return
        self._set_open(fi.contents, opened)
        if _reply_open(req, fi) != 0:  # the open was interrupted: nobody will release it
            self.fs.release(req, node, opened.fh)

    def _create(self, req: int, parent: int, name: bytes, mode: int, fi: Any) -> None:
        try:
            entry, opened = self.fs.create(req, parent, name, mode, fi.contents.flags)
        except BaseException as err:
            self._fail(req, "create", err)
            return
        self._set_open(fi.contents, opened)
        if _reply_create(req, ctypes.byref(self._entry(entry)), fi) != 0:
            self.fs.release(req, entry.node, opened.fh)
            self.fs.forget(entry.node, 1)

    def _read(self, req: int, node: int, size: int, offset: int, fi: Any) -> None:
        buffer, view = self._buffers.get(size)
        try:
            done = self.fs.read(req, node, view, offset, fi.contents.fh)
        except BaseException as err:
            self._fail(req, "read", err)
            return
        _reply_buf(req, buffer, done)

    def _write(self, req: int, node: int, buf: int, size: int, offset: int, fi: Any) -> None:
        try:
            info = fi.contents
            done = self.fs.write(req, node, _view(buf, size), offset, info.fh, bool(info.writepage))
        except BaseException as err:
            self._fail(req, "write", err)
            return
        _reply_write(req, done)

    def _flush(self, req: int, node: int, fi: Any) -> None:
        self._done(req, "flush", lambda: self.fs.flush(req, node, fi.contents.fh))

    def _release(self, req: int, node: int, fi: Any) -> None:
        self._done(req, "release", lambda: self.fs.release(req, node, fi.contents.fh))

    def _fsync(self, req: int, node: int, datasync: int, fi: Any) -> None:
        self._done(req, "fsync", lambda: self.fs.fsync(req, node, bool(datasync), fi.contents.fh))

    def _opendir(self, req: int, node: int, fi: Any) -> None:
        try:
            opened = self.fs.opendir(req, node)
        except BaseException as err:
            self._fail(req, "opendir", err)
            return
        self._set_open(fi.contents, opened)
        if _reply_open(req, fi) != 0:
            self.fs.releasedir(req, node, opened.fh)

    def _readdir(self, req: int, node: int, size: int, offset: int, fi: Any) -> None:
        try:
            address, length = self.fs.readdir(req, node, offset, fi.contents.fh).chunk(
                offset, size
            )
        except BaseException as err:
            self._fail(req, "readdir", err)
            return
        _reply_buf(req, address, length)

    def _readdirplus(self, req: int, node: int, size: int, offset: int, fi: Any) -> None:
        # As readdir, each entry with its attributes: the kernel caches them as if it had
        # looked each name up (one reference each), so `ls -l` or `git status` after it
        # sends no LOOKUP. An entry that does not fit gives its reference back.
        assert _add_direntry_plus is not None
        sent: list[int] = []
        try:
            listing = self.fs.readdir(req, node, offset, fi.contents.fh)
            entries = itertools.islice(listing.entries, offset, None)
            buffer, _ = self._buffers.get(size)
            address = ctypes.addressof(buffer)
            used = 0
            for entry in entries:
                param = fuse_entry_param()
                looked_up = 0
                if entry.name in (b".", b".."):
                    param.attr.st_ino = entry.ino
                    param.attr.st_mode = entry.mode
                else:
                    try:
                        found = self.fs.readdir_entry(node, entry.name)
                    except FileNotFoundError:
                        continue  # removed since the listing was taken
                    param = self._entry(found)
                    looked_up = found.node
                needed = _add_direntry_plus(
                    req,
                    address + used,
                    size - used,
                    entry.name,
                    ctypes.byref(param),
                    entry.next_offset,
                )
                if needed > size - used:
                    if looked_up:
                        self.fs.forget(looked_up, 1)
                    break
                used += needed
                if looked_up:
                    sent.append(looked_up)
        except BaseException as err:
            for node in sent:
                self.fs.forget(node, 1)
            self._fail(req, "readdirplus", err)
            return
        if _reply_buf(req, buffer, used) != 0:
            for node in sent:  # the kernel never took these references
                self.fs.forget(node, 1)

    def _releasedir(self, req: int, node: int, fi: Any) -> None:
        self._done(req, "releasedir", lambda: self.fs.releasedir(req, node, fi.contents.fh))

    def _fsyncdir(self, req: int, node: int, datasync: int, fi: Any) -> None:
        self._done(
            req, "fsyncdir", lambda: self.fs.fsyncdir(req, node, bool(datasync), fi.contents.fh)
        )

    def _statfs(self, req: int, node: int) -> None:
        try:
            st = self.fs.statfs(req, node)
            out = c_statvfs()
            for key in (
                "f_bsize",
                "f_frsize",
                "f_blocks",
                "f_bfree",
                "f_bavail",
                "f_files",
                "f_ffree",
                "f_favail",
                "f_flag",
                "f_namemax",
            ):
                setattr(out, key, getattr(st, key))
        except BaseException as err:
            self._fail(req, "statfs", err)
            return
        _reply_statfs(req, ctypes.byref(out))

    def _setxattr(
        self, req: int, node: int, name: bytes, value: int, size: int, flags: int
    ) -> None:
        data = ctypes.string_at(value, size) if size else b""
        self._done(req, "setxattr", lambda: self.fs.setxattr(req, node, name, data, flags))

    def _sized(self, req: int, name: str, call: Callable[[], bytes], size: int) -> None:
        # size 0 asks how big the answer is; a smaller size than the answer is ERANGE.
        try:
            value = call()
        except BaseException as err:
            self._fail(req, name, err)
            return
        if size == 0:
            _reply_xattr(req, len(value))
        elif len(value) > size:
            _reply_err(req, errno.ERANGE)
        else:
            _reply_buf(req, value, len(value))

    def _getxattr(self, req: int, node: int, name: bytes, size: int) -> None:
        self._sized(req, "getxattr", lambda: self.fs.getxattr(req, node, name), size)

    def _listxattr(self, req: int, node: int, size: int) -> None:
        self._sized(req, "listxattr", lambda: self.fs.listxattr(req, node), size)

    def _removexattr(self, req: int, node: int, name: bytes) -> None:
        self._done(req, "removexattr", lambda: self.fs.removexattr(req, node, name))

    def _access(self, req: int, node: int, mask: int) -> None:
        self._done(req, "access", lambda: self.fs.access(req, node, mask))

    def _fallocate(self, req: int, node: int, mode: int, offset: int, length: int, fi: Any) -> None:
        self._done(
            req,
            "fallocate",
            lambda: self.fs.fallocate(req, node, mode, offset, length, fi.contents.fh),
        )

    def _lseek(self, req: int, node: int, offset: int, whence: int, fi: Any) -> None:
        try:
            result = self.fs.lseek(req, node, offset, whence, fi.contents.fh)
        except BaseException as err:
            self._fail(req, "lseek", err)
            return
        assert _reply_lseek is not None
        _reply_lseek(req, result)


def _args(argv: Iterable[str]) -> tuple[fuse_args, Any]:
    encoded = [os.fsencode(arg) for arg in argv]
    array = (ctypes.c_char_p * (len(encoded) + 1))(*encoded, None)
    return fuse_args(len(encoded), array, 0), array


def option_args(options: dict[str, str | bool | int]) -> list[str]:
    """``-o`` arguments for libfuse from ``{name: value}`` (True: the bare flag)."""
    items = [name if value is True else f"{name}={value}" for name, value in options.items()]
    return ["-o", ",".join(items)] if items else []


class MountFailed(RuntimeError):
    """libfuse could not mount (it printed why on stderr)."""


class ConnectionAborted(RuntimeError):
    """libfuse's loop ended on an error reading /dev/fuse (not on the mount going away)."""


def serve(fs: Operations, mountpoint: str, options: dict[str, str | bool | int]) -> None:
    """Mounts ``fs`` on ``mountpoint`` and serves it with libfuse's multithreaded loop until
    it is unmounted; then frees the session. Raises `MountFailed` when libfuse cannot mount
    and `ConnectionAborted` when the loop ends on an error."""
    ops = fuse_lowlevel_ops()
    callbacks = _Callbacks(fs, ops)
    args, keep = _args(["burstctl", *option_args(options)])
    point = os.fsencode(mountpoint)
    if _V3:
        _serve_v3(callbacks, ops, args, point)
    else:
        _serve_v2(callbacks, ops, args, point)
    del keep


def _invalidator(handle: int) -> Callable[[int, bytes], int]:
    """fuse_lowlevel_notify_inval_entry on the session (libfuse 3) or channel (libfuse 2):
    0, or a negative errno (-ENOENT when the kernel had no such entry)."""

    def invalidate(parent: int, name: bytes) -> int:
        return int(_notify_inval_entry(handle, parent, name, len(name)))

    return invalidate


def _serve_v3(callbacks: _Callbacks, ops: Any, args: fuse_args, point: bytes) -> None:
    new = _bind(
        "fuse_session_new",
        ctypes.c_void_p,
        ctypes.POINTER(fuse_args),
        ctypes.POINTER(fuse_lowlevel_ops),
        ctypes.c_size_t,
        ctypes.c_void_p,
        lib=_lib,
    )
    mount = _bind("fuse_session_mount", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, lib=_lib)
    loop = _bind(
        "fuse_session_loop_mt_312", ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, lib=_lib
    )
    unmount = _bind("fuse_session_unmount", None, ctypes.c_void_p, lib=_lib)
    destroy = _bind("fuse_session_destroy", None, ctypes.c_void_p, lib=_lib)
    session = new(ctypes.byref(args), ctypes.byref(ops), ctypes.sizeof(ops), None)
    if not session:
        raise MountFailed("libfuse refused the options")
    callbacks.session = session
    callbacks.fs.invalidate_entry = _invalidator(session)
    try:
        if mount(session, point) != 0:
            raise MountFailed(f"cannot mount {os.fsdecode(point)}")
        try:
            result = loop(session, None)
        finally:
            callbacks.fs.invalidate_entry = None
            unmount(session)
        if result != 0:
            raise ConnectionAborted(f"libfuse's loop ended with {result}")
    finally:
        destroy(session)


def _serve_v2(callbacks: _Callbacks, ops: Any, args: fuse_args, point: bytes) -> None:
    mount = _bind(
        "fuse_mount", ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(fuse_args), lib=_lib
    )
    new = _bind(
        "fuse_lowlevel_new",
        ctypes.c_void_p,
        ctypes.POINTER(fuse_args),
        ctypes.POINTER(fuse_lowlevel_ops),
        ctypes.c_size_t,
        ctypes.c_void_p,
        lib=_lib,
    )
    add_chan = _bind("fuse_session_add_chan", None, ctypes.c_void_p, ctypes.c_void_p, lib=_lib)
    remove_chan = _bind("fuse_session_remove_chan", None, ctypes.c_void_p, lib=_lib)
    loop = _bind("fuse_session_loop_mt", ctypes.c_int, ctypes.c_void_p, lib=_lib)
    destroy = _bind("fuse_session_destroy", None, ctypes.c_void_p, lib=_lib)
    unmount = _bind("fuse_unmount", None, ctypes.c_char_p, ctypes.c_void_p, lib=_lib)
    chan = mount(point, ctypes.byref(args))
    if not chan:
        raise MountFailed(f"cannot mount {os.fsdecode(point)}")
    session = new(ctypes.byref(args), ctypes.byref(ops), ctypes.sizeof(ops), None)
    if not session:
        unmount(point, chan)
        raise MountFailed("libfuse refused the options")
    callbacks.session = session
    callbacks.fs.invalidate_entry = _invalidator(chan)
    add_chan(session, chan)
    try:
        result = loop(session)
    finally:
        callbacks.fs.invalidate_entry = None
        remove_chan(chan)
        destroy(session)
        unmount(point, chan)
    if result != 0:
        raise ConnectionAborted(f"libfuse's loop ended with {result}")


# fuse_kernel.h (protocol 7.36+): struct fuse_init_out and the INIT flags used below.
_INIT_OUT_FLAGS = 12  # byte offset of ``flags`` (uint32)
_INIT_OUT_FLAGS2 = 32  # byte offset of ``flags2`` (uint32): bits 32-63 of the flags
_FUSE_INIT_EXT = 1 << 30  # flags2 is valid
_FUSE_DIRECT_IO_ALLOW_MMAP = 1 << 36
# The kernel release that first honours FUSE_DIRECT_IO_ALLOW_MMAP (Linux 6.6).
_ALLOW_MMAP_KERNEL = (6, 6)


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _CustomIo(ctypes.Structure):
    """libfuse 3.14's struct fuse_custom_io (fuse_lowlevel.h)."""

    _fields_ = [
        ("writev", ctypes.c_void_p),
        ("read", ctypes.c_void_p),
        ("splice_receive", ctypes.c_void_p),
        ("splice_send", ctypes.c_void_p),
    ]


_WRITEV = ctypes.CFUNCTYPE(
    ctypes.c_ssize_t, ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_int, ctypes.c_void_p
)
# Without use_errno: ctypes would swap errno around the call, and libfuse reads the errno of
# a failed write itself.
_libc = ctypes.CDLL(None)
_libc_writev = _libc.writev
_libc_writev.restype = ctypes.c_ssize_t
_libc_writev.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_int]


def grant_direct_io_mmap(iov: Any, count: int) -> bool:
    """Adds FUSE_DIRECT_IO_ALLOW_MMAP to the INIT reply in ``iov`` (header, fuse_init_out).

    True when it did: a two-part reply whose body is protocol 7 with room for ``flags2`` and
    FUSE_INIT_EXT set (libfuse sets it when the kernel offered 64-bit flags). Any other
    message is left as it is.
    """
    if count != 2 or iov[1].iov_len < _INIT_OUT_FLAGS2 + 4 or not iov[1].iov_base:
        return False
    body = iov[1].iov_base
    if ctypes.c_uint32.from_address(body).value != 7:
        return False
    if not ctypes.c_uint32.from_address(body + _INIT_OUT_FLAGS).value & _FUSE_INIT_EXT:
        return False
    flags2 = ctypes.c_uint32.from_address(body + _INIT_OUT_FLAGS2)
    flags2.value |= _FUSE_DIRECT_IO_ALLOW_MMAP >> 32
    return True


def kernel_release(release: str | None = None) -> tuple[int, int]:
    """(major, minor) of the running kernel, e.g. (6, 18); (0, 0) when unreadable."""
    found = re.match(r"(\d+)\.(\d+)", release if release is not None else os.uname().release)
    return (int(found[1]), int(found[2])) if found else (0, 0)


class DirectIoMmap:
    """Asks the kernel to allow shared ``mmap`` of ``direct_io`` files on libfuse 3.14.

    Without FUSE_DIRECT_IO_ALLOW_MMAP the kernel refuses every ``MAP_SHARED`` mapping of a
    file opened with ``direct_io`` (ENODEV); with it (Linux >= 6.6) such a mapping goes
    through the page cache, which the kernel keeps coherent with the file's direct reads and
    writes. libfuse 3.14 (Debian 12) cannot ask for it (later releases can), so there the
    mount adds the bit to libfuse's INIT reply on its way to the kernel: from ``init``, which
    libfuse calls before it sends that reply, the session gets a custom writer
    (``fuse_session_custom_io``) that patches the reply, writes it, and puts libc's
    ``writev``/``read`` in its place, so no later message passes through Python. libc's
    functions ignore the extra ``userdata`` argument libfuse passes (a trailing register
    argument). libfuse frees the last writer with the session; the first one (32 bytes) is
    left behind.

    ``on_reply(granted)`` runs once the reply is patched (True) or found without room for
    the flag (False), before it is written: before the kernel can send any open.
    """

    # Only the release whose do_init and fuse_custom_io were read for this (3.14.0).
    LIBFUSE = (3, 14)

    def __init__(self, on_reply: Callable[[bool], None]) -> None:
        self._on_reply = on_reply
        self._lock = threading.Lock()
        self._written = False
        self._session: int | None = None
        self._fd = -1
        self._plain = _CustomIo(
            ctypes.cast(_libc.writev, ctypes.c_void_p).value,
            ctypes.cast(_libc.read, ctypes.c_void_p).value,
            None,
            None,
        )
        self._hook = _WRITEV(self._write_first_message)  # referenced: libfuse calls it
        self._hooked = _CustomIo(
            ctypes.cast(self._hook, ctypes.c_void_p).value, self._plain.read, None, None
        )
        self._custom_io: Callable[..., int] = lambda *args: 0  # bound by install

    @classmethod
    def unavailable(cls, libfuse: tuple[int, int], kernel: tuple[int, int]) -> str | None:
        """None when the hook applies; else why not, for the log."""
        if libfuse != cls.LIBFUSE:
            return f"libfuse {libfuse[0]}.{libfuse[1]} (the mount knows how only on 3.14)"
        if kernel < _ALLOW_MMAP_KERNEL:
            return f"kernel {kernel[0]}.{kernel[1]} (needs 6.6)"
        return None

    def install(self, session: int) -> None:
        """Hooks the low-level ``session`` (from ``init``, before the INIT reply)."""
        lib = ctypes.CDLL(mfusepy._libfuse_path)  # libfuse 3 (AttributeError on 2)
        lib.fuse_session_fd.argtypes = [ctypes.c_void_p]
        lib.fuse_session_custom_io.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(_CustomIo),
            ctypes.c_int,
        ]
        self._custom_io = lib.fuse_session_custom_io
        self._session = session
        self._fd = lib.fuse_session_fd(self._session)
        if self._custom_io(self._session, ctypes.byref(self._hooked), self._fd) != 0:
            raise OSError(errno.EINVAL, "fuse_session_custom_io refused the writer")

    def _write_first_message(self, fd: int, iov: Any, count: int, userdata: Any) -> int:
        # The first message libfuse writes is its INIT reply (nothing is sent before it).
        # A Python exception here would make ctypes return 0 ("wrote nothing"): none escapes.
        with self._lock:
            first, self._written = not self._written, True
        if first:
            try:
                granted = False
                try:
                    granted = grant_direct_io_mmap(iov, count)
                finally:
                    self._on_reply(granted)
            except Exception:
                logger.exception("asking for shared mmap of direct_io files failed")
        try:
            return int(_libc_writev(fd, iov, count))
        finally:
            if first:  # every later message goes straight to libc
                self._custom_io(self._session, ctypes.byref(self._plain), self._fd)


def file_type(mode: int) -> int:
    """The S_IFMT bits of ``mode`` (what a directory entry carries)."""
    return stat.S_IFMT(mode)


__all__ = [
    "LIBFUSE_VERSION",
    "NOW",
    "ROOT_ID",
    "ConnectionAborted",
    "Context",
    "DirEntry",
    "DirectIoMmap",
    "Entry",
    "MountFailed",
    "Opened",
    "Operations",
    "SetAttr",
    "grant_direct_io_mmap",
    "kernel_release",
    "option_args",
    "request_context",
    "serve",
]
