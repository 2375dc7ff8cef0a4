"""The one import seam for the FUSE binding (mfusepy, ctypes over libfuse 2 or 3).

Everything else in `burstctl.fuse_shim` imports FUSE names from here, so the binding can be
swapped (e.g. for fusepy) in one place. Importing this module loads libfuse and raises
`OSError` when it is missing; callers import it lazily.

Three things differ from mfusepy as shipped:

- `FUSE` hands an operations object that has ``read_into`` / ``write_from`` libfuse's own
  request buffer as a `memoryview`, so data is read straight into it with ``preadv`` and
  written straight from it with ``pwrite``. mfusepy's ``read`` copies what the operation
  returns into that buffer (``memmove``) and its ``write`` copies the buffer into a new
  `bytes` (``string_at``) first: one copy of every byte less in each direction.
- `fuse_get_context` reads the request's caller through a `ctypes.PyDLL` binding of the same
  libfuse function: the lookup is a thread-local read, and the `ctypes.CDLL` call mfusepy makes
  drops and retakes the GIL around it, which costs a GIL hand-over per request when other
  threads are busy.
- On libfuse 3, `truncate` gets the file handle libfuse passes (see `FUSE.truncate_fuse_3`).
- Per open, the operations object may ask for ``direct_io`` (``direct_io_for(flags)``), and
  on libfuse 3.14 the mount asks the kernel to allow shared ``mmap`` of such files
  (`DirectIoMmap`), which that libfuse cannot ask for itself.
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

FuseOSError = mfusepy.FuseOSError
Operations = mfusepy.Operations

# (major, minor) of the libfuse that was loaded, e.g. (2, 9).
LIBFUSE_VERSION: tuple[int, int] = (mfusepy.fuse_version_major, mfusepy.fuse_version_minor)

# The library mfusepy loaded, bound again without releasing the GIL on calls.
_get_context = ctypes.PyDLL(mfusepy._libfuse_path).fuse_get_context
_get_context.restype = ctypes.POINTER(mfusepy.fuse_context)
_get_context.argtypes = []


def fuse_get_context() -> tuple[int, int, int]:
    """(uid, gid, pid) of the caller of the request this thread is serving."""
    ctx = _get_context().contents
    return ctx.uid, ctx.gid, ctx.pid


def _request_buffer(buf: Any, size: int) -> memoryview:
    """libfuse's ``size``-byte buffer at the ``char *`` ``buf``, without a copy.

    Valid only while the callback that received ``buf`` runs.
    """
    if size == 0:
        return memoryview(bytearray())  # writable, as a read's buffer must be
    address = ctypes.cast(buf, ctypes.c_void_p).value
    if address is None:  # libfuse never passes NULL with a size; be loud if it ever does
        raise FuseOSError(errno.EIO)
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B")


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


def _kernel_release(release: str | None = None) -> tuple[int, int]:
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

    def install(self, fuse_handle: int) -> None:
        """Hooks the session of ``fuse_handle`` (``fuse_get_context()->fuse`` in init)."""
        lib = ctypes.CDLL(mfusepy._libfuse_path)  # libfuse 3 (AttributeError on 2)
        lib.fuse_get_session.restype = ctypes.c_void_p
        lib.fuse_get_session.argtypes = [ctypes.c_void_p]
        lib.fuse_session_fd.argtypes = [ctypes.c_void_p]
        lib.fuse_session_custom_io.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(_CustomIo),
            ctypes.c_int,
        ]
        self._custom_io = lib.fuse_session_custom_io
        self._session = lib.fuse_get_session(fuse_handle)
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


class FUSE(mfusepy.FUSE):  # type: ignore[misc]
    """mfusepy's `FUSE`, with reads and writes into and out of libfuse's buffer in place.

    Used when the operations object defines ``read_into(path, buf, offset, fh) -> int`` (fill
    ``buf``, return the byte count) and ``write_from(path, data, offset, fh) -> int``; without
    them, mfusepy's ``read`` / ``write`` are used as they are.

    An operations object with ``direct_io_for(flags) -> bool`` chooses per open whether the
    kernel bypasses its page cache for that file (``direct_io``; the ``-o direct_io`` option
    still sets it for every file). On libfuse 3 the mount first asks the kernel to allow shared
    ``mmap`` of such files where it can (`DirectIoMmap`) and sets the operations object's
    ``direct_io_mmap`` to whether it did, before ``init_with_config`` runs.
    """

    def init_fuse_3(self, conn: Any, config: Any) -> None:
        if hasattr(self.operations, "direct_io_for"):
            self._ask_direct_io_mmap()
        super().init_fuse_3(conn, config)

    def _ask_direct_io_mmap(self) -> None:
        why_not = DirectIoMmap.unavailable(LIBFUSE_VERSION, _kernel_release())
        if why_not is not None:
            logger.info("shared mmap of direct_io files cannot be asked for: %s", why_not)
            return

        def on_reply(granted: bool) -> None:
            self.operations.direct_io_mmap = granted
            if granted:
                logger.info("asked the kernel to allow shared mmap of direct_io files")
            else:
                logger.warning("the INIT reply had no room to allow mmap of direct_io files")

        # Kept for the life of the mount: libfuse calls into the hook's ctypes thunk, which
        # would be freed with the object (a segfault at the INIT reply).
        self._direct_io_mmap = DirectIoMmap(on_reply)
        try:
            self._direct_io_mmap.install(_get_context().contents.fuse)
        except (OSError, AttributeError) as err:
            logger.warning("could not ask the kernel to allow mmap of direct_io files: %s", err)

    def open(self, path: bytes, fip: Any) -> int:
        result = int(super().open(path, fip))
        self._choose_direct_io(fip)
        return result

    def create(self, path: bytes, mode: int, fip: Any) -> int:
        result = int(super().create(path, mode, fip))
        self._choose_direct_io(fip)
        return result

    def _choose_direct_io(self, fip: Any) -> None:
        choose = getattr(self.operations, "direct_io_for", None)
        if choose is not None and choose(fip.contents.flags):
            fip.contents.direct_io = 1

    def read(self, path: bytes | None, buf: Any, size: int, offset: int, fip: Any) -> int:
        done = self._in_place("read_into", path, buf, size, offset, fip)
        return int(super().read(path, buf, size, offset, fip)) if done is None else done

    def write(self, path: bytes | None, buf: Any, size: int, offset: int, fip: Any) -> int:
        done = self._in_place("write_from", path, buf, size, offset, fip)
        return int(super().write(path, buf, size, offset, fip)) if done is None else done

    def _in_place(
        self, operation: str, path: bytes | None, buf: Any, size: int, offset: int, fip: Any
    ) -> int | None:
        """Calls ``operation`` with libfuse's buffer; None when the operations lack it."""
        call = getattr(self.operations, operation, None)
        if call is None or self.raw_fi:
            return None
        name = None if path is None else path.decode(self.encoding, self.errors)
        with _request_buffer(buf, size) as view:
            return int(call(name, view, offset, fip.contents.fh))

    # libfuse 3 passes the file handle (or NULL) to truncate, where libfuse 2 called a separate
    # ftruncate; mfusepy drops it, so truncating a file that was unlinked while open (no
    # path) failed with ENOENT. Handed on as libfuse 2's ftruncate is.
    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        return int(self.ftruncate(path, length, fip))


__all__ = [
    "FUSE",
    "LIBFUSE_VERSION",
    "DirectIoMmap",
    "FuseOSError",
    "Operations",
    "fuse_get_context",
    "grant_direct_io_mmap",
]
