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
"""

from __future__ import annotations

import ctypes
import errno
from typing import Any

import mfusepy

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


class FUSE(mfusepy.FUSE):  # type: ignore[misc]
    """mfusepy's `FUSE`, with reads and writes into and out of libfuse's buffer in place.

    Used when the operations object defines ``read_into(path, buf, offset, fh) -> int`` (fill
    ``buf``, return the byte count) and ``write_from(path, data, offset, fh) -> int``; without
    them, mfusepy's ``read`` / ``write`` are used as they are.
    """

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


__all__ = ["FUSE", "LIBFUSE_VERSION", "FuseOSError", "Operations", "fuse_get_context"]
