"""`DirectIoMmap`: libfuse 3.14's INIT reply patched to allow shared ``mmap`` of ``direct_io``
files (see its docstring), and the checks of where that applies.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import threading
from collections.abc import Callable
from typing import Any

import mfusepy

logger = logging.getLogger(__name__)

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
        self._fuse_session: int | None = None
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

    def install(self, fuse_session: int) -> None:
        """Hooks libfuse's low-level ``fuse_session`` (from ``init``, before the INIT reply)."""
        lib = ctypes.CDLL(mfusepy._libfuse_path)  # libfuse 3 (AttributeError on 2)
        lib.fuse_session_fd.argtypes = [ctypes.c_void_p]
        lib.fuse_session_custom_io.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(_CustomIo),
            ctypes.c_int,
        ]
        self._custom_io = lib.fuse_session_custom_io
        self._fuse_session = fuse_session
        self._fd = lib.fuse_session_fd(self._fuse_session)
        if self._custom_io(self._fuse_session, ctypes.byref(self._hooked), self._fd) != 0:
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
                self._custom_io(self._fuse_session, ctypes.byref(self._plain), self._fd)
