"""The system calls the passthrough needs and `os` lacks, over libc (ctypes).

- ``renameat2`` with flags (RENAME_NOREPLACE, RENAME_EXCHANGE);
- ``fchownat`` and ``utimensat`` with ``AT_EMPTY_PATH``: on an ``O_PATH`` handle of any node,
  symbolic links included, without a name;
- ``futimens`` / ``utimensat`` with ``UTIME_NOW`` and ``UTIME_OMIT`` per time;
- ``fallocate`` with every mode (punch hole, zero range, keep size, ...).

Each raises `OSError` with the call's errno. `proc_path` is the path that reaches the node of
an ``O_PATH`` handle, for the calls that take only a path.
"""

from __future__ import annotations

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)

AT_EMPTY_PATH = 0x1000
AT_SYMLINK_NOFOLLOW = 0x100
RENAME_NOREPLACE = 1 << 0
RENAME_EXCHANGE = 1 << 1
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2
_AT_FDCWD = -100


def proc_path(fd: int) -> str:
    """The magic link that reaches the node of the handle ``fd``, for calls that take a path."""
    return f"/proc/self/fd/{fd}"


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_renameat2 = _libc.renameat2
_renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
_fchownat = _libc.fchownat
_fchownat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int]
_utimensat = _libc.utimensat
_utimensat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_Timespec), ctypes.c_int]
_futimens = _libc.futimens
_futimens.argtypes = [ctypes.c_int, ctypes.POINTER(_Timespec)]
_fallocate = _libc.fallocate
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def _check(result: int, *names: bytes | None) -> None:
    if result != 0:
        code = ctypes.get_errno()
        name = next((os.fsdecode(n) for n in names if n), None)
        raise OSError(code, os.strerror(code), name)


def renameat2(old_dir: int, old: bytes, new_dir: int, new: bytes, flags: int) -> None:
    """renameat2(2): ``old`` in directory ``old_dir`` becomes ``new`` in ``new_dir``."""
    _check(_renameat2(old_dir, old, new_dir, new, flags), old)


def chown_node(fd: int, uid: int, gid: int) -> None:
    """Changes owner and/or group (-1: unchanged) of the node ``fd`` (any handle, O_PATH too)."""
    _check(
        _fchownat(fd, b"", uid & 0xFFFFFFFF, gid & 0xFFFFFFFF, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)
    )


def _times(atime: int | None, mtime: int | None, now: int) -> ctypes.Array[_Timespec]:
    def spec(value: int | None) -> _Timespec:
        if value is None:
            return _Timespec(0, UTIME_OMIT)
        if value == now:
            return _Timespec(0, UTIME_NOW)
        return _Timespec(*divmod(value, 1_000_000_000))

    return (_Timespec * 2)(spec(atime), spec(mtime))


def set_times(fd: int, atime: int | None, mtime: int | None, *, now: int, handle: bool) -> None:
    """Sets access and modification times (ns; None: unchanged; ``now``: the current time)
    of ``fd``: an open file (``handle``, futimens) or any node's O_PATH handle."""
    times = _times(atime, mtime, now)
    if handle:
        _check(_futimens(fd, times))
    else:
        _check(_utimensat(fd, b"", times, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW))


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """fallocate(2) with any ``mode`` the backing file system supports."""
    _check(_fallocate(fd, mode, offset, length))
