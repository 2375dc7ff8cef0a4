"""libfuse's low-level API as ctypes declarations: its structures, the table of operations and
the functions the binding calls, for the libfuse that was loaded.

Importing this module loads libfuse (2 or 3, through mfusepy's loader, which honours
``FUSE_LIBRARY_PATH``) and raises `OSError` when it is missing. mfusepy gives the C structures
(``struct stat``, ``statvfs``, ``fuse_file_info``, ``fuse_conn_info``) for the loaded library;
the low-level session, reply and notify functions are bound here. `fuse_lowlevel_ops` differs
between libfuse 2 and 3 (``rename`` takes flags on 3; ``readdirplus`` and ``lseek`` exist only
on 3): `V3` says which was loaded.
"""

from __future__ import annotations

import ctypes
from typing import Any

import mfusepy

# (major, minor) of the libfuse that was loaded, e.g. (2, 9).
LIBFUSE_VERSION: tuple[int, int] = (mfusepy.fuse_version_major, mfusepy.fuse_version_minor)
V3 = LIBFUSE_VERSION[0] >= 3

lib = ctypes.CDLL(mfusepy._libfuse_path)
# Reply and context functions, bound again without releasing the GIL: each is a few
# instructions plus a writev to /dev/fuse, cheaper than the GIL hand-over a CDLL call makes.
plib = ctypes.PyDLL(mfusepy._libfuse_path)

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
        if V3
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
if V3:
    _fields += [
        ("readdirplus", _CB(_V, _req_t, _ino_t, ctypes.c_size_t, _off_t, _fi_p)),
        ("copy_file_range", ctypes.c_void_p),
        ("lseek", _CB(_V, _req_t, _ino_t, _off_t, ctypes.c_int, _fi_p)),
    ]


class fuse_lowlevel_ops(ctypes.Structure):
    _fields_ = _fields


def bind(name: str, restype: Any, *argtypes: Any, lib: Any = plib) -> Any:
    function = getattr(lib, name)
    function.restype = restype
    function.argtypes = list(argtypes)
    return function


reply_err = bind("fuse_reply_err", ctypes.c_int, _req_t, ctypes.c_int)
reply_none = bind("fuse_reply_none", None, _req_t)
reply_entry = bind("fuse_reply_entry", ctypes.c_int, _req_t, ctypes.POINTER(fuse_entry_param))
reply_create = bind(
    "fuse_reply_create", ctypes.c_int, _req_t, ctypes.POINTER(fuse_entry_param), _fi_p
)
reply_attr = bind("fuse_reply_attr", ctypes.c_int, _req_t, _stat_p, ctypes.c_double)
reply_readlink = bind("fuse_reply_readlink", ctypes.c_int, _req_t, ctypes.c_char_p)
reply_open = bind("fuse_reply_open", ctypes.c_int, _req_t, _fi_p)
reply_write = bind("fuse_reply_write", ctypes.c_int, _req_t, ctypes.c_size_t)
reply_buf = bind("fuse_reply_buf", ctypes.c_int, _req_t, ctypes.c_void_p, ctypes.c_size_t)
reply_statfs = bind("fuse_reply_statfs", ctypes.c_int, _req_t, ctypes.POINTER(c_statvfs))
reply_xattr = bind("fuse_reply_xattr", ctypes.c_int, _req_t, ctypes.c_size_t)
add_direntry_plus = (
    bind(
        "fuse_add_direntry_plus",
        ctypes.c_size_t,
        _req_t,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_char_p,
        ctypes.POINTER(fuse_entry_param),
        _off_t,
    )
    if V3
    else None
)
notify_inval_entry = bind(
    "fuse_lowlevel_notify_inval_entry",
    ctypes.c_int,
    ctypes.c_void_p,
    _ino_t,
    ctypes.c_char_p,
    ctypes.c_size_t,
    lib=lib,  # it writes to /dev/fuse and may wait: the GIL is released
)
# Drops the kernel's cached attributes of an inode, and the cached pages of a range when the
# offset is >= 0 (length 0: to the end). The first argument is the session (libfuse 3) or
# channel (libfuse 2), as for notify_inval_entry.
notify_inval_inode = bind(
    "fuse_lowlevel_notify_inval_inode",
    ctypes.c_int,
    ctypes.c_void_p,
    _ino_t,
    _off_t,
    _off_t,
    lib=lib,  # a write to /dev/fuse, which may wait on page locks: the GIL is released
)
req_ctx = bind("fuse_req_ctx", ctypes.POINTER(fuse_ctx), _req_t)

# Interrupts: libfuse calls a request's interrupt function (``fuse_req_interrupt_func``) when
# the kernel sends FUSE_INTERRUPT for it (its caller got a signal), on the worker thread that
# read the interrupt with the request's lock held, or at once on the registering thread when
# the interrupt came first. Registered with the GIL released: the function, on that other
# thread, needs the GIL while libfuse holds the request's lock. Answering the request clears
# it (libfuse may still call it just after, with the data it read before).
interrupt_func_t = ctypes.CFUNCTYPE(None, _req_t, ctypes.c_void_p)
req_interrupt_func = bind(
    "fuse_req_interrupt_func", None, _req_t, interrupt_func_t, ctypes.c_void_p, lib=lib
)
reply_lseek = bind("fuse_reply_lseek", ctypes.c_int, _req_t, _off_t) if V3 else None

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
